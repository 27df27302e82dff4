package daemon_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/testutil"
)

// taxLoops are the syscall patterns of the syscall-tax benchmark, and how
// many rounds of each one run takes: none of them touches a GPU, so any
// cost gpud adds to them is a tax on every process of the node.
var taxLoops = []struct {
	kind string
	n    int
}{
	{"getppid", 1_000_000},
	{"read", 1_000_000},
	{"pipe", 500_000},
	{"openclose", 200_000},
}

// taxModes are the ways gpud can run, each measured against the same
// baseline: no gpud at all. --hooks driver, the default, puts nothing on
// the syscall path (on kernels without
// kprobes it attaches no kprobe at all, and costs what it costs with them
// only on GPU releases and received fds, which these loops never do).
var taxModes = []struct {
	name string
	args []string
}{
	{"syscalls", []string{"--hooks=syscalls"}},
	{"driver", []string{"--hooks=driver", "--driver-symbols=" + testutil.FakeDriverSymbols}},
}

// BenchmarkSyscallTax: what a running gpud adds to syscalls that have
// nothing to do with GPUs, measured with a compiled loop
// (testdata/syscalltax/loop.c) as the ratio of nanoseconds per call with
// gpud running (bin/gpud, or GPUD_BIN, on 2 fake GPUs) to without it.
// Interleaved: each of GPUD_TAX_ROUNDS (5) rounds measures every pattern
// without gpud, then with gpud in each mode, starting and stopping gpud
// each time (its hooks leave the kernel when it stops). Reported per
// pattern and mode: the median ratio over the rounds and its spread (min,
// max). Goal (issue 18): ≤ 1.02 in driver mode.
func BenchmarkSyscallTax(b *testing.B) {
	testutil.RequireRoot(b)
	bin := footprintBinary(b)
	loop := buildTaxLoop(b)
	devDir, _ := makeGPUsForBench(b)
	file := filepath.Join(b.TempDir(), "regular")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		b.Fatal(err)
	}
	rounds := envInt("GPUD_TAX_ROUNDS", 5)
	base := map[string][]float64{}
	with := map[string][]float64{} // mode/kind → ns per call
	ratio := map[string][]float64{}
	measure := func(into map[string][]float64, prefix string) {
		for _, l := range taxLoops {
			into[prefix+l.kind] = append(into[prefix+l.kind], runTaxLoop(b, loop, l.kind, l.n, file))
		}
	}
	for r := 0; r < rounds; r++ {
		measure(base, "")
		for _, m := range taxModes {
			g := startGpudProcess(b, bin, devDir, "syscall-tax", m.args...)
			testutil.WaitStateFile(b, g.state, 30*time.Second, func(*v1.StateFile) bool { return true })
			measure(with, m.name+"/")
			g.stop()
			if g.cmd.ProcessState.ExitCode() != 0 {
				b.Fatalf("gpud (%s mode) exited with %v:\n%s", m.name, g.cmd.ProcessState, g.log)
			}
		}
		for _, m := range taxModes {
			for _, l := range taxLoops {
				k := m.name + "/" + l.kind
				ratio[k] = append(ratio[k], with[k][r]/base[l.kind][r])
			}
		}
	}
	for _, l := range taxLoops {
		b.ReportMetric(median(base[l.kind]), "ns-"+l.kind+"-without-gpud")
		for _, m := range taxModes {
			k := m.name + "/" + l.kind
			b.ReportMetric(median(with[k]), "ns-"+l.kind+"-"+m.name)
			b.ReportMetric(median(ratio[k]), "ratio-"+l.kind+"-"+m.name)
			b.ReportMetric(slicesMin(ratio[k]), "ratio-"+l.kind+"-"+m.name+"-min")
			b.ReportMetric(slicesMax(ratio[k]), "ratio-"+l.kind+"-"+m.name+"-max")
		}
	}
}

// buildTaxLoop compiles the loop with the machine's C compiler.
func buildTaxLoop(b *testing.B) string {
	b.Helper()
	out := filepath.Join(b.TempDir(), "loop")
	cc := exec.Command("cc", "-O2", "-Wall", "-Werror", "-o", out, "testdata/syscalltax/loop.c")
	if msg, err := cc.CombinedOutput(); err != nil {
		b.Fatalf("compiling the syscall loop: %v\n%s", err, msg)
	}
	return out
}

func runTaxLoop(b *testing.B, loop, kind string, n int, file string) float64 {
	b.Helper()
	out, err := exec.Command(loop, kind, strconv.Itoa(n), file).Output()
	if err != nil {
		b.Fatalf("syscall loop %s: %v", kind, err)
	}
	ns, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	if err != nil || ns <= 0 {
		b.Fatalf("syscall loop %s printed %q: %v", kind, out, err)
	}
	return ns
}
