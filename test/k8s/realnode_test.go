//go:build k8s

package k8s

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

// realNodeUUID is the fake GPU's UUID, as NVML (the double) and the
// stand-in for NVIDIA's device plugin name it.
const realNodeUUID = "GPU-3f2b9c41-7d0e-4a55-9c1e-5b8d2f6a7e10"

// agent runs a root process on the host named like one of NVIDIA's
// agents (its comm is the executable's name, cut to 15 bytes), running
// script in bash with $GPU set. bash's builtins (read -t) keep it one
// process: no child inherits its GPU descriptor under another name.
func agent(t *testing.T, dir, name, gpu, script string) *exec.Cmd {
	t.Helper()
	exe := filepath.Join(dir, name)
	if _, err := os.Stat(exe); err != nil {
		b, err := os.ReadFile("/bin/bash")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(exe, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(exe, "-c", script)
	cmd.Env = append(os.Environ(), "GPU="+gpu)
	stdin, err := cmd.StdinPipe() // never written: read waits
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// hostState reads the state file gpud's pod writes under hostPaths.run.
func hostState(t *testing.T) *v1.StateFile {
	b, err := os.ReadFile(hostStateFile)
	if err != nil || stale(b) {
		return nil
	}
	var f v1.StateFile
	if json.Unmarshal(b, &f) != nil {
		return nil
	}
	return &f
}

func waitHostState(t *testing.T, d time.Duration, what string, ok func(*v1.StateFile) bool) *v1.StateFile {
	t.Helper()
	var last *v1.StateFile
	if !testutil.Poll(d, func() bool { last = hostState(t); return last != nil && len(last.GPUs) > 0 && ok(last) }) {
		b, _ := json.MarshalIndent(last, "", " ")
		t.Fatalf("%s: not within %s; state:\n%s", what, d, b)
	}
	return last
}

// The realistic node: NVIDIA's agents hold and probe the GPU, NVIDIA's
// device plugin names it by UUID (its node injected by CDI), and gpud runs in its pod from the chart
// with the host's driver root mounted, loading libnvidia-ml (the NVML
// double) from it. With --default-priority low: the agents are shown,
// never holders, never killed or refused; the owner's GPU goes idle and is
// lent (not while its free memory is below the floor); the owner's compute
// (an NVML sample, no open) takes it back, the borrower dead within 1.5 s
// of the sample; an XID makes the GPU unhealthy and not lendable; a GPU in
// MIG mode is left alone.
func TestRealNodeFixture(t *testing.T) {
	dev, gpu := fakeGPU(t)
	// A second GPU, in MIG mode (the numbers of /dev/full).
	if err := unix.Mknod(filepath.Join(dev, "nvidia1"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	double := testutil.NewNVMLDouble(t, filepath.Join(root, "usr/lib/x86_64-linux-gnu"),
		testutil.NVMLGPU{Index: 0, Minor: 229, UUID: realNodeUUID, Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 16 << 30},
		testutil.NVMLGPU{Index: 1, Minor: 7, UUID: "GPU-3f2b9c41-7d0e-4a55-9c1e-5b8d2f6a7e11", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 16 << 30, MIG: true})

	// NVIDIA's agents: the persistence daemon holds the GPU for good; GPU
	// Feature Discovery opens and closes it every second, counting.
	bin := t.TempDir()
	persistenced := agent(t, bin, "nvidia-persistenced", gpu, `exec 3<>"$GPU"; read`)
	probes := filepath.Join(bin, "probes")
	gfd := agent(t, bin, "gpu-feature-discovery", gpu,
		`n=0; while :; do if { exec 3<>"$GPU"; } 2>/dev/null; then exec 3>&-; n=$((n+1)); echo $n >`+probes+`.tmp; mv `+probes+`.tmp `+probes+`; fi; read -t 1; done`)
	// NVIDIA's device plugin on a CDI-native stack: devices by UUID, the
	// node injected by the runtime's CDI spec.
	writeCDISpec(t, realNodeUUID, gpu)
	startUUIDStandin(t, realNodeUUID)

	deployChart(t, dev, "devicePlugin.enabled=true", "hostPaths.podResources="+filepath.Join(env(t, "KUBELET_ROOT"), "pod-resources"),
		"hostPaths.driverRoot="+root, "gpud.idleAfter=3s", "gpud.defaultPriority=low", "devicePlugin.lendMinFreeMemory=4Gi",
		"devicePlugin.cdiSpecDirs={"+env(t, "CDI_SPEC_DIR")+"}")

	f := waitHostState(t, 30*time.Second, "NVML from the driver root, the agents shown", func(f *v1.StateFile) bool {
		return f.ActivitySource == "nvml" && len(f.GPUs[0].Agents) >= 1
	})
	if f.NVML == nil || f.NVML.Library != "/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" || f.GPUs[0].UUID != realNodeUUID {
		t.Errorf("nvml %+v uuid %q: want the driver root's library and the double's UUID", f.NVML, f.GPUs[0].UUID)
	}
	// The MIG GPU is left alone: not managed, shown.
	if len(f.GPUs) != 1 || len(f.LeftAlone) != 1 || f.LeftAlone[0].Device != "/host/dev/nvidia1" || !strings.Contains(f.LeftAlone[0].Reason, "MIG") {
		t.Errorf("gpus %d, left alone %+v: want the MIG GPU nvidia1 left alone", len(f.GPUs), f.LeftAlone)
	}
	if len(f.GPUs[0].Holders) != 0 || f.GPUs[0].State != v1.Free {
		t.Errorf("the agents hold the GPU: state %s, holders %+v; want free, no holder", f.GPUs[0].State, f.GPUs[0].Holders)
	}
	for _, a := range f.GPUs[0].Agents {
		if a.Comm != "nvidia-persiste" && a.Comm != "gpu-feature-dis" {
			t.Errorf("agent %+v is none of NVIDIA's", a)
		}
	}

	// The owner: a high-priority pod holding the GPU through nvidia.com/gpu
	// (device ID = UUID), its context keeping 13 GiB of 16.
	resourcePod(t, "rnowner", "nvidia.com/gpu", "gpud.io/priority", "high")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/rnowner", "--timeout=60s")
	holders := fileHolders(hostStateFile)
	ownerPID := hold(t, holders, "rnowner")
	double.SetProcesses(t, testutil.NVMLProcess{GPU: 0, PID: ownerPID, Memory: 13 << 30})

	f = waitHostState(t, 30*time.Second, "the owner idle, but 3 GiB free: not lendable", func(f *v1.StateFile) bool {
		g := f.GPUs[0]
		return g.State == v1.Idle && g.Lendable != nil && !*g.Lendable && strings.Contains(g.NotLendable, "below the floor")
	})
	if m := f.GPUs[0].Memory; m == nil || m.FreeBytes != 3<<30 {
		t.Errorf("memory %+v, want 3 GiB free", m)
	}
	if h := f.GPUs[0].Holders; len(h) != 1 || h[0].MemoryBytes == nil || *h[0].MemoryBytes != 13<<30 {
		t.Errorf("the owner's memory is not shown: %+v", h)
	}
	if a := allocatable(t, "gpud.io/idle-gpu"); a != "0" && a != "" {
		t.Errorf("allocatable gpud.io/idle-gpu = %s below the memory floor", a)
	}
	double.SetProcesses(t, testutil.NVMLProcess{GPU: 0, PID: ownerPID, Memory: 2 << 30})
	waitHostState(t, 30*time.Second, "the idle owner's GPU lendable", func(f *v1.StateFile) bool {
		return f.GPUs[0].Lendable != nil && *f.GPUs[0].Lendable
	})
	testutil.Eventually(t, 30*time.Second, "kubelet lists the idle GPU", func() bool { return allocatable(t, "gpud.io/idle-gpu") == "1" })
	// The agents' probes went on while a high pod held the GPU and gpud
	// classes every unlabelled process low: they are agents, not refused.
	before := count(probes)
	time.Sleep(2500 * time.Millisecond)
	if after := count(probes); after <= before {
		t.Errorf("GPU Feature Discovery's opens stopped (%d, then %d): refused?", before, after)
	}

	resourcePod(t, "rnborrower", "gpud.io/idle-gpu")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/rnborrower", "--timeout=60s")
	borrowerPID := hold(t, holders, "rnborrower")
	// The borrower's contract: the GPU by UUID, and its CDI device (the
	// variable only the CDI spec sets).
	if out, err := kubectl(t, "exec", "rnborrower", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES $NVIDIA_CDI_INJECTED"); err != nil || out != realNodeUUID+" "+realNodeUUID {
		t.Errorf("inside the borrower: %q (%v), want NVIDIA_VISIBLE_DEVICES and the CDI-injected variable both the GPU's UUID", out, err)
	}

	// The owner computes again: an NVML sample, no new open.
	sampled := time.Now()
	double.Compute(t, 0, ownerPID, 80)
	testutil.Eventually(t, 10*time.Second, "the borrower's process is dead", func() bool { return !testutil.Alive(borrowerPID) })
	f = waitHostState(t, 10*time.Second, "a kill record for the borrower", func(f *v1.StateFile) bool {
		return killOf(f, borrowerPID) != nil
	})
	r := killOf(f, borrowerPID)
	dead := r.Time.Add(time.Duration(r.LatencyMS * float64(time.Millisecond)))
	if took := dead.Sub(sampled); took > 1500*time.Millisecond {
		t.Errorf("the borrower died %s after the owner's sample, want within 1.5 s (gpud samples NVML every second)", took)
	} else {
		t.Logf("owner's sample → borrower dead: %s (decision → dead %.1f ms)", took, r.LatencyMS)
	}
	if !testutil.Alive(ownerPID) {
		t.Error("the owner was harmed")
	}
	for name, a := range map[string]*exec.Cmd{"nvidia-persistenced": persistenced, "gpu-feature-discovery": gfd} {
		if !testutil.Alive(a.Process.Pid) {
			t.Errorf("%s was killed", name)
		}
	}

	// An XID that is the GPU's fault: unhealthy, not lendable, counted.
	testutil.Eventually(t, 20*time.Second, "an XID 79 makes the GPU unhealthy", func() bool {
		double.XID(t, 0, 79) // repeated: events before gpud registered are not delivered
		f := hostState(t)
		return f != nil && len(f.GPUs) > 0 && f.GPUs[0].Health != nil && !f.GPUs[0].Health.Healthy
	})
	f = waitHostState(t, 10*time.Second, "the unhealthy GPU not lendable", func(f *v1.StateFile) bool {
		return f.GPUs[0].Lendable != nil && !*f.GPUs[0].Lendable
	})
	if !strings.Contains(f.GPUs[0].NotLendable, "XID 79") {
		t.Errorf("not lendable because %q, want XID 79", f.GPUs[0].NotLendable)
	}
	if _, body := httpGet(t, "http://127.0.0.1:9407/metrics"); !strings.Contains(body, `gpud_gpu_healthy{UUID="`+realNodeUUID+`",device="nvidia0",gpu="0"} 0`) {
		t.Errorf("gpud_gpu_healthy is not 0 for the GPU:\n%s", grepLines(body, "gpud_gpu_"))
	}
}

// killOf is the kill record of pid in the state file.
func killOf(f *v1.StateFile, pid int) *preempt.Record {
	for _, raw := range f.Preemptions {
		var r preempt.Record
		if json.Unmarshal(raw, &r) == nil && r.Action == preempt.ActionKill && r.Victim.PID == pid && r.Result == "done" {
			return &r
		}
	}
	return nil
}

func count(path string) int {
	b, _ := os.ReadFile(path)
	var n int
	fmt.Sscan(string(b), &n)
	return n
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// gpud's pod started on a node whose driver has not made the GPU nodes yet
// (the driver container still starting) waits, alive and not ready, and
// works once they appear: no CrashLoopBackOff.
func TestChartWaitsForGPUNodes(t *testing.T) {
	dev := t.TempDir() // no nvidiaN yet
	appeared := make(chan error, 1)
	var made time.Time
	go func() {
		// The pod runs and stays unready while there is no GPU.
		var gp string
		ok := testutil.Poll(60*time.Second, func() bool {
			out, err := kubectl(t, "-n", "gpud-system", "get", "pod", "-l", "app.kubernetes.io/instance=gpud",
				"-o", "jsonpath={.items[0].metadata.name} {.items[0].status.phase} {.items[0].status.containerStatuses[0].ready}")
			f := strings.Fields(out)
			if err != nil || len(f) != 3 || f[1] != "Running" {
				return false
			}
			gp = f[0]
			return f[2] == "false"
		})
		if !ok {
			appeared <- fmt.Errorf("gpud's pod never ran unready without GPUs")
			return
		}
		time.Sleep(5 * time.Second) // a few readiness probes later: still alive, no restart
		out, _ := kubectl(t, "-n", "gpud-system", "get", "pod", gp, "-o",
			"jsonpath={.status.containerStatuses[0].ready} {.status.containerStatuses[0].restartCount}")
		if out != "false 0" {
			appeared <- fmt.Errorf("without GPUs: ready, restarts = %q, want \"false 0\"", out)
			return
		}
		made = time.Now()
		appeared <- unix.Mknod(filepath.Join(dev, "nvidia0"), unix.S_IFCHR|0o666, int(unix.Mkdev(10, 229)))
	}()
	deployChart(t, dev) // returns once the pod is Ready
	if err := <-appeared; err != nil {
		t.Fatal(err)
	}
	f := waitHostState(t, 30*time.Second, "the GPU in a state file written since it appeared", func(f *v1.StateFile) bool {
		return len(f.GPUs) == 1 && f.UpdatedAt.After(made)
	})
	if f.GPUs[0].Device != "/host/dev/nvidia0" {
		t.Errorf("GPU %+v, want /host/dev/nvidia0", f.GPUs[0])
	}
}
