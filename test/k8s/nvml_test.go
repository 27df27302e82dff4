//go:build k8s

package k8s

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/config"

	"github.com/gpud/gpud/internal/nvidia"
	"github.com/gpud/gpud/internal/testutil"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
)

// lendingGpud runs gpud in this test process as the node's lender of the
// fake GPUs in dev, until the test ends: enforcing (unlabelled pods
// unmanaged), evicting borrowers, its device plugin registered with the
// real kubelet, NVML answered by lib; tweak sets what a test adds (nil:
// nothing). It returns gpud and its state file; gpud's log is printed when
// the test fails.
func lendingGpud(t *testing.T, dev string, lib nvml.Interface, tweak func(*config.Run)) (*daemon.Daemon, string) {
	t.Helper()
	state := t.TempDir()
	run := config.Run{
		DevDir: dev, StateFile: filepath.Join(state, "state.json"), StateDir: state,
		IdleAfter: 2 * time.Second, NodeName: env(t, "NODE_NAME"), KubeConfig: env(t, "KUBECONFIG"),
		Enforce: true, FailOpenAfter: 30 * time.Second, DefaultPriority: occupancy.Unmanaged,
		Reclaim: preempt.ReclaimEvict, ReservationTTL: 30 * time.Second, DockerHost: "none", CRIEndpoint: "none",
		DevicePlugin: true, KubeletDir: env(t, "DEVICE_PLUGINS_DIR"),
		PodResourcesSocket: filepath.Join(env(t, "KUBELET_ROOT"), "pod-resources", "kubelet.sock"),
	}
	if tweak != nil {
		tweak(&run)
	}
	logs := &testutil.Buffer{}
	d, err := daemon.New(daemon.Config{Run: run, NVML: &nvidia.NVML{Lib: lib}},
		slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if run.DevicePlugin {
			waitUnallocatable(t, cmp.Or(run.ResourceName, config.Defaults().ResourceName))
		}
	})
	wg.Go(func() { d.Run(ctx) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gpud's log:\n%s", logs.String())
		}
	})
	return d, run.StateFile
}

// ownerActivityMock is go-nvml's mock of a DGX A100 whose device 0 answers
// for the fake GPU (minor 229) and reports a compute sample of the PID
// stored in the returned value (none while it is 0); the other devices name
// no node of ours and report nothing.
func ownerActivityMock() (*dgxa100.Server, *atomic.Int64) {
	var ownerActive atomic.Int64
	lib := dgxa100.New()
	lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	for i, d := range lib.Devices {
		md := d.(*dgxa100.Device)
		md.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		// go-nvml's DGX A100 answers no NVLink call; gpud asks for topology.
		md.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		if i == 0 {
			md.Minor = 229
			md.GetProcessUtilizationFunc = func(last uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
				pid := ownerActive.Load()
				if pid == 0 {
					return nil, nvml.ERROR_NOT_FOUND
				}
				return []nvml.ProcessUtilizationSample{{Pid: uint32(pid), TimeStamp: uint64(time.Now().UnixMicro()), SmUtil: 60, MemUtil: 20}}, nvml.SUCCESS
			}
			continue
		}
		md.Minor = 100 + i // no node of ours
		md.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			return nil, nvml.ERROR_NOT_FOUND
		}
	}
	return lib, &ownerActive
}

// The owner of a lent GPU becomes active on it (NVML sees its process
// using the GPU) without opening it again: gpud takes the GPU back, the
// borrower's processes die and the borrower pod is evicted. NVML is the one
// part that cannot run here: gpud runs in this test process with go-nvml's
// mock of a DGX A100, whose device 0 answers for the fake GPU (minor 229);
// kubelet, its device manager, PodResources and the pods are real.
func TestOwnerActiveOnNVMLTakesLentGPUBack(t *testing.T) {
	dev, gpu := fakeGPU(t)
	startStandin(t, gpu)
	lib, ownerActive := ownerActivityMock()
	d, statePath := lendingGpud(t, dev, lib, nil)
	holders := fileHolders(statePath)
	testutil.Eventually(t, 30*time.Second, "gpud registered and kubelet lists both resources", func() bool {
		return d.Plugin().IsRegistered() && allocatable(t, "nvidia.com/gpu") == "1"
	})
	// With NVML gpud names the lent GPU by its UUID, as NVIDIA's plugin does.
	health := watchHealth(t, filepath.Join(env(t, "DEVICE_PLUGINS_DIR"), "gpud.sock"), lib.Devices[0].(*dgxa100.Device).UUID)

	resourcePod(t, "nvowner", "nvidia.com/gpu")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/nvowner", "--timeout=60s")
	ownerPID := hold(t, holders, "nvowner")
	waitHealth(t, health, "Healthy", 15*time.Second)

	resourcePod(t, "nvborrower", "gpud.io/idle-gpu")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/nvborrower", "--timeout=60s")
	borrowerPID := hold(t, holders, "nvborrower")
	borrowerUID := podUID(t, "nvborrower")

	// The owner computes on its GPU: no new open, only NVML's samples.
	ownerActive.Store(int64(ownerPID))
	testutil.Eventually(t, 10*time.Second, "the borrower's process is dead", func() bool { return !testutil.Alive(borrowerPID) })
	if !testutil.Alive(ownerPID) {
		t.Fatal("the owner was harmed")
	}
	testutil.Eventually(t, 10*time.Second, "a kill record naming the owner's pod and the borrower", func() bool {
		for _, r := range d.Journal().Recent() {
			if r.Action == preempt.ActionKill && r.Victim.PID == borrowerPID && r.Victim.PodUID == borrowerUID &&
				r.Preemptor.PodUID == podUID(t, "nvowner") && r.Result == "done" {
				b, _ := json.Marshal(r)
				t.Logf("record: %s", b)
				return true
			}
		}
		return false
	})
	testutil.Eventually(t, 30*time.Second, "the borrower pod is evicted and gone", func() bool {
		_, err := kubectl(t, "get", "pod", "nvborrower")
		return err != nil
	})
	waitHealth(t, health, "Unhealthy", 5*time.Second)
}
