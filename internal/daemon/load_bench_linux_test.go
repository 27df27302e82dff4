package daemon_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// hogs is how many spinning loops GPUD_BENCH_LOAD=hog started for this
// test binary (0: none); the latency benchmarks report it as "hogs".
var hogs int

// startLoad starts, with GPUD_BENCH_LOAD=hog, one spinning loop per CPU at
// normal priority for the whole test binary (what a training job's data
// loaders do to a GPU node), so that the benchmarks (and tests) can run
// loaded on their own; it returns what stops them. Any other value but ""
// is refused: a typo must not pass for an unloaded run.
func startLoad() (stop func(), err error) {
	switch os.Getenv("GPUD_BENCH_LOAD") {
	case "":
		return func() {}, nil
	case "hog":
	default:
		return nil, fmt.Errorf("GPUD_BENCH_LOAD=%q: want hog or nothing", os.Getenv("GPUD_BENCH_LOAD"))
	}
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
		hogs = 0
	}
	for i := 0; i < runtime.NumCPU(); i++ {
		c := exec.Command("sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("starting a CPU hog: %w", err)
		}
		cmds = append(cmds, c)
	}
	hogs = len(cmds)
	return stop, nil
}

// reportLoad reports how many CPU hogs ran beside the benchmark.
func reportLoad(b *testing.B) { b.ReportMetric(float64(hogs), "hogs") }

// bareProg is testdata/bare/bare.c, compiled and running: the floor of the
// preemption benchmarks (a bare C program that SIGKILLs the same victims,
// or freezes the same cgroup, and waits for the result).
type bareProg struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	mu  sync.Mutex
}

func startBare(b testing.TB) *bareProg {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "bare")
	cc := exec.Command("cc", "-O2", "-Wall", "-Werror", "-o", bin, "testdata/bare/bare.c")
	if msg, err := cc.CombinedOutput(); err != nil {
		b.Fatalf("compiling the bare floor program: %v\n%s", err, msg)
	}
	p := &bareProg{cmd: exec.Command(bin)}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.cmd.Stderr = os.Stderr
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		b.Fatal(err)
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	p.out = bufio.NewScanner(out)
	if err := p.cmd.Start(); err != nil {
		b.Fatalf("starting the bare floor program: %v", err)
	}
	b.Cleanup(func() { p.in.Close(); p.cmd.Wait() })
	// At SCHED_FIFO 1, as gpud's event thread and actions run: at normal
	// priority the floor's own wake-ups behind the loaded series' hogs
	// were counted against it, which flattered gpud (kill, 200 victims,
	// freeze alike).
	p.do(b, "rt")
	return p
}

// do runs one command and returns what it took, in µs.
func (p *bareProg) do(b testing.TB, format string, args ...any) float64 {
	b.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	line := fmt.Sprintf(format, args...)
	if _, err := fmt.Fprintln(p.in, line); err != nil {
		b.Fatalf("bare %s: %v", line, err)
	}
	return p.answer(b, line)
}

// next reads the second answer of a command that gives two (onopen: the
// watch set, then its command's): what it took in µs, and when it started
// (CLOCK_MONOTONIC ns).
func (p *bareProg) next(b testing.TB, line string) (us float64, start uint64) {
	b.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	us = p.answer(b, line)
	f := strings.Fields(p.out.Text())
	if len(f) != 2 {
		b.Fatalf("bare %s: %q, want NS START", line, p.out.Text())
	}
	start, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		b.Fatalf("bare %s: %q: %v", line, p.out.Text(), err)
	}
	return us, start
}

// answer reads one answer: its first field, ns, in µs.
func (p *bareProg) answer(b testing.TB, line string) float64 {
	b.Helper()
	if !p.out.Scan() {
		b.Fatalf("bare %s: no answer: %v", line, p.out.Err())
	}
	f := strings.Fields(p.out.Text())
	var ns int64
	var err error = strconv.ErrSyntax
	if len(f) > 0 {
		ns, err = strconv.ParseInt(f[0], 10, 64)
	}
	if err != nil {
		b.Fatalf("bare %s: %s", line, p.out.Text())
	}
	return float64(ns) / 1e3
}

// kill SIGKILLs pids and waits for them to be dead: µs.
func (p *bareProg) kill(b *testing.B, pids ...int) float64 {
	b.Helper()
	s := make([]string, len(pids))
	for i, pid := range pids {
		s[i] = strconv.Itoa(pid)
	}
	return p.do(b, "kill %s", strings.Join(s, " "))
}
