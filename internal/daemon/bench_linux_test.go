package daemon_test

// `make bench`: each figure is measured against a baseline taken in the same
// run, with interleaved repetitions, because the machines are noisy.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/config"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// openCloseNs times n open+close pairs of path and returns ns per pair.
func openCloseNs(path string, n int) float64 {
	start := time.Now()
	for i := 0; i < n; i++ {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			panic(err)
		}
		unix.Close(fd)
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func percentile(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	i := int(p / 100 * float64(len(s)-1))
	return s[i]
}

// BenchmarkOpenOverhead: open+close of a non-GPU device (/dev/null) and of a
// regular file, with gpud's programs attached and without, interleaved.
// Reported: ns per pair each way and the ratio with/without (goal ≤ 1.02).
func BenchmarkOpenOverhead(b *testing.B) {
	devDir, _ := makeGPUsForBench(b)
	regular := filepath.Join(b.TempDir(), "regular")
	if err := os.WriteFile(regular, []byte("x"), 0o644); err != nil {
		b.Fatal(err)
	}
	const rounds, n = 12, 100000
	for _, target := range []struct{ name, path string }{{"devnull", "/dev/null"}, {"regular", regular}} {
		b.Run(target.name, func(b *testing.B) {
			var with, without, ratios []float64
			for r := 0; r < rounds; r++ {
				openCloseNs(target.path, n/10) // warm up
				wo := openCloseNs(target.path, n)
				d := startBenchDaemon(b, devDir, 0)
				openCloseNs(target.path, n/10)
				w := openCloseNs(target.path, n)
				d.stop()
				without, with = append(without, wo), append(with, w)
				ratios = append(ratios, w/wo)
			}
			b.ReportMetric(median(without), "ns/pair-without")
			b.ReportMetric(median(with), "ns/pair-with")
			b.ReportMetric(median(ratios), "ratio")
		})
	}
}

// BenchmarkOpenToLedger: a GPU open in another process → the holder in the
// in-memory ledger, and → in the state file on disk. ≥ 200 trials, each
// by a new process (a CUDA process opens its GPU at start), which exits
// after it: its exit takes it out of the ledger at once in every --hooks
// mode, where a close is seen only at the holders' next re-read in driver
// mode without kprobes. The ledger is polled every 20 µs (the open may be
// resolved after its event, from the opener's fd table), which adds up to
// a timer tick to each figure.
func BenchmarkOpenToLedger(b *testing.B) {
	devDir, gpus := makeGPUsForBench(b)
	d := startBenchDaemon(b, devDir, 0)
	defer d.stop()
	const trials = 300
	var toLedger, toFile []float64
	for i := 0; i < trials; i++ {
		h := startHelper(b)
		var t0 uint64
		var fd int
		fmt.Sscan(h.do("opentimed %s", gpus[0]), &t0, &fd)
		var t1 uint64
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Microsecond) {
			if slices.Contains(d.d.Ledger().FDs(h.pid(), 0), int32(fd)) {
				t1 = bpf.MonotonicNow()
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("trial %d: open never reached the ledger", i)
			}
		}
		v := d.d.Ledger().Version()
		select {
		case <-d.d.Writer().Written(v):
		case <-time.After(2 * time.Second):
			b.Fatalf("trial %d: state file never written", i)
		}
		t2 := bpf.MonotonicNow()
		toLedger = append(toLedger, float64(t1-t0)/1e3)
		toFile = append(toFile, float64(t2-t0)/1e3)
		h.cmd.Process.Kill()
		h.cmd.Wait()
		testutil.Eventually(b, 5*time.Second, "the condition", func() bool { return len(d.d.Ledger().FDTable()[h.pid()]) == 0 })
	}
	b.ReportMetric(percentile(toLedger, 50), "µs-ledger-p50")
	b.ReportMetric(percentile(toLedger, 99), "µs-ledger-p99")
	b.ReportMetric(percentile(toFile, 50), "µs-statefile-p50")
	b.ReportMetric(percentile(toFile, 99), "µs-statefile-p99")
	b.ReportMetric(percentile(toLedger, 99)/1000, "ratio-ledger-p99-to-1ms-goal")
	b.ReportMetric(percentile(toFile, 99)/5000, "ratio-statefile-p99-to-5ms-goal")
}

// BenchmarkEventThroughput: GPU open/close pairs per second from two
// processes, processed by gpud, against the same generators' rate without
// gpud (the baseline). Drops are counted, and a full resync follows them;
// the ledger is checked against /proc at the end.
func BenchmarkEventThroughput(b *testing.B) {
	devDir, gpus := makeGPUsForBench(b)
	gens := []*helper{startHelper(b)}
	churn := func(ms int) int {
		var wg sync.WaitGroup
		counts := make([]int, len(gens))
		for i, g := range gens {
			wg.Add(1)
			go func() { defer wg.Done(); counts[i] = g.doInt("churn %s %d", gpus[i%len(gpus)], ms) }()
		}
		wg.Wait()
		total := 0
		for _, c := range counts {
			total += c
		}
		return total
	}
	const ms = 2000
	var baseRates, rates, ratios, events []float64
	var drops, resyncs uint64
	for r := 0; r < 3; r++ {
		base := float64(churn(ms)) / (ms / 1000.0)
		d := startBenchDaemon(b, devDir, 0)
		ev0 := d.d.Tracker().Events.Load()
		pairs := churn(ms)
		// Let the consumer drain what is queued, then count.
		testutil.Eventually(b, 5*time.Second, "the condition", func() bool { return d.d.Monitor().Pending() == 0 })
		time.Sleep(50 * time.Millisecond)
		events = append(events, float64(d.d.Tracker().Events.Load()-ev0)/float64(pairs))
		drops += d.d.Tracker().Drops.Load()
		resyncs += d.d.Tracker().Resyncs.Load() - 1 // less the start-up one
		if d.d.Tracker().Drops.Load() > 0 && d.d.Tracker().Resyncs.Load() < 2 {
			b.Fatalf("drops without a resync")
		}
		// The generators hold nothing between pairs; after the churn the
		// ledger must be empty of them (in driver mode without kprobes,
		// after the holders' next re-read).
		testutil.Eventually(b, 5*time.Second, "the generators out of the ledger", func() bool {
			got := d.d.Ledger().FDTable()
			for _, g := range gens {
				if len(got[g.pid()]) != 0 {
					return false
				}
			}
			return true
		})
		d.stop()
		// Every pair the generator made with gpud attached was processed:
		// the events were all read (nothing pending) and none was dropped
		// (drops are reported apart; a run with drops did not keep up).
		rate := float64(pairs) / (ms / 1000.0)
		baseRates, rates = append(baseRates, base), append(rates, rate)
		ratios = append(ratios, rate/base)
	}
	b.ReportMetric(median(baseRates), "pairs/s-generated-without-gpud")
	b.ReportMetric(median(rates), "pairs/s-processed-with-gpud")
	b.ReportMetric(median(ratios), "ratio-processed-to-baseline")
	b.ReportMetric(median(rates)/100000, "ratio-to-100k-goal")
	b.ReportMetric(median(events), "events-per-pair")
	b.ReportMetric(float64(drops), "drops")
	b.ReportMetric(float64(resyncs), "resyncs")

	// The goal's rate, paced (GPUD_THROUGHPUT_RATE, default 100 000 pairs/s
	// from one generator): drops there say whether gpud keeps up with it.
	goal := 100000
	if n, err := strconv.Atoi(os.Getenv("GPUD_THROUGHPUT_RATE")); err == nil && n > 0 {
		goal = n
	}
	var pacedRates []float64
	var pacedDrops uint64
	for r := 0; r < 3; r++ {
		d := startBenchDaemon(b, devDir, 0)
		pairs := gens[0].doInt("churn %s %d %d", gpus[0], ms, goal)
		testutil.Eventually(b, 5*time.Second, "the condition", func() bool { return d.d.Monitor().Pending() == 0 })
		pacedDrops += d.d.Tracker().Drops.Load()
		d.stop()
		pacedRates = append(pacedRates, float64(pairs)/(ms/1000.0))
	}
	b.ReportMetric(median(pacedRates), "pairs/s-paced")
	b.ReportMetric(float64(pacedDrops), "drops-paced")
}

type benchDaemon struct {
	d    *daemon.Daemon
	stop func()
}

func makeGPUsForBench(b *testing.B) (string, []string) {
	b.Helper()
	dir := b.TempDir()
	paths := []string{filepath.Join(dir, "nvidia0"), filepath.Join(dir, "nvidia1")}
	for i, mm := range [][2]uint32{{1, 7}, {10, 229}} {
		if err := unix.Mknod(paths[i], unix.S_IFCHR|0o666, int(unix.Mkdev(mm[0], mm[1]))); err != nil {
			testutil.Skip(b, fmt.Sprintf("mknod (needs root): %v", err))
		}
	}
	return dir, paths
}

func startBenchDaemon(b *testing.B, devDir string, ring uint32) *benchDaemon {
	b.Helper()
	return startBenchDaemonWith(b, devDir, func(c *daemon.Config) { c.RingBytes = ring; c.DockerHost = "none" })
}

func startBenchDaemonWith(b *testing.B, devDir string, set func(*daemon.Config)) *benchDaemon {
	b.Helper()
	dir := b.TempDir()
	cfg := daemon.Config{Run: config.Run{DevDir: devDir, StateFile: filepath.Join(dir, "state.json"), StateDir: dir,
		IdleAfter: time.Minute, NodeName: "bench"}}
	set(&cfg)
	d, stop := runDaemon(b, cfg, discardLogger())
	waitReady(b, d)
	return &benchDaemon{d: d, stop: stop}
}

func discardLogger() *slog.Logger {
	if os.Getenv("GPUD_BENCH_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func startEnforcingBenchDaemon(b *testing.B, devDir string) *benchDaemon {
	b.Helper()
	return startBenchDaemonWith(b, devDir, func(c *daemon.Config) {
		c.Enforce, c.FailOpenAfter, c.DockerHost, c.Reclaim, c.ReservationTTL = true, 30*time.Second, "none", "none", 30*time.Second
	})
}

// BenchmarkPreemptLatency: a high-priority open of a GPU held by two
// low-priority processes → both confirmed dead (pidfd readable), over 200
// trials; the ratio is p99 to the 5 ms goal. The baseline, interleaved
// trial by trial with the same processes and gpud running: a bare C
// program (testdata/bare/bare.c, running throughout) SIGKILLs both holders
// through pidfds (no open, no decision) and waits for both dead, which is
// what the victims' own death costs (their threads woken, their address
// space unmapped, their files closed). GPUD_PREEMPT_TRIALS: the trials
// of both kinds together (400). Issue 31's goals, loaded
// (GPUD_BENCH_LOAD=hog) as unloaded: open → both dead p99 ≤ 1.1 × the
// bare program's p99 ("ratio-p99-to-bare"), and gpud's part (open → both
// signalled) p99 ≤ 1 ms ("ratio-gpud-part-p99-to-1ms-goal").
func BenchmarkPreemptLatency(b *testing.B) {
	devDir, gpus := makeGPUsForBench(b)
	bare := startBare(b)
	st := traceSteps(b)
	d := startEnforcingBenchDaemon(b, devDir)
	defer d.stop()
	lat, base := killTrials(b, d, gpus, "b", envInt("GPUD_PREEMPT_TRIALS", 400), bare, st)
	reportLoad(b)
	b.ReportMetric(percentile(lat, 99)/1000, "ms-p99")
	b.ReportMetric(percentile(base, 99)/1000, "ms-p99-bare")
	b.ReportMetric(percentile(lat, 99)/percentile(base, 99), "ratio-p99-to-bare")
	b.ReportMetric(st.pct("signalled", 99)/1000, "ms-p99-gpud-part")
	b.ReportMetric(st.pct("signalled", 99)/1000, "ratio-gpud-part-p99-to-1ms-goal")
	b.ReportMetric(percentile(lat, 50), "µs-p50")
	b.ReportMetric(percentile(lat, 99), "µs-p99")
	b.ReportMetric(percentile(lat, 99)/5000, "ratio-p99-to-5ms-goal")
	b.ReportMetric(percentile(base, 50), "µs-p50-bare")
	b.ReportMetric(percentile(lat, 50)/percentile(base, 50), "ratio-p50-to-bare")
	// gpud's part: the open → both victims signalled.
	b.ReportMetric(st.pct("signalled", 50), "µs-p50-open-to-signalled")
	b.ReportMetric(st.pct("signalled", 99), "µs-p99-open-to-signalled")
}

// BenchmarkPreemptLatencyCheckpoints: the same with --checkpoint-root set,
// as the DaemonSet runs it (each victim's task gets a checkpoint notice),
// in alternating blocks with a daemon without it; the ratios are with /
// without. The notice is written after the kill (before it without
// fsync when there is a grace period): it must cost the kill nothing.
func BenchmarkPreemptLatencyCheckpoints(b *testing.B) {
	devDir, gpus := makeGPUsForBench(b)
	var with, without []float64
	for block := 0; block < 4; block++ {
		d := startEnforcingBenchDaemon(b, devDir)
		without = append(without, preemptTrials(b, d, gpus, fmt.Sprintf("n%d", block), 40)...)
		d.stop()
		dir := b.TempDir()
		d = startBenchDaemonWith(b, devDir, func(c *daemon.Config) {
			c.Enforce, c.FailOpenAfter, c.DockerHost, c.Reclaim, c.ReservationTTL = true, 30*time.Second, "none", "none", 30*time.Second
			c.CheckpointRoot = dir
		})
		with = append(with, preemptTrials(b, d, gpus, fmt.Sprintf("c%d", block), 40)...)
		d.stop()
	}
	b.ReportMetric(percentile(with, 50), "µs-p50-checkpoints")
	b.ReportMetric(percentile(with, 99), "µs-p99-checkpoints")
	b.ReportMetric(percentile(with, 50)/percentile(without, 50), "ratio-p50-to-without")
	b.ReportMetric(percentile(with, 99)/percentile(without, 99), "ratio-p99-to-without")
}

// preemptTrials runs n high-over-low preemptions (two low holders each)
// and returns open → both dead, in µs. Cgroups are named by prefix.
func preemptTrials(b *testing.B, d *benchDaemon, gpus []string, prefix string, trials int, st ...*steps) []float64 {
	b.Helper()
	lat, _ := killTrials(b, d, gpus, prefix, trials, nil, st...)
	return lat
}

// killTrials is preemptTrials; with bare, every other trial is a baseline
// trial instead: the same setup, and the bare C program SIGKILLs both low
// holders (kill → both dead, returned apart).
func killTrials(b *testing.B, d *benchDaemon, gpus []string, prefix string, trials int, bare *bareProg, st ...*steps) (lat, base []float64) {
	b.Helper()
	hdir, hid := testutil.Cgroup(b, prefix+"high")
	ldir, lid := testutil.Cgroup(b, prefix+"low")
	d.d.Registry().Put(workload.Workload{CgroupID: hid, Priority: occupancy.High, TaskID: "bench-high"})
	d.d.Registry().Put(workload.Workload{CgroupID: lid, Priority: occupancy.Low, TaskID: "bench-low"})
	for i := 0; i < trials; i++ {
		direct := bare != nil && i%2 == 1
		// A high holder per trial, which exits after it: its exit leaves
		// the ledger at once in every --hooks mode (a close is seen at the
		// holders' next re-read in driver mode without kprobes).
		high := startHelper(b)
		testutil.JoinCgroup(b, hdir, high.pid())
		var pidfds []int
		var lows []*helper
		for j := 0; j < 2; j++ {
			l := startHelper(b)
			testutil.JoinCgroup(b, ldir, l.pid())
			l.do("open %s", gpus[0])
			fd, err := unix.PidfdOpen(l.pid(), 0)
			if err != nil {
				b.Fatal(err)
			}
			pidfds = append(pidfds, fd)
			lows = append(lows, l)
		}
		testutil.Eventually(b, 5*time.Second, "the condition", func() bool { return d.d.Ledger().Counts()[0].Low == 2 })
		// the gate must know about the low holders before the high open
		time.Sleep(2 * time.Millisecond)
		var t0 uint64
		var bareUs float64
		if direct {
			bareUs = bare.kill(b, lows[0].pid(), lows[1].pid())
		} else {
			fmt.Sscan(high.do("opentimed %s", gpus[0]), &t0)
		}
		for _, fd := range pidfds {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(p, 5000)
			for err == unix.EINTR {
				n, err = unix.Poll(p, 5000)
			}
			if n != 1 {
				b.Fatalf("trial %d: a low holder survived: %v", i, err)
			}
			unix.Close(fd)
		}
		end := bpf.MonotonicNow()
		if direct {
			base = append(base, bareUs)
		} else {
			lat = append(lat, float64(end-t0)/1e3)
			for _, s := range st {
				s.trial(t0, end)
			}
		}
		for _, l := range lows {
			l.cmd.Wait()
		}
		high.cmd.Process.Kill()
		high.cmd.Wait()
		testutil.Eventually(b, 5*time.Second, "the condition", func() bool { c := d.d.Ledger().Counts()[0]; return c.High == 0 && c.Low == 0 })
	}
	return lat, base
}

// BenchmarkGateCost: GPU open+close pairs by a classified high-priority
// process, interleaved: without gpud, with gpud observing only
// (--enforce=false), and with the enforcing gate. "ratio" is the gate's own
// cost (enforcing / observing); "ratio-total" is enforcing / without gpud.
func BenchmarkGateCost(b *testing.B) {
	devDir, gpus := makeGPUsForBench(b)
	hdir, hid := testutil.Cgroup(b, "ghigh")
	h := startHelper(b)
	testutil.JoinCgroup(b, hdir, h.pid())
	const ms = 1000
	nsPerPair := func() float64 { return ms * 1e6 / float64(h.doInt("churn %s %d", gpus[0], ms)) }
	var without, observing, enforcing, gate, total []float64
	for r := 0; r < 5; r++ {
		wo := nsPerPair()
		d := startBenchDaemon(b, devDir, 0)
		ob := nsPerPair()
		d.stop()
		d = startEnforcingBenchDaemon(b, devDir)
		d.d.Registry().Put(workload.Workload{CgroupID: hid, Priority: occupancy.High})
		en := nsPerPair()
		d.stop()
		without, observing, enforcing = append(without, wo), append(observing, ob), append(enforcing, en)
		gate, total = append(gate, en/ob), append(total, en/wo)
	}
	b.ReportMetric(median(without), "ns/pair-without")
	b.ReportMetric(median(observing), "ns/pair-observing")
	b.ReportMetric(median(enforcing), "ns/pair-enforcing")
	b.ReportMetric(median(gate), "ratio")
	b.ReportMetric(median(total), "ratio-total")
}

// BenchmarkGateRace: 100 000 low-priority opens racing high-priority opens
// and closes; reports how many succeeded while a high holder existed (must be 0).
func BenchmarkGateRace(b *testing.B) {
	devDir, gpus := makeGPUsForBench(b)
	d := startEnforcingBenchDaemon(b, devDir)
	defer d.stop()
	bad, ok, denied := runRace(b, d.d, gpus[0], 100000)
	b.ReportMetric(float64(bad), "violations")
	b.ReportMetric(float64(ok), "low-allowed")
	b.ReportMetric(float64(denied), "low-refused")
	// Issue 31: the first opens the kernel must refuse (a high holder held
	// the GPU: refused, or completed and counted a violation), refused at
	// 100 %, loaded (GPUD_BENCH_LOAD=hog) as unloaded.
	b.ReportMetric(100*float64(denied)/float64(max(denied+bad, 1)), "%-refused-while-high-held")
	reportLoad(b)
}

// BenchmarkLendHealth: a GPU's change between lendable and not (a holder
// opens it: busy; the last holder closes: free, lendable with --lend-free)
// → the new health on a ListAndWatch stream of gpud's device plugin (what
// kubelet reads), GPUD_LEND_TRIALS (200) transitions each way. Goal p99 ≤
// 50 ms. Where the driver's release has no kprobe (--hooks driver on a
// kernel without kprobes) a close is seen at the holders' next re-read,
// about 2 s: 200 trials then take 7 minutes.
func BenchmarkLendHealth(b *testing.B) {
	devDir, gpus := makeGPUsForBench(b)
	kdir := b.TempDir()
	d := startBenchDaemonWith(b, devDir, func(c *daemon.Config) {
		c.DockerHost, c.DevicePlugin, c.LendFree, c.KubeletDir = "none", true, true, kdir
		c.PodResourcesSocket = filepath.Join(kdir, "none.sock")
	})
	defer d.stop()
	sock := filepath.Join(kdir, "gpud.sock")
	testutil.Eventually(b, 5*time.Second, "the condition", func() bool { _, err := os.Stat(sock); return err == nil })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		b.Fatal(err)
	}
	health := make(chan string, 16)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				close(health)
				return
			}
			for _, dev := range r.Devices {
				if dev.ID == "gpu-0" {
					health <- dev.Health
				}
			}
		}
	}()
	wait := func(want string) uint64 {
		for h := range health {
			if h == want {
				return bpf.MonotonicNow()
			}
		}
		b.Fatal("ListAndWatch ended")
		return 0
	}
	wait(pluginapi.Healthy) // free, lendable
	h := startHelper(b)
	var toBusy, toFree []float64
	for i := 0; i < envInt("GPUD_LEND_TRIALS", 200); i++ {
		var t0 uint64
		var fd int
		fmt.Sscan(h.do("opentimed %s", gpus[0]), &t0, &fd)
		toBusy = append(toBusy, float64(wait(pluginapi.Unhealthy)-t0)/1e6)
		t1 := bpf.MonotonicNow()
		h.do("close %d", fd)
		toFree = append(toFree, float64(wait(pluginapi.Healthy)-t1)/1e6)
	}
	b.ReportMetric(percentile(toBusy, 50), "ms-busy-p50")
	b.ReportMetric(percentile(toBusy, 99), "ms-busy-p99")
	b.ReportMetric(percentile(toFree, 50), "ms-lendable-p50")
	b.ReportMetric(percentile(toFree, 99), "ms-lendable-p99")
	b.ReportMetric(max(percentile(toBusy, 99), percentile(toFree, 99))/50, "ratio-p99-to-50ms-goal")
}

// BenchmarkRejudgeLatency: a holder that got past the gate before gpud knew
// its container (its class unknown), beside a high-priority holder; its
// container's class arrives (low) → the holder confirmed dead. Over 30
// trials, in blocks interleaved with the gate's own path (a high open over
// low holders, preemptTrials) in the same daemon; the ratio is p50 against
// that path's p50.
func BenchmarkRejudgeLatency(b *testing.B) {
	devDir, gpus := makeGPUsForBench(b)
	d := startEnforcingBenchDaemon(b, devDir)
	defer d.stop()
	reg := d.d.Registry()
	hdir, hid := testutil.Cgroup(b, "rj-high")
	reg.Put(workload.Workload{CgroupID: hid, Priority: occupancy.High, TaskID: "rj-high"})
	high := startHelper(b)
	testutil.JoinCgroup(b, hdir, high.pid())
	var rejudged, gate []float64
	for block := 0; block < 3; block++ {
		hfd := high.do("open %s", gpus[1])
		for i := 0; i < 10; i++ {
			dir, id, cg := testutil.ContainerCgroup(b)
			late := startHelper(b)
			testutil.JoinCgroup(b, dir, late.pid())
			late.do("open %s", gpus[1])
			pidfd, err := unix.PidfdOpen(late.pid(), 0)
			if err != nil {
				b.Fatal(err)
			}
			testutil.Eventually(b, 5*time.Second, "the late holder in the ledger", func() bool {
				info, ok := d.d.Ledger().Has(late.pid())
				return ok && info.Unknown
			})
			t0 := time.Now()
			reg.Put(workload.Workload{ContainerID: id, CgroupID: cg, Name: "late", Priority: occupancy.Low})
			p := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
			if n, err := unix.Poll(p, 5000); n != 1 {
				b.Fatalf("the late low holder survived its class: %v", err)
			}
			rejudged = append(rejudged, float64(time.Since(t0).Microseconds()))
			unix.Close(pidfd)
			late.cmd.Wait()
		}
		high.do("close %s", hfd)
		testutil.Eventually(b, 5*time.Second, "GPU 1 free", func() bool { return d.d.Ledger().Counts()[1].High == 0 })
		gate = append(gate, preemptTrials(b, d, gpus, fmt.Sprintf("rj%d", block), 10)...)
	}
	b.ReportMetric(percentile(rejudged, 50), "µs-class-to-dead-p50")
	b.ReportMetric(percentile(rejudged, 99), "µs-class-to-dead-p99")
	b.ReportMetric(percentile(rejudged, 50)/percentile(gate, 50), "ratio-p50-to-gate-kill")
}

// BenchmarkFreezeLatency: --preempt-mode freeze. A high-priority open of
// a GPU held by two low-priority processes of one workload → its cgroup
// frozen (cgroup.events says so), against the kill mode's open → both
// dead on the same setup, in alternating blocks. Also the decision →
// frozen figure gpud records. The ratio to the 5 ms goal is decision →
// frozen at p99. Issue 31's goal: decision → frozen p99 ≤ 1.1 × the bare
// program's write → frozen p99 ("ratio-p99-to-bare"), loaded as
// unloaded; the floor is explained at freezeTrials.
// GPUD_FREEZE_TRIALS: the trials of each kind a block (40; 4 blocks).
func BenchmarkFreezeLatency(b *testing.B) {
	devDir, gpus := makeGPUsForBench(b)
	bare := startBare(b) // at SCHED_FIFO 1, the class of gpud's thread that writes the freeze and waits for it
	var frozen, recorded, killed, floor, bareFrozen, bareWritten []float64
	st := traceSteps(b)
	for block := 0; block < 4; block++ {
		d := startEnforcingBenchDaemon(b, devDir)
		killed = append(killed, preemptTrials(b, d, gpus, fmt.Sprintf("k%d", block), envInt("GPUD_FREEZE_TRIALS", 40))...)
		st.mu.Lock()
		st.cur = map[string]uint64{}
		st.mu.Unlock()
		d.stop()
		d = startBenchDaemonWith(b, devDir, func(c *daemon.Config) {
			c.Enforce, c.FailOpenAfter, c.DockerHost, c.Reclaim, c.ReservationTTL = true, 30*time.Second, "none", "none", 30*time.Second
			c.PreemptMode = "freeze"
		})
		f, r, fl, bf, bw := freezeTrials(b, d, gpus, fmt.Sprintf("f%d", block), envInt("GPUD_FREEZE_TRIALS", 40), bare, st)
		frozen, recorded, floor = append(frozen, f...), append(recorded, r...), append(floor, fl...)
		bareFrozen, bareWritten = append(bareFrozen, bf...), append(bareWritten, bw...)
		d.stop()
	}
	reportLoad(b)
	b.ReportMetric(percentile(recorded, 99)/1000, "ms-p99")
	b.ReportMetric(percentile(floor, 99)/1000, "ms-p99-bare")
	b.ReportMetric(percentile(recorded, 99)/percentile(floor, 99), "ratio-p99-to-bare")
	b.ReportMetric(st.pct("freeze-written", 99)/1000, "ms-p99-gpud-part")
	b.ReportMetric(st.pct("freeze-written", 99)/1000, "ratio-gpud-part-p99-to-1ms-goal")
	b.ReportMetric(percentile(floor, 50), "µs-p50-bare")
	b.ReportMetric(percentile(recorded, 50), "µs-p50-decision-to-frozen")
	b.ReportMetric(percentile(recorded, 99), "µs-p99-decision-to-frozen")
	b.ReportMetric(percentile(frozen, 50), "µs-p50-open-to-frozen")
	b.ReportMetric(percentile(frozen, 99), "µs-p99-open-to-frozen")
	// The same, end to end and seen by the same observer, for the bare
	// program's trials: open → frozen, gpud / bare.
	b.ReportMetric(percentile(bareFrozen, 99), "µs-p99-open-to-frozen-bare")
	b.ReportMetric(percentile(frozen, 99)/percentile(bareFrozen, 99), "ratio-open-to-frozen-p99-to-bare")
	b.ReportMetric(percentile(bareFrozen, 50), "µs-p50-open-to-frozen-bare")
	b.ReportMetric(percentile(bareWritten, 50), "µs-p50-open-to-freeze-written-bare")
	b.ReportMetric(percentile(bareWritten, 99), "µs-p99-open-to-freeze-written-bare")
	b.ReportMetric(percentile(frozen, 50)/percentile(killed, 50), "ratio-p50-to-kill")
	b.ReportMetric(percentile(frozen, 99)/percentile(killed, 99), "ratio-p99-to-kill")
	b.ReportMetric(percentile(recorded, 99)/5000, "ratio-p99-to-5ms-goal")
	// gpud's part: the open → cgroup.freeze written.
	b.ReportMetric(st.pct("freeze-written", 50), "µs-p50-open-to-freeze-written")
	b.ReportMetric(st.pct("freeze-written", 99), "µs-p99-open-to-freeze-written")
}

// freezeTrials runs n high-over-low preemptions of one workload's two
// low holders in freeze mode, each thawed before the next (the same
// processes throughout), and returns open → frozen as seen in
// cgroup.events, and decision → frozen as gpud recorded it, in µs.
//
// With bare, each gpud trial is paired with a bare trial (in turn before
// and after it), which freezes the same cgroup in the same conditions: a
// new process of the high-priority workload opens a FIFO (not a GPU:
// gpud takes no decision and reads no event) that the bare program waits
// to open for reading, which wakes it at SCHED_FIFO 1 as the gate's event
// wakes gpud's event thread; it writes the freeze and waits for
// cgroup.events as gpud does, while the opener returns from its open and
// the benchmark waits for frozen 1 as in gpud's trials. floor is its
// write → frozen, bareFrozen the open → frozen the benchmark saw,
// bareWritten the open → its write (gpud's part's counterpart). Not an
// open of the other GPU: gpud's event thread would then identify that
// holder (reads of /proc at SCHED_FIFO) while the bare program's victims
// freeze, which it does after its own freeze, not during it. Why not the
// bare freeze after gpud's thaw, as before: it then ran at a calmer
// moment than gpud's (no opener returning from its open, no benchmark
// polling cgroup.events), and at normal priority, so that its figure was
// its own wakeups behind the CPU hogs as much as the kernel's freeze: the
// ratio of the p99s moved 0.87–3.2 between loaded runs of the same code.
// With this floor, gpud's written → frozen and the bare program's write →
// frozen agree (p50 ~0.1 ms both), and the ratio is gpud's own part.
func freezeTrials(b *testing.B, d *benchDaemon, gpus []string, prefix string, trials int, bare *bareProg, st ...*steps) (frozen, recorded, floor, bareFrozen, bareWritten []float64) {
	b.Helper()
	hdir, hid := testutil.Cgroup(b, prefix+"high")
	ldir, lid := testutil.Cgroup(b, prefix+"low")
	d.d.Registry().Put(workload.Workload{CgroupID: hid, Priority: occupancy.High, TaskID: "bench-high"})
	d.d.Registry().Put(workload.Workload{CgroupID: lid, Priority: occupancy.Low, TaskID: "bench-low"})
	var lowPID int
	for j := 0; j < 2; j++ {
		l := startHelper(b)
		testutil.JoinCgroup(b, ldir, l.pid())
		l.do("open %s", gpus[0])
		lowPID = l.pid()
	}
	testutil.Eventually(b, 5*time.Second, "two low holders", func() bool { return d.d.Ledger().Counts()[0].Low == 2 })
	// The freezer gpud uses for these victims, for the bare program.
	v2root, _, err := cgroups.V2Root()
	if err != nil {
		b.Fatal(err)
	}
	fz, err := cgroups.WorkloadFreezer("/proc", v2root, lowPID, lid)
	if err != nil {
		b.Fatal(err)
	}
	bareFreeze := "freeze " + fz.Path
	if fz.Kind == cgroups.FreezerV1 {
		bareFreeze = "freezev1 " + fz.Path
	}
	fz.Close()
	events := filepath.Join(ldir, "cgroup.events")
	isFrozen := func() bool {
		s, _ := os.ReadFile(events)
		return strings.Contains(string(s), "frozen 1")
	}
	// Waited for on cgroup.events' notification, read again every 1 ms
	// as the kernel holds a notification back up to 10 ms after the last
	// one, not by reading it in a loop: a spinning observer in gpud's own
	// process took a CPU of two from gpud (the event read's p90 was 3.8 ms
	// with it). Not every 50 µs (as gpud and the bare program wait): the
	// observer's wakeups compete with the victims, which must run to
	// freeze, and they fall on gpud's freeze (written 0.4 ms after the
	// open, when the observer is polling) more than on the bare program's
	// (written tens of µs after it, before the opener's answer reaches
	// the benchmark).
	evf, err := os.Open(events)
	if err != nil {
		b.Fatal(err)
	}
	defer evf.Close()
	waitFrozen := func(deadline time.Time) bool {
		buf := make([]byte, 256)
		for {
			n, _ := unix.Pread(int(evf.Fd()), buf, 0)
			if strings.Contains(string(buf[:n]), "frozen 1") {
				return true
			}
			if time.Now().After(deadline) {
				return false
			}
			ts := unix.NsecToTimespec(time.Millisecond.Nanoseconds())
			unix.Ppoll([]unix.PollFd{{Fd: int32(evf.Fd()), Events: unix.POLLPRI}}, &ts, nil)
		}
	}
	// The journal keeps its last 50 records: this trial's freeze is the
	// one made after it started.
	freezeSince := func(t time.Time) (float64, bool) {
		for _, r := range d.d.Journal().Recent() {
			if r.Action == "freeze" && !r.Time.Before(t) {
				return r.LatencyMS * 1000, true
			}
		}
		return 0, false
	}
	// openFrozen: a new process of the high workload (which exits after
	// its trial, see preemptTrials) opens path; the open and when the
	// benchmark saw the cgroup frozen (CLOCK_MONOTONIC ns).
	openFrozen := func(what string, i int, path string) (high *helper, t0, end uint64) {
		high = startHelper(b)
		testutil.JoinCgroup(b, hdir, high.pid())
		time.Sleep(2 * time.Millisecond) // the gate knows the low holders
		fmt.Sscan(high.do("opentimed %s", path), &t0)
		if !waitFrozen(time.Now().Add(5 * time.Second)) {
			b.Fatalf("%s trial %d: never frozen", what, i)
		}
		return high, t0, bpf.MonotonicNow()
	}
	gpudTrial := func(i int) {
		start := time.Now()
		high, t0, end := openFrozen("gpud", i, gpus[0])
		frozen = append(frozen, float64(end-t0)/1e3)
		for _, s := range st {
			s.trial(t0, end)
		}
		high.cmd.Process.Kill()
		high.cmd.Wait()
		testutil.Eventually(b, 5*time.Second, "thawed", func() bool { return !isFrozen() })
		testutil.Eventually(b, 5*time.Second, "recorded", func() bool { _, ok := freezeSince(start); return ok })
		ms, _ := freezeSince(start)
		recorded = append(recorded, ms)
	}
	trigger := filepath.Join(b.TempDir(), "trigger")
	if err := unix.Mkfifo(trigger, 0o644); err != nil {
		b.Fatal(err)
	}
	bareTrial := func(i int) {
		bare.do(b, "onopen %s %s", trigger, bareFreeze)
		high, t0, end := openFrozen("bare", i, trigger)
		us, written := bare.next(b, bareFreeze)
		floor = append(floor, us)
		bareFrozen = append(bareFrozen, float64(end-t0)/1e3)
		bareWritten = append(bareWritten, (float64(written)-float64(t0))/1e3)
		bare.do(b, "thaw %s", fz.Path)
		high.cmd.Process.Kill()
		high.cmd.Wait()
	}
	for i := 0; i < trials; i++ {
		switch {
		case bare == nil:
			gpudTrial(i)
		case i%2 == 0:
			gpudTrial(i)
			bareTrial(i)
		default:
			bareTrial(i)
			gpudTrial(i)
		}
	}
	return frozen, recorded, floor, bareFrozen, bareWritten
}

// steps collects, per trial, when a preemption reached each of its steps
// (preempt.Hooks.Step), to say where the time goes: gpud's part (open →
// signals sent, or → freeze written) is reported apart from the victims'
// (their exit, their freeze). With GPUD_BENCH_STEPS set, each latency
// benchmark also prints every step's p50/p90/p99 from the open and the
// slowest trials step by step.
type steps struct {
	mu     sync.Mutex
	order  []string
	cur    map[string]uint64
	trials []map[string]uint64
}

func traceSteps(b *testing.B) *steps {
	s := &steps{cur: map[string]uint64{}}
	preempt.SetHooks(&preempt.Hooks{Step: func(step string, mono uint64) {
		s.mu.Lock()
		defer s.mu.Unlock()
		// The latest wins: a step reached after a trial ended (its
		// executor's last ones) is overwritten by the next trial's.
		s.cur[step] = mono
		if !slices.Contains(s.order, step) {
			s.order = append(s.order, step)
		}
	}})
	b.Cleanup(func() {
		preempt.SetHooks(nil)
		if os.Getenv("GPUD_BENCH_STEPS") != "" {
			s.report(b)
		}
	})
	return s
}

// pct is the p-th percentile of step's time from the open, in µs, over the
// trials that saw it.
func (s *steps) pct(step string, p float64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var xs []float64
	for _, t := range s.trials {
		if v, ok := t[step]; ok && v >= t["open"] {
			xs = append(xs, (float64(v)-float64(t["open"]))/1e3)
		}
	}
	if len(xs) == 0 {
		return 0
	}
	return percentile(xs, p)
}

// trial ends one trial: t0 is the open, end what the benchmark measured.
func (s *steps) trial(t0, end uint64) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur["open"], s.cur["end"] = t0, end
	s.trials = append(s.trials, s.cur)
	s.cur = map[string]uint64{}
}

func (s *steps) report(b *testing.B) {
	s.mu.Lock()
	defer s.mu.Unlock()
	order := append(append([]string{"open"}, s.order...), "end")
	var lines []string
	for i, st := range order {
		var xs, ds []float64
		for _, t := range s.trials {
			if v, ok := t[st]; ok && v >= t["open"] {
				xs = append(xs, (float64(v)-float64(t["open"]))/1e3)
				// What this step took after the one listed before it.
				if p, ok := t[order[max(i-1, 0)]]; ok && v >= p {
					ds = append(ds, (float64(v)-float64(p))/1e3)
				}
			}
		}
		if len(xs) > 0 {
			line := fmt.Sprintf("%-15s n=%3d p50 %8.0f µs  p90 %8.0f  p99 %8.0f", st, len(xs), percentile(xs, 50), percentile(xs, 90), percentile(xs, 99))
			if len(ds) > 0 && i > 0 {
				line += fmt.Sprintf("   after %s: p50 %6.0f  p99 %6.0f", order[i-1], percentile(ds, 50), percentile(ds, 99))
			}
			lines = append(lines, line)
		}
	}
	sorted := slices.Clone(s.trials)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i]["end"]-sorted[i]["open"] > sorted[j]["end"]-sorted[j]["open"] })
	for _, t := range sorted[:min(5, len(sorted))] {
		line := "slow trial:"
		for _, st := range order {
			if v, ok := t[st]; ok && v >= t["open"] {
				line += fmt.Sprintf(" %s %.0f", st, (float64(v)-float64(t["open"]))/1e3)
			}
		}
		lines = append(lines, line)
	}
	// Not b.Logf: a benchmark's log is cut at ten lines.
	fmt.Fprintf(os.Stderr, "%s: steps from the open (µs):\n%s\n", b.Name(), strings.Join(lines, "\n"))
}
