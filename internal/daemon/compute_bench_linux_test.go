//go:build cgo

package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// BenchmarkComputeShare: gpud's compute time-slice scheduler (issue 30)
// with 4 pods sharing one fake GPU, targets 10/20/30/40, all busy (fake GPU
// work: the NVML double's utilization follows the time a process runs or
// waits to run). gpud runs as its own process (this test binary re-executed
// as a daemon: a real gpud has no other way to learn pods and DRA shares
// without an API server and a kubelet), so that its CPU is its
// /proc/PID/stat alone.
//
// A round starts gpud with the 4 pods' shares known, then starts the 4
// pods' work one after another; t0 is when the last one started. Each
// pod's share is sampled every 100 ms (its run+wait time, what the double
// reports, over wall time):
//   - s-converge: the end of the first 1 s window (of 10 consecutive
//     samples, sliding) after t0 in which every pod is within ±3 points of
//     its target; 5 s + GPUD_COMPUTE_WINDOW when none is (goal ≤ 5 s).
//   - the steady period is t0+5 s to t0+5 s+GPUD_COMPUTE_WINDOW (20 s):
//     points-mae-1s and points-max-1s are the mean and largest |share −
//     target| over its consecutive 1 s windows and the 4 pods (goal: max ≤
//     5), points-mae-10s and points-max-10s over its 10 s windows (a
//     window shorter than 20 s is one window; goal: max ≤ 3).
//   - ops/s: the scheduler's freezes and thaws per second over the
//     steady period (Controller.Ops).
//   - %cpu: gpud's CPU (utime+stime) over the steady period, percent of
//     one core (goal ≤ 1).
//
// The baseline round, interleaved with each round, is the same gpud with
// the same 4 pods busy on memory-only shares (no compute target: nothing
// scheduled): %cpu-baseline, over the same period. GPUD_COMPUTE_ROUNDS
// (3) rounds of each; medians reported, and the worst round's errors.
// GPUD_COMPUTE_PROFILES, a directory: each round's gpud writes its CPU
// profile from ready to its end there ({compute,baseline}.PID.cpu.pprof).
func BenchmarkComputeShare(b *testing.B) {
	testutil.RequireRoot(b)
	rounds := envInt("GPUD_COMPUTE_ROUNDS", 3)
	window := time.Duration(envInt("GPUD_COMPUTE_WINDOW", 20)) * time.Second
	targets := []int{10, 20, 30, 40}
	devDir, gpus := testutil.MakeFakeGPUs(b, 2)
	double := testutil.NewNVMLDouble(b, "",
		testutil.NVMLGPU{Index: 0, Minor: int(gpus[0].Minor), UUID: "GPU-6d2a0c51-0000-4000-8000-0000000000b0", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30},
		testutil.NVMLGPU{Index: 1, Minor: int(gpus[1].Minor), UUID: "GPU-6d2a0c51-0000-4000-8000-0000000000b1", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30},
	)
	plan := computePlan{DevDir: devDir, Library: double.Library, UUID: "GPU-6d2a0c51-0000-4000-8000-0000000000b0"}
	var ctrs []string
	for i, target := range targets {
		uid, podID, ctr := testutil.PodCgroup(b, "burstable")
		plan.Pods = append(plan.Pods, computePlanPod{UID: uid, Name: fmt.Sprintf("p%d", i), CgroupID: podID, Target: target})
		ctrs = append(ctrs, ctr)
	}
	var conv, mae1, max1, mae10, max10, ops, cpu, cpu0 []float64
	for r := 0; r < rounds; r++ {
		base := runComputeRound(b, plan, double, gpus[0].Path, ctrs, false, window)
		m := runComputeRound(b, plan, double, gpus[0].Path, ctrs, true, window)
		b.Logf("round %d: converged in %.1f s, 1 s windows mean/max error %.2f/%.2f points, 10 s %.2f/%.2f, %.0f ops/s, gpud %.2f%% CPU (%.2f%% without compute shares)",
			r, m.converge, m.mae1, m.max1, m.mae10, m.max10, m.ops, m.cpu, base.cpu)
		conv, mae1, max1, mae10, max10 = append(conv, m.converge), append(mae1, m.mae1), append(max1, m.max1), append(mae10, m.mae10), append(max10, m.max10)
		ops, cpu, cpu0 = append(ops, m.ops), append(cpu, m.cpu), append(cpu0, base.cpu)
	}
	b.ReportMetric(median(conv), "s-converge")
	b.ReportMetric(slicesMax(conv), "s-converge-max")
	b.ReportMetric(median(mae1), "points-mae-1s")
	b.ReportMetric(slicesMax(max1), "points-max-1s")
	b.ReportMetric(median(mae10), "points-mae-10s")
	b.ReportMetric(slicesMax(max10), "points-max-10s")
	b.ReportMetric(median(ops), "ops/s")
	b.ReportMetric(median(cpu), "%cpu")
	b.ReportMetric(slicesMax(cpu), "%cpu-max")
	b.ReportMetric(median(cpu0), "%cpu-baseline")
	b.ReportMetric(median(cpu)-median(cpu0), "%cpu-scheduler")
}

// computePlan is what the re-executed gpud (runComputeGpud) runs with.
type computePlan struct {
	DevDir, Library, UUID string
	StateDir              string
	Compute               bool // the shares carry their targets; false: memory only
	Pods                  []computePlanPod
}

type computePlanPod struct {
	UID, Name string
	CgroupID  uint64
	Target    int
}

type computeRound struct {
	converge, mae1, max1, mae10, max10, ops, cpu float64
}

// computeGpudEnv, set to a computePlan in JSON, makes this test binary a
// gpud for BenchmarkComputeShare.
const computeGpudEnv = "GPUD_BENCH_COMPUTE_GPUD"

func init() {
	// Before TestMain: the daemon process has no tests to run.
	if p := os.Getenv(computeGpudEnv); p != "" {
		if err := runComputeGpud(p); err != nil {
			fmt.Fprintln(os.Stderr, "compute bench gpud:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// runComputeRound starts gpud with plan's pods (their compute targets or
// not), then the pods' work, and measures.
func runComputeRound(b *testing.B, plan computePlan, double *testutil.NVMLDouble, device string, ctrs []string, compute bool, window time.Duration) computeRound {
	b.Helper()
	plan.Compute, plan.StateDir = compute, b.TempDir()
	g := startComputeGpud(b, plan)
	defer g.stop()
	var works []*testutil.GPUWork
	defer func() {
		for _, w := range works {
			w.Cmd.Process.Kill()
			w.Cmd.Wait()
		}
		double.SetProcesses(b) // the next round's work is new processes
	}()
	for i := range plan.Pods {
		works = append(works, testutil.StartGPUWork(b, double, 0, device, ctrs[i], 1<<30))
	}
	t0 := time.Now()
	const step = 100 * time.Millisecond
	steady := 5 * time.Second
	n := int((steady + window) / step)
	at := make([]time.Time, 0, n+1)
	busy := make([][]int64, 0, n+1) // per sample, per pod
	sample := func() {
		row := make([]int64, len(works))
		for i, w := range works {
			row[i], _ = testutil.BusyNS(w.PID)
		}
		at, busy = append(at, time.Now()), append(busy, row)
	}
	sample()
	var ticks0, ticks1 uint64
	var ops0, ops1 uint64
	var s0, s1 time.Time
	for i := 1; i <= n; i++ {
		time.Sleep(time.Until(t0.Add(time.Duration(i) * step)))
		sample()
		switch i {
		case int(steady / step):
			ticks0, s0, ops0 = procTicks(b, g.pid), time.Now(), g.ops(b)
		case n:
			ticks1, s1, ops1 = procTicks(b, g.pid), time.Now(), g.ops(b)
		}
	}
	for _, w := range works {
		if !testutil.Alive(w.PID) {
			b.Fatalf("fake GPU work %d exited", w.PID)
		}
	}
	res := computeRound{cpu: 100 * float64(ticks1-ticks0) / 100 / s1.Sub(s0).Seconds()} // USER_HZ is 100
	if !compute {
		return res
	}
	res.ops = float64(ops1-ops0) / s1.Sub(s0).Seconds()
	// share is each pod's percent of the GPU between samples i and j.
	share := func(i, j int) []float64 {
		out := make([]float64, len(works))
		for p := range works {
			out[p] = 100 * float64(busy[j][p]-busy[i][p]) / float64(at[j].Sub(at[i]).Nanoseconds())
		}
		return out
	}
	errs := func(i, j int) []float64 {
		s := share(i, j)
		for p := range s {
			s[p] = math.Abs(s[p] - float64(plan.Pods[p].Target))
		}
		return s
	}
	per := int(time.Second / step)
	res.converge = (steady + window).Seconds()
	for j := per; j <= n; j++ {
		if slicesMax(errs(j-per, j)) <= 3 {
			res.converge = at[j].Sub(t0).Seconds()
			break
		}
	}
	first := int(steady / step)
	windows := func(size int) (mae, worst float64) {
		var all []float64
		for i := first; i+size <= n; i += size {
			all = append(all, errs(i, i+size)...)
		}
		for _, e := range all {
			mae += e / float64(len(all))
		}
		return mae, slicesMax(all)
	}
	res.mae1, res.max1 = windows(per)
	res.mae10, res.max10 = windows(min(10*per, n-first))
	if res.max1 > 5 {
		b.Logf("1 s shares (targets %v): %v", planTargets(plan), roundShares(share, first, n, per))
	}
	return res
}

func planTargets(plan computePlan) []int {
	var out []int
	for _, p := range plan.Pods {
		out = append(out, p.Target)
	}
	return out
}

func roundShares(share func(i, j int) []float64, first, n, per int) [][]int {
	var out [][]int
	for i := first; i+per <= n; i += per {
		var row []int
		for _, s := range share(i, i+per) {
			row = append(row, int(math.Round(s)))
		}
		out = append(out, row)
	}
	return out
}

// computeGpud is the re-executed gpud: it answers "ops" on its stdin with
// the scheduler's freezes and thaws so far.
type computeGpud struct {
	cmd *exec.Cmd
	pid int
	in  io.WriteCloser
	out *bufio.Scanner
	log *bytes.Buffer
}

func startComputeGpud(b *testing.B, plan computePlan) *computeGpud {
	b.Helper()
	p, err := json.Marshal(plan)
	if err != nil {
		b.Fatal(err)
	}
	g := &computeGpud{cmd: exec.Command(os.Args[0]), log: new(bytes.Buffer)}
	g.cmd.Env = append(os.Environ(), computeGpudEnv+"="+string(p))
	g.cmd.Stderr = g.log
	if g.in, err = g.cmd.StdinPipe(); err != nil {
		b.Fatal(err)
	}
	out, err := g.cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	g.out = bufio.NewScanner(out)
	if err := g.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	g.pid = g.cmd.Process.Pid
	if line := g.line(); line != "ready" {
		g.stop()
		b.Fatalf("gpud not ready (%q): %s", line, g.log)
	}
	return g
}

func (g *computeGpud) line() string {
	if !g.out.Scan() {
		return ""
	}
	return g.out.Text()
}

func (g *computeGpud) ops(b *testing.B) uint64 {
	b.Helper()
	if _, err := io.WriteString(g.in, "ops\n"); err != nil {
		b.Fatalf("gpud: %v: %s", err, g.log)
	}
	n, err := strconv.ParseUint(g.line(), 10, 64)
	if err != nil {
		b.Fatalf("gpud's ops: %v: %s", err, g.log)
	}
	return n
}

// stop ends it with SIGTERM (it thaws what it froze).
func (g *computeGpud) stop() {
	g.cmd.Process.Signal(syscall.SIGTERM)
	g.in.Close()
	g.cmd.Wait()
}

// runComputeGpud is the daemon of BenchmarkComputeShare's rounds: gpud as
// `gpud run --enforce` would run it, its pods and DRA shares put in as the
// API server source and the DRA driver would; "ready" on stdout once the
// shares are in its state.
func runComputeGpud(planJSON string) error {
	var plan computePlan
	if err := json.Unmarshal([]byte(planJSON), &plan); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	book := sharing.NewBook()
	cfg := daemon.Config{Run: config.Run{
		DevDir: plan.DevDir, StateFile: filepath.Join(plan.StateDir, "state.json"), StateDir: plan.StateDir,
		IdleAfter: time.Minute, NodeName: "compute-bench", Hooks: testHooks(), DriverSymbols: testutil.FakeDriverSymbols,
		Enforce: true, FailOpenAfter: 30 * time.Second, Reclaim: preempt.ReclaimNone, DefaultPriority: occupancy.Unmanaged,
		DockerHost: "none", CRIEndpoint: "none", UseNVML: true, NVMLLibrary: plan.Library,
	}}
	cfg.Shares = book
	d, err := daemon.New(cfg, slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	for _, p := range plan.Pods {
		d.Registry().Put(workload.Workload{PodUID: p.UID, Namespace: "team", Name: p.Name, TaskID: "team/" + p.Name, Priority: occupancy.Low, CgroupID: p.CgroupID})
		sh := sharing.Share{ClaimUID: "claim-" + p.UID, ClaimNamespace: "team", ClaimName: p.Name + "-gpu", Request: "gpu",
			GPU: 0, UUID: plan.UUID, Bytes: 1 << 30, Pods: []sharing.PodRef{{UID: p.UID, Namespace: "team", Name: p.Name}}}
		if plan.Compute {
			sh.Compute = p.Target
		}
		book.Set(sh.ClaimUID, []sharing.Share{sh})
	}
	// The claims are prepared before the pods' containers start.
	known := testutil.Poll(10*time.Second, func() bool {
		st := d.State()
		if len(st.GPUs) == 0 {
			return false
		}
		return !slices.ContainsFunc(plan.Pods, func(p computePlanPod) bool { _, ok := shareOf(st.GPUs[0], p.UID); return !ok })
	})
	if !known {
		cancel()
		<-done
		return fmt.Errorf("the shares never showed in the state")
	}
	if dir := os.Getenv("GPUD_COMPUTE_PROFILES"); dir != "" {
		// The steady state's CPU, from ready until SIGTERM.
		kind := "baseline"
		if plan.Compute {
			kind = "compute"
		}
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s.%d.cpu.pprof", kind, os.Getpid())))
		if err != nil {
			return fmt.Errorf("profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Println("ready")
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if in.Text() == "ops" {
				fmt.Println(d.ComputeOps())
			}
		}
		cancel() // the benchmark is gone
	}()
	return <-done
}
