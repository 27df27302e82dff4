package daemon_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

type interval struct{ a, b uint64 }

func readIntervals(tb testing.TB, path string) []interval {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []interval
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var iv interval
		if _, err := fmt.Sscan(sc.Text(), &iv.a, &iv.b); err == nil {
			out = append(out, iv)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].a < out[j].a })
	return out
}

// raceViolations counts low-priority opens that succeeded entirely while a
// high holder held the GPU: started after its open returned and returned
// before its close began. (An open that started inside the window but
// returned after the close may have been decided after the close: on 2
// CPUs a thread is often preempted between reading the clock and entering
// the kernel.)
func raceViolations(high, low []interval) int {
	n := 0
	for _, l := range low {
		// the last high interval that started at or before l.a
		i := sort.Search(len(high), func(i int) bool { return high[i].a > l.a }) - 1
		if i >= 0 && l.a <= high[i].b && l.b <= high[i].b {
			n++
			if os.Getenv("GPUD_RACE_DEBUG") != "" {
				fmt.Printf("violation: low [%d, %d] in high [%d, %d]: low started %d ns after the high open returned, %d ns before its close\n",
					l.a, l.b, high[i].a, high[i].b, l.a-high[i].a, high[i].b-l.a)
			}
		}
	}
	return n
}

// runRace runs `attempts` low-priority opens against a high-priority
// open/hold/close loop, and returns (violations, low successes, denials).
func runRace(tb testing.TB, d interface {
	Registry() *workload.Registry
	Monitor() *bpf.Monitor
}, gpu string, attempts int) (int, int, int) {
	hdir, hid := testutil.Cgroup(tb, "high")
	ldir, lid := testutil.Cgroup(tb, "low")
	// The high class is known to user space (its holders count in the
	// gate's policy); the low class only to the kernel gate, so that the
	// row-1 preemption never kills the low prober: this measures the deny.
	d.Registry().Put(workload.Workload{CgroupID: hid, Priority: occupancy.High, TaskID: "race-high"})
	if err := d.Monitor().SetCgroupPriority(lid, bpf.PrioLow); err != nil {
		tb.Fatal(err)
	}
	hi, lo := startHelper(tb), startHelper(tb)
	testutil.JoinCgroup(tb, hdir, hi.pid())
	testutil.JoinCgroup(tb, ldir, lo.pid())
	dir := tb.TempDir()
	hout, lout := filepath.Join(dir, "high"), filepath.Join(dir, "low")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); hi.do("highrace %s %d %s", gpu, 3000+attempts/50, hout) }()
	time.Sleep(50 * time.Millisecond)
	var ok, denied int
	fmt.Sscan(lo.do("lowrace %s %d %s", gpu, attempts, lout), &ok, &denied)
	wg.Wait()
	return raceViolations(readIntervals(tb, hout), readIntervals(tb, lout)), ok, denied
}

func TestGateRaceLowNeverWhileHigh(t *testing.T) {
	e := newEnv(t)
	e.cfg.Enforce = true
	e.cfg.DockerHost = "none"
	e.cfg.Reclaim = "none"
	e.start()
	const attempts = 100000
	bad, ok, denied := runRace(t, e.d, e.gpus[0].Path, attempts)
	t.Logf("%d low opens: %d succeeded, %d refused, %d succeeded while a high holder existed", attempts, ok, denied, bad)
	if bad != 0 {
		t.Fatalf("%d low-priority opens succeeded while a high-priority holder existed", bad)
	}
	if denied < attempts/100 || ok == 0 {
		t.Fatalf("the race did not race: %d refused, %d succeeded", denied, ok)
	}
}
