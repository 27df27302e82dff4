package gpumon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// fake is NVML as the test scripts it: per GPU, what each source answers,
// how long a sample takes, and what the health watch returns.
type fake struct {
	mu       sync.Mutex
	initErr  error
	missing  map[int]error
	unknown  []int
	mig      map[int]bool
	failing  map[int]map[Source]error
	lost     map[int]bool
	slow     map[int]time.Duration
	samples  map[int]int // calls per GPU
	asked    map[int][]Source
	activity map[int]time.Time
	shares   map[int]map[uint32]uint32 // per-process utilization (SrcShares)
	watchErr []error                   // returned by successive WatchHealth calls; then it blocks
	watches  int
	events   []HealthEvent // reported by the next watch
}

func newFake() *fake {
	return &fake{missing: map[int]error{}, mig: map[int]bool{}, failing: map[int]map[Source]error{}, lost: map[int]bool{},
		slow: map[int]time.Duration{}, samples: map[int]int{}, asked: map[int][]Source{}, activity: map[int]time.Time{}}
}

func (f *fake) Init() error { f.mu.Lock(); defer f.mu.Unlock(); return f.initErr }
func (f *fake) Annotate(gpus []occupancy.GPU) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unknown
}
func (f *fake) Missing() map[int]error {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int]error{}
	for k, v := range f.missing {
		out[k] = v
	}
	return out
}
func (f *fake) SampleGPU(gpu int, src Source) Reading {
	f.mu.Lock()
	d := f.slow[gpu]
	f.mu.Unlock()
	time.Sleep(d)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.samples[gpu]++
	f.asked[gpu] = append(f.asked[gpu], src)
	r := Reading{Failed: map[Source]error{}, MIG: f.mig[gpu], Lost: f.lost[gpu], Memory: &Memory{Total: 100, Used: 10}}
	if at, ok := f.activity[gpu]; ok {
		r.At, r.PIDs = at, []uint32{42}
	}
	if sh, ok := f.shares[gpu]; ok && src&SrcShares != 0 {
		r.Shares, r.SharesAt = maps.Clone(sh), time.Now()
	}
	for s, err := range f.failing[gpu] {
		if src&s != 0 {
			r.Failed[s] = err
		}
	}
	return r
}
func (f *fake) WatchHealth(ctx context.Context, report func(HealthEvent)) error {
	f.mu.Lock()
	f.watches++
	var err error
	if len(f.watchErr) > 0 {
		err, f.watchErr = f.watchErr[0], f.watchErr[1:]
	}
	if err != nil {
		f.mu.Unlock()
		return err
	}
	evs := f.events
	f.events = nil
	f.mu.Unlock()
	for _, e := range evs {
		report(e)
	}
	<-ctx.Done()
	return nil
}
func (f *fake) Info() Info { return Info{Library: "fake", DriverVersion: "1"} }
func (f *fake) Shutdown()  {}

func (f *fake) set(fn func(f *fake)) { f.mu.Lock(); fn(f); f.mu.Unlock() }

func gpus(n int) []occupancy.GPU {
	var out []occupancy.GPU
	for i := 0; i < n; i++ {
		out = append(out, occupancy.GPU{Index: i, Device: fmt.Sprintf("/dev/nvidia%d", i), Minor: uint32(i)})
	}
	return out
}

func run(t *testing.T, m *Monitor, all []occupancy.GPU) (*occupancy.Ledger, []occupancy.GPU) {
	t.Helper()
	managed := m.Open(all)
	l := occupancy.NewLedger(managed, time.Hour)
	m.Start(l)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l, managed
}

func state(m *Monitor, managed []occupancy.GPU) v1.StateFile {
	var f v1.StateFile
	for _, g := range managed {
		f.GPUs = append(f.GPUs, v1.StateGPU{Index: g.Index})
	}
	m.Decorate(&f)
	return f
}

func fast(lib NVML) *Monitor {
	return &Monitor{Lib: lib, Interval: 20 * time.Millisecond, RetryMin: 50 * time.Millisecond, RetryMax: 400 * time.Millisecond}
}

// Per-process utilization NOT_SUPPORTED on one GPU (as on a MIG-enabled
// GPU) turns compute activity off for that GPU only: its state says so,
// the other GPU's activity is still NVML's, and the source is retried with
// backoff, not every sample.
func TestUtilizationNotSupportedDegradesOneGPU(t *testing.T) {
	f := newFake()
	f.failing[1] = map[Source]error{SrcUtilization: fmt.Errorf("utilization of GPU 1: %w", ErrNotSupported)}
	m := fast(f)
	_, managed := run(t, m, gpus(2))
	testutil.Eventually(t, 5*time.Second, "GPU 1 degraded, GPU 0 on NVML", func() bool {
		st := state(m, managed)
		return st.GPUs[0].NVML.State == StateOK && st.GPUs[0].NVML.ActivitySource == "nvml" &&
			st.GPUs[1].NVML.State == StateDegraded && st.GPUs[1].NVML.ActivitySource == "opens"
	})
	st := state(m, managed)
	if st.ActivitySource != "mixed" || len(st.GPUs[1].NVML.Failing) != 1 || st.GPUs[1].NVML.Failing[0].Source != "utilization" {
		t.Errorf("state = %s, %+v; want mixed, GPU 1 failing utilization", st.ActivitySource, st.GPUs[1].NVML)
	}
	time.Sleep(time.Second)
	f.mu.Lock()
	defer f.mu.Unlock()
	utilAsked := 0
	for _, s := range f.asked[1] {
		if s&SrcUtilization != 0 {
			utilAsked++
		}
	}
	// 50 samples in a second at 20 ms; backoff 50, 100, 200, 400, 400 ms.
	if utilAsked > 8 || f.samples[1] < 20 {
		t.Errorf("GPU 1: utilization asked %d times in %d samples, want backoff (few) while memory goes on", utilAsked, f.samples[1])
	}
}

// A GPU lost at start (NVML could not reach it at Init) leaves the others
// managed with NVML: it is unhealthy, shown lost with its reason; NVML is
// asked again for it with backoff, and its answering starts gpud again.
func TestLostAtStartDegradesOneGPU(t *testing.T) {
	f := newFake()
	f.unknown = []int{1}
	f.missing[3] = fmt.Errorf("device 3: %w", ErrGPUIsLost)
	m := fast(f)
	l, managed := run(t, m, gpus(2))
	if len(managed) != 2 || !m.Loaded() {
		t.Fatalf("managed %d GPUs, NVML loaded %v; want both, loaded", len(managed), m.Loaded())
	}
	snap := l.Snapshot(time.Now())
	if h := snap.GPUs[1].Health; !h.Unhealthy || h.Reason == "" {
		t.Errorf("GPU 1 health = %+v, want unhealthy (lost)", h)
	}
	if h := snap.GPUs[0].Health; h.Unhealthy {
		t.Errorf("GPU 0 health = %+v, want healthy", h)
	}
	testutil.Eventually(t, 5*time.Second, "GPU 0 sampled", func() bool {
		return l.Snapshot(time.Now()).GPUs[0].Memory != nil
	})
	st := state(m, managed)
	if n := st.GPUs[1].NVML; n.State != StateLost || n.Reason == "" {
		t.Errorf("GPU 1 nvml = %+v, want lost with a reason", n)
	}
	if n := st.GPUs[0].NVML; n.State != StateOK {
		t.Errorf("GPU 0 nvml = %+v, want ok", n)
	}
	if m.Restart() {
		t.Fatal("restart while the GPU is still lost")
	}
	f.set(func(f *fake) { delete(f.missing, 3) })
	testutil.Eventually(t, 5*time.Second, "a restart once the lost GPU answers", m.Restart)
}

// A GPU lost while sampled: that GPU is unhealthy and lost, the other
// keeps being read.
func TestLostLaterDegradesOneGPU(t *testing.T) {
	f := newFake()
	m := fast(f)
	l, managed := run(t, m, gpus(2))
	f.set(func(f *fake) { f.lost[0] = true })
	testutil.Eventually(t, 5*time.Second, "GPU 0 lost", func() bool {
		return l.Snapshot(time.Now()).GPUs[0].Health.Unhealthy && state(m, managed).GPUs[0].NVML.State == StateLost
	})
	if st := state(m, managed); st.GPUs[1].NVML.State != StateOK || l.Snapshot(time.Now()).GPUs[1].Health.Unhealthy {
		t.Errorf("GPU 1 = %+v, want ok and healthy", st.GPUs[1].NVML)
	}
}

// One slow GPU (each call 2 s, as on a loaded node) delays no other GPU's
// samples.
func TestSlowGPUDelaysNoOther(t *testing.T) {
	f := newFake()
	f.slow[0] = 2 * time.Second
	m := fast(f)
	l, _ := run(t, m, gpus(2))
	start := time.Now()
	f.set(func(f *fake) { f.activity[1] = time.Now() })
	testutil.Eventually(t, 5*time.Second, "GPU 1's activity", func() bool {
		return !l.Snapshot(time.Now()).GPUs[1].LastActive.IsZero()
	})
	if d := time.Since(start); d > time.Second {
		t.Errorf("GPU 1's sample took %v behind GPU 0's slow calls", d)
	}
}

// The health watch survives its failures: each is retried with backoff,
// shown on every GPU meanwhile, and the events of the next watch still
// reach the ledger.
func TestHealthWatchSurvivesErrors(t *testing.T) {
	f := newFake()
	f.watchErr = []error{errors.New("waiting for events: Unknown Error"), errors.New("waiting for events: Unknown Error")}
	f.events = []HealthEvent{{GPU: 1, Kind: "xid", XID: 79, Critical: true}}
	m := fast(f)
	m.RetryMin = 300 * time.Millisecond // the failure stays shown a while
	l, managed := run(t, m, gpus(2))
	testutil.Eventually(t, 5*time.Second, "events failing shown", func() bool {
		for _, fl := range state(m, managed).GPUs[0].NVML.Failing {
			if fl.Source == "events" {
				return true
			}
		}
		return false
	})
	testutil.Eventually(t, 5*time.Second, "XID 79 after the watch failed twice", func() bool {
		return l.Snapshot(time.Now()).GPUs[1].Health.Reason == "XID 79"
	})
	testutil.Eventually(t, 5*time.Second, "events watched again", func() bool {
		return state(m, managed).GPUs[0].NVML.State == StateOK
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.watches < 3 {
		t.Errorf("%d watches, want 3 (two failed)", f.watches)
	}
}

// NVML failing entirely at start (a library/driver version mismatch):
// every GPU managed on opens, shown degraded; Init retried with backoff,
// and gpud starts again once it loads.
func TestInitRetriedWithBackoff(t *testing.T) {
	f := newFake()
	f.initErr = errors.New("init: RM has detected an NVML/RM version mismatch.")
	m := fast(f)
	_, managed := run(t, m, gpus(2))
	if len(managed) != 2 || m.Loaded() {
		t.Fatalf("managed %d, loaded %v", len(managed), m.Loaded())
	}
	st := state(m, managed)
	if st.NVML == nil || st.NVML.Error == "" || st.GPUs[0].NVML.State != StateDegraded || st.ActivitySource != "opens" {
		t.Errorf("state = %+v %+v", st.NVML, st.GPUs[0].NVML)
	}
	time.Sleep(300 * time.Millisecond)
	if m.Restart() {
		t.Fatal("restart while Init fails")
	}
	f.set(func(f *fake) { f.initErr = nil })
	testutil.Eventually(t, 5*time.Second, "a restart once NVML loads", m.Restart)
}

// A GPU in MIG mode is left alone; its mode turning off starts gpud again.
func TestMIGLeftAloneAndChange(t *testing.T) {
	f := newFake()
	f.mig[1] = true
	m := fast(f)
	_, managed := run(t, m, gpus(2))
	if len(managed) != 1 || len(m.AllGPUs(managed)) != 2 {
		t.Fatalf("managed %v, all %v", managed, m.AllGPUs(managed))
	}
	f.set(func(f *fake) { f.mig[1] = false })
	testutil.Eventually(t, 5*time.Second, "a restart on MIG mode change", m.Restart)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.asked[1] {
		if s != SrcMIG {
			t.Fatalf("left-alone GPU asked %v, want MIG mode only", s)
		}
	}
}
