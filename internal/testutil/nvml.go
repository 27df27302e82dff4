package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// NVMLGPU is one GPU as the NVML double answers for it.
type NVMLGPU struct {
	Index       int // NVML's index: need not follow Minor, as on real nodes
	Minor       int // N of /dev/nvidiaN
	UUID        string
	Name        string
	MemoryTotal uint64
	MemoryUsed  uint64 // 0: the sum of its processes' memory
	MIG         bool
	Lost        bool // fallen off the bus: calls answer GPU_IS_LOST
	// PCI is its PCI address (0000:3b:00.0); "" is 0000:<Index+1>:00.0.
	PCI string
	// NVLinks are its NVLinks: each link's remote end's PCI address (a
	// peer GPU's PCI, or an NVSwitch's), "" for a link that is down. None:
	// a GPU without NVLink (NVML_ERROR_NOT_SUPPORTED).
	NVLinks []string
}

// NVMLProcess is a process using a GPU's memory.
type NVMLProcess struct {
	GPU      int // NVML index
	PID      int
	Memory   uint64
	MemoryNA bool // usedGpuMemory is NVML_VALUE_NOT_AVAILABLE
	// Work: fake GPU work, whose utilization samples follow the CPU time
	// the process gets (StartGPUWork; docs/real-gpu.md).
	Work bool
}

// NVMLDouble is the NVML test double (internal/nvidia/nvmldouble), built
// as libnvidia-ml.so.1 and scripted by the test while gpud runs.
type NVMLDouble struct {
	Dir     string // the library's directory
	Library string // its path: what --nvml-library names

	mu        sync.Mutex
	driver    string
	gpus      []NVMLGPU
	processes []NVMLProcess
	samples   []string
	events    []string
	seq       int
	mismatch  bool
	faults    []string  // eventerr and slow records
	migs      []NVMLMIG // MIG devices (mig.go)
}

var nvmlBuild struct {
	once sync.Once
	lib  []byte
	err  error
}

// BuildNVMLDouble compiles the double once per test binary and returns the
// shared library's bytes.
func BuildNVMLDouble(tb testing.TB) []byte {
	tb.Helper()
	nvmlBuild.once.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		src := filepath.Join(filepath.Dir(file), "..", "nvidia", "nvmldouble", "nvmldouble.c")
		dir, err := os.MkdirTemp("", "nvmldouble")
		if err != nil {
			nvmlBuild.err = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "libnvidia-ml.so.1")
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "gcc"
		}
		cmd := exec.Command(cc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", out, src,
			// Like NVIDIA's library, it needs glibc's libm: an image
			// without it cannot load NVML.
			"-Wl,--no-as-needed", "-lm", "-lpthread")
		if b, err := cmd.CombinedOutput(); err != nil {
			nvmlBuild.err = fmt.Errorf("building the NVML double: %w\n%s", err, b)
			return
		}
		nvmlBuild.lib, nvmlBuild.err = os.ReadFile(out)
	})
	if nvmlBuild.err != nil {
		tb.Fatal(nvmlBuild.err)
	}
	return nvmlBuild.lib
}

// NewNVMLDouble installs the double in dir (a driver root's library
// directory: root-owned, as gpud requires) with gpus, and writes its
// script. dir "" is this test process's own directory: a process keeps the
// first NVML it loads (its calls stay bound to it), and the double reads
// the script next to the file it was loaded from, so every test of one
// binary that loads it in-process must use the same directory.
func NewNVMLDouble(tb testing.TB, dir string, gpus ...NVMLGPU) *NVMLDouble {
	tb.Helper()
	lib := BuildNVMLDouble(tb)
	if dir == "" {
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("gpud-nvml-double-%d", os.Getpid()))
		tb.Cleanup(func() { os.RemoveAll(dir) })
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	n := &NVMLDouble{Dir: dir, Library: filepath.Join(dir, "libnvidia-ml.so.1"), driver: "570.86.15", gpus: gpus}
	// A new file renamed into place: rewriting a library a process has
	// mapped would crash it.
	tmp := n.Library + ".tmp"
	if err := os.WriteFile(tmp, lib, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, n.Library); err != nil {
		tb.Fatal(err)
	}
	n.write(tb)
	return n
}

// SetGPUs replaces the GPUs.
func (n *NVMLDouble) SetGPUs(tb testing.TB, gpus ...NVMLGPU) {
	n.mu.Lock()
	n.gpus = gpus
	n.mu.Unlock()
	n.write(tb)
}

// Update changes GPU index's description.
func (n *NVMLDouble) Update(tb testing.TB, index int, f func(*NVMLGPU)) {
	n.mu.Lock()
	for i := range n.gpus {
		if n.gpus[i].Index == index {
			f(&n.gpus[i])
		}
	}
	n.mu.Unlock()
	n.write(tb)
}

// SetProcesses replaces the processes using GPU memory.
func (n *NVMLDouble) SetProcesses(tb testing.TB, ps ...NVMLProcess) {
	n.mu.Lock()
	n.processes = ps
	n.mu.Unlock()
	n.write(tb)
}

// Compute adds a utilization sample, stamped now, of pid on GPU index.
func (n *NVMLDouble) Compute(tb testing.TB, index, pid int, sm int) {
	n.mu.Lock()
	n.samples = append(n.samples, fmt.Sprintf("sample gpu=%d pid=%d ts=%d sm=%d mem=%d", index, pid, time.Now().UnixMicro(), sm, sm/2))
	if len(n.samples) > 200 { // the double keeps 256
		n.samples = n.samples[len(n.samples)-200:]
	}
	n.mu.Unlock()
	n.write(tb)
}

// SetMismatch makes nvmlInit_v2 fail with NVML_ERROR_LIB_RM_VERSION_MISMATCH
// (a driver upgraded under the node) while on.
func (n *NVMLDouble) SetMismatch(tb testing.TB, on bool) {
	n.mu.Lock()
	n.mismatch = on
	n.mu.Unlock()
	n.write(tb)
}

// nvmlFaultID numbers EventErr records across the whole test process: the
// double counts a record's failed waits by its id in the loaded library,
// which a process keeps (and its counts) from one test, or one -count run,
// to the next, so an id a later double reused would be spent already.
var nvmlFaultID atomic.Uint64

// EventErr makes the next count nvmlEventSetWait_v2 calls answer code
// ("timeout", "unknown", "gpu_is_lost"), naming GPU index (NVML's; -1:
// none) in the event data.
func (n *NVMLDouble) EventErr(tb testing.TB, code string, index, count int) {
	id := nvmlFaultID.Add(1)
	n.mu.Lock()
	n.faults = append(n.faults, fmt.Sprintf("eventerr id=%d code=%s gpu=%d count=%d", id, code, index, count))
	n.mu.Unlock()
	n.write(tb)
}

// ClearFaults drops every EventErr and Slow: each process that loads the
// double counts an EventErr's waits anew, so a gpud started later would
// meet it again.
func (n *NVMLDouble) ClearFaults(tb testing.TB) {
	n.mu.Lock()
	n.faults = nil
	n.mu.Unlock()
	n.write(tb)
}

// Slow makes NVML function fn sleep ms on GPU index (NVML's; -1: every
// GPU, and calls of no GPU).
func (n *NVMLDouble) Slow(tb testing.TB, fn string, index, ms int) {
	n.mu.Lock()
	n.faults = append(n.faults, fmt.Sprintf("slow fn=%s ms=%d gpu=%d", fn, ms, index))
	n.mu.Unlock()
	n.write(tb)
}

// XID adds an XID critical error event on GPU index.
func (n *NVMLDouble) XID(tb testing.TB, index, xid int) { n.event(tb, index, "xid", xid) }

// DoubleBitECC adds a double-bit ECC error event on GPU index.
func (n *NVMLDouble) DoubleBitECC(tb testing.TB, index int) { n.event(tb, index, "dbe", 0) }

func (n *NVMLDouble) event(tb testing.TB, index int, typ string, data int) {
	n.mu.Lock()
	n.seq++
	n.events = append(n.events, fmt.Sprintf("event gpu=%d seq=%d type=%s data=%d", index, n.seq, typ, data))
	n.mu.Unlock()
	n.write(tb)
}

// write replaces the script in one rename: the double never reads half.
// The lock is held to the rename: two goroutines scripting the double at
// once (a test and its sample feeder) would otherwise share the temporary
// file, and an older script could be renamed over a newer one.
func (n *NVMLDouble) write(tb testing.TB) {
	tb.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "driver version=%s mismatch=%d\n", n.driver, b2i(n.mismatch))
	for _, g := range n.gpus {
		fmt.Fprintf(&b, "gpu index=%d minor=%d memory_total=%d mig=%d lost=%d", g.Index, g.Minor, g.MemoryTotal, b2i(g.MIG), b2i(g.Lost))
		if g.UUID != "" {
			fmt.Fprintf(&b, " uuid=%s", g.UUID)
		}
		if g.Name != "" {
			fmt.Fprintf(&b, " name=%s", strings.ReplaceAll(g.Name, " ", "_"))
		}
		if g.MemoryUsed != 0 {
			fmt.Fprintf(&b, " memory_used=%d", g.MemoryUsed)
		}
		if g.PCI != "" {
			fmt.Fprintf(&b, " pci=%s", g.PCI)
		}
		fmt.Fprintf(&b, " nvlinks=%d\n", len(g.NVLinks))
		for l, remote := range g.NVLinks {
			if remote != "" {
				fmt.Fprintf(&b, "nvlink gpu=%d link=%d remote=%s\n", g.Index, l, remote)
			}
		}
	}
	for _, p := range n.processes {
		mem := fmt.Sprint(p.Memory)
		if p.MemoryNA {
			mem = "na"
		}
		fmt.Fprintf(&b, "process gpu=%d pid=%d memory=%s work=%d\n", p.GPU, p.PID, mem, b2i(p.Work))
	}
	for _, m := range n.migs {
		fmt.Fprintf(&b, "mig gpu=%d gi=%d ci=%d uuid=%s profile=%s memory_total=%d\n", m.GPU, m.GI, m.CI, m.UUID, m.Profile, m.MemoryTotal)
	}
	for _, f := range n.faults {
		b.WriteString(f + "\n")
	}
	for _, s := range n.samples {
		b.WriteString(s + "\n")
	}
	for _, e := range n.events {
		b.WriteString(e + "\n")
	}
	tmp := filepath.Join(n.Dir, ".nvml-double.txt.tmp")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(n.Dir, "nvml-double.txt")); err != nil {
		tb.Fatal(err)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
