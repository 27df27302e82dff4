package daemon_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkFootprint: an idle gpud's memory and CPU, as a separate process
// (the built bin/gpud, or GPUD_BIN) on 2 fake GPUs with one holder, with
// GPUD_FOOT_PROCS (2000) extra idle processes on the node, measured over
// GPUD_FOOT_WINDOW (60 s: one periodic /proc resync at the default
// --resync-interval) after 10 s to settle. The baseline, interleaved in
// the same run, is the same gpud without the extra processes: its ratio
// is what the processes cost. 3 rounds; median, min and max reported.
// Goals (issue 14): RSS ≤ 50 MiB, CPU ≤ 0.2 %.
func BenchmarkFootprint(b *testing.B) {
	bin := footprintBinary(b)
	n := envInt("GPUD_FOOT_PROCS", 2000)
	window := time.Duration(envInt("GPUD_FOOT_WINDOW", 60)) * time.Second
	devDir, gpus := makeGPUsForBench(b)
	var rss, cpu, anon, ring, file, rss0, cpu0, procs []float64
	for r := 0; r < 3; r++ {
		f0 := measureFootprint(b, bin, devDir, gpus[0], 0, window)
		f := measureFootprint(b, bin, devDir, gpus[0], n, window)
		rss0, cpu0 = append(rss0, f0.rss), append(cpu0, f0.cpu)
		rss, cpu, procs = append(rss, f.rss), append(cpu, f.cpu), append(procs, f.procs)
		anon, ring, file = append(anon, f.anon), append(ring, f.ring), append(file, f.file)
	}
	b.ReportMetric(median(procs), "processes")
	b.ReportMetric(median(rss), "MiB-rss")
	b.ReportMetric(slicesMin(rss), "MiB-rss-min")
	b.ReportMetric(slicesMax(rss), "MiB-rss-max")
	b.ReportMetric(median(anon), "MiB-anon")
	b.ReportMetric(median(ring), "MiB-ring")
	b.ReportMetric(median(file), "MiB-file")
	b.ReportMetric(median(cpu), "%cpu")
	b.ReportMetric(slicesMin(cpu), "%cpu-min")
	b.ReportMetric(slicesMax(cpu), "%cpu-max")
	b.ReportMetric(median(rss0), "MiB-rss-without-procs")
	b.ReportMetric(median(cpu0), "%cpu-without-procs")
	b.ReportMetric(median(rss)/median(rss0), "ratio-rss-to-without-procs")
	b.ReportMetric(median(rss)/50, "ratio-rss-to-50MiB-goal")
	b.ReportMetric(median(cpu)/0.2, "ratio-cpu-to-0.2%-goal")
}

type footprint struct{ rss, anon, ring, file, cpu, procs float64 }

// measureFootprint runs bin with one holder of gpu and n idle processes,
// and measures it.
func measureFootprint(b *testing.B, bin, devDir, gpu string, n int, window time.Duration) footprint {
	b.Helper()
	var kids []*exec.Cmd
	defer func() {
		for _, c := range kids {
			c.Process.Kill()
			c.Wait()
		}
	}()
	spawn := func(extra *os.File) {
		c := exec.Command("sleep", "3600")
		if extra != nil {
			c.ExtraFiles = []*os.File{extra}
		}
		if err := c.Start(); err != nil {
			b.Fatalf("spawning idle processes: %v", err)
		}
		kids = append(kids, c)
	}
	g, err := os.Open(gpu)
	if err != nil {
		b.Fatal(err)
	}
	spawn(g) // the holder
	g.Close()
	for i := 0; i < n; i++ {
		spawn(nil)
	}
	g2 := startGpudProcess(b, bin, devDir, "footprint")
	defer g2.stop()
	pid, log := g2.pid, g2.log
	alive := func() {
		if err := unix.Kill(pid, 0); err != nil {
			b.Fatalf("gpud exited: %s", log.String())
		}
	}
	time.Sleep(10 * time.Second)
	alive()
	t0, s0 := procTicks(b, pid), time.Now()
	time.Sleep(window)
	alive()
	t1, s1 := procTicks(b, pid), time.Now()
	f := footprint{cpu: 100 * float64(t1-t0) / 100 / s1.Sub(s0).Seconds()} // USER_HZ is 100
	st := procStatus(b, pid)
	f.rss, f.anon = st["VmRSS"]/1024, st["RssAnon"]/1024
	f.ring = ringRSS(b, pid) / 1024
	f.file = st["RssFile"]/1024 - f.ring
	ents, _ := filepath.Glob("/proc/[0-9]*")
	f.procs = float64(len(ents))
	if !strings.Contains(log.String(), `"holders":1`) {
		b.Fatalf("gpud did not find the one holder at start: %s", log.String())
	}
	return f
}

// gpudProcess is a gpud run as a separate process, on its own private state
// directory, the way a node runs it (no Docker, no NVML, no pinning).
type gpudProcess struct {
	cmd   *exec.Cmd
	pid   int
	state string // its state file
	log   *bytes.Buffer
}

func startGpudProcess(b *testing.B, bin, devDir, node string, extra ...string) *gpudProcess {
	b.Helper()
	state := filepath.Join(b.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		b.Fatal(err)
	}
	g := &gpudProcess{state: filepath.Join(state, "state.json"), log: new(bytes.Buffer)}
	args := append([]string{"run", "--dev-dir", devDir, "--state-file", g.state,
		"--state-dir", state, "--control-socket", filepath.Join(state, "ctl.sock"), "--checkpoint-root", filepath.Join(state, "ck"),
		"--bpf-pin-dir", "", "--metrics-addr", "127.0.0.1:0", "--nvml", "off", "--docker-host", "none", "--node-name", node}, extra...)
	g.cmd = exec.Command(bin, args...)
	g.cmd.Stderr = g.log
	if err := g.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	g.pid = g.cmd.Process.Pid
	return g
}

// stop ends it with SIGTERM, as a node's service manager does.
func (g *gpudProcess) stop() {
	g.cmd.Process.Signal(unix.SIGTERM)
	g.cmd.Wait()
}

// footprintBinary is GPUD_BIN, or bin/gpud as `make bench` builds it.
func footprintBinary(b *testing.B) string {
	if p := os.Getenv("GPUD_BIN"); p != "" {
		return p
	}
	p, _ := filepath.Abs("../../bin/gpud")
	if _, err := os.Stat(p); err != nil {
		b.Fatalf("no gpud binary (make build, or GPUD_BIN): %v", err)
	}
	return p
}

// procTicks is pid's utime+stime in clock ticks.
func procTicks(b *testing.B, pid int) uint64 {
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(s[bytes.LastIndexByte(s, ')')+1:]))
	u, _ := strconv.ParseUint(f[11], 10, 64) // field 14
	k, _ := strconv.ParseUint(f[12], 10, 64) // field 15
	return u + k
}

// procStatus reads the kB fields of /proc/pid/status.
func procStatus(b *testing.B, pid int) map[string]float64 {
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(s), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if f := strings.Fields(v); ok && len(f) == 2 && f[1] == "kB" {
			out[k], _ = strconv.ParseFloat(f[0], 64)
		}
	}
	return out
}

// ringRSS is the resident kB of pid's BPF map mappings (the ring buffer,
// which the reader maps twice, so its pages count twice; in RssFile).
func ringRSS(b *testing.B, pid int) float64 {
	fh, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer fh.Close()
	var kb float64
	in := false
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			in = len(f) >= 6 && f[5] == "anon_inode:bpf-map"
		case in && len(f) == 3 && f[0] == "Rss:":
			v, _ := strconv.ParseFloat(f[1], 64)
			kb += v
		}
	}
	return kb
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func slicesMin(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func slicesMax(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
