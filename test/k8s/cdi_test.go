//go:build k8s

package k8s

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/deviceplugin"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
)

// nvidiaStandin stands in for NVIDIA's device plugin as it runs on a
// CDI-native stack (DEVICE_LIST_STRATEGY=envvar,cdi-cri; device IDs by
// UUID): its devices are named by GPU UUID, and an allocation is the
// UUIDs in NVIDIA_VISIBLE_DEVICES and one CDI device nvidia.com/gpu=<UUID>
// each, with no device node of its own (the runtime's CDI spec injects it).
type nvidiaStandin struct {
	deviceplugin.Notifier
	uuids []string
}

func (s *nvidiaStandin) Devices() []deviceplugin.Device {
	var out []deviceplugin.Device
	for _, u := range s.uuids {
		out = append(out, deviceplugin.Device{ID: u, Healthy: true})
	}
	return out
}

func (s *nvidiaStandin) Preferred(available, mustInclude []string, size int) []string {
	return deviceplugin.Pick(available, mustInclude, size)
}

func (s *nvidiaStandin) Allocate(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	r := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ",")}}
	for _, id := range ids {
		r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: "nvidia.com/gpu=" + id})
	}
	return r, nil
}

// cdiResource is what this file's gpud lends: not gpud.io/idle-gpu, which
// TestPodAdmittedBeforeRegistrationIsReported needs unregistered when it
// runs (a resource kubelet once knew keeps a pod asking it Pending).
const cdiResource = "gpud.io/cdi-idle-gpu"

// startUUIDStandin serves the stand-in for nvidia.com/gpu until the test ends.
func startUUIDStandin(t *testing.T, uuids ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &deviceplugin.Plugin{ResourceName: "nvidia.com/gpu", KubeletDir: env(t, "DEVICE_PLUGINS_DIR"),
		Endpoint: "test-nvidia-uuid.sock", Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Backend: &nvidiaStandin{uuids: uuids}}
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// writeCDISpec writes, into the test containerd's CDI spec directory, a
// spec of kind nvidia.com/gpu as NVIDIA's toolkit generates one: a device
// per GPU named by its UUID, whose edits inject the GPU's node and (in
// place of the driver's libraries, which the fake GPU has none of) an
// environment variable that only CDI can have put there.
func writeCDISpec(t *testing.T, uuid, node string) {
	t.Helper()
	spec := fmt.Sprintf(`cdiVersion: 0.6.0
kind: nvidia.com/gpu
devices:
- name: %s
  containerEdits:
    deviceNodes:
    - {path: /dev/nvidia0, hostPath: %s}
    env: [NVIDIA_CDI_INJECTED=%s]
`, uuid, node, uuid)
	p := filepath.Join(env(t, "CDI_SPEC_DIR"), "gpud-test-nvidia.yaml")
	if err := os.WriteFile(p, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
}

// On a CDI-native stack: the owner holds the GPU through NVIDIA's plugin
// (a stand-in naming it by UUID, the device injected by CDI), goes idle;
// gpud (in this process, NVML from go-nvml's mock, whose device 3 answers
// for the fake GPU) lends it by UUID: the borrower's container sees the
// CDI-injected device and variable and NVIDIA_VISIBLE_DEVICES=<UUID>;
// the owner is matched by its UUID device ID in PodResources, so its
// compute (NVML samples) takes the GPU back.
func TestBorrowerGetsCDIDevicesAndUUID(t *testing.T) {
	dev, gpu := fakeGPU(t)
	var ownerActive atomic.Int64
	lib := dgxa100.New()
	lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	for i, d := range lib.Devices {
		md := d.(*dgxa100.Device)
		md.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		// go-nvml's DGX A100 answers no NVLink call; gpud asks for topology.
		md.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		md.Minor = 100 + i // no node of ours
		if i == 3 {
			md.Minor = 229 // the fake node's
		}
		md.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			pid := ownerActive.Load()
			if i != 3 || pid == 0 {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return []nvml.ProcessUtilizationSample{{Pid: uint32(pid), TimeStamp: uint64(time.Now().UnixMicro()), SmUtil: 60, MemUtil: 20}}, nvml.SUCCESS
		}
	}
	uuid := lib.Devices[3].(*dgxa100.Device).UUID
	writeCDISpec(t, uuid, gpu)
	startUUIDStandin(t, uuid)

	d, statePath := lendingGpud(t, dev, lib, func(r *config.Run) {
		r.ResourceName, r.CDIKind, r.CDISpecDirs = cdiResource, config.Defaults().CDIKind, []string{env(t, "CDI_SPEC_DIR")}
	})
	holders := fileHolders(statePath)
	testutil.Eventually(t, 30*time.Second, "gpud registered and kubelet lists both resources", func() bool {
		return d.Plugin().IsRegistered() && allocatable(t, "nvidia.com/gpu") == "1"
	})
	if g := d.State().GPUs; len(g) != 1 || g[0].UUID != uuid || g[0].NVMLIndex == nil || *g[0].NVMLIndex != 3 || g[0].Index != 0 {
		t.Fatalf("state: %+v, want GPU 0 (NVML's 3) named %s", g, uuid)
	}
	health := watchHealth(t, filepath.Join(env(t, "DEVICE_PLUGINS_DIR"), "gpud.sock"), uuid)

	// The fixture works as the real stack does: the owner's GPU comes from CDI.
	resourcePod(t, "cdiowner", "nvidia.com/gpu")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/cdiowner", "--timeout=60s")
	if out := mustKubectl(t, "exec", "cdiowner", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES $NVIDIA_CDI_INJECTED; ls /dev/nvidia0"); out != uuid+" "+uuid+"\n/dev/nvidia0" {
		t.Fatalf("inside the owner (NVIDIA's stand-in and the CDI spec): %q", out)
	}
	ownerPID := hold(t, holders, "cdiowner")
	waitHealth(t, health, pluginapi.Healthy, 15*time.Second)

	resourcePod(t, "cdiborrower", cdiResource)
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/cdiborrower", "--timeout=60s")
	out := mustKubectl(t, "exec", "cdiborrower", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES $NVIDIA_CDI_INJECTED $GPUD_GPU; ls /dev/nvidia0")
	if want := uuid + " " + uuid + " 0\n/dev/nvidia0"; out != want {
		t.Fatalf("inside the borrower: %q, want %q (NVIDIA_VISIBLE_DEVICES, the CDI-injected variable, GPUD_GPU; the device)", out, want)
	}
	t.Logf("inside the borrower: %q", out)
	alloc, err := deviceplugin.ListAllocated(context.Background(), filepath.Join(env(t, "KUBELET_ROOT"), "pod-resources", "kubelet.sock"))
	if err != nil || len(alloc[cdiResource]) != 1 || alloc[cdiResource][0].Name != "cdiborrower" ||
		strings.Join(alloc[cdiResource][0].DeviceIDs, ",") != uuid {
		t.Fatalf("PodResources: %+v %v, want the borrower holding %s", alloc, err, uuid)
	}
	borrowerPID := hold(t, holders, "cdiborrower")
	// The owner is known by its UUID device ID (PodResources), not only as
	// the GPU's idle holder: the state file names it.
	testutil.Eventually(t, 10*time.Second, "the state shows the loan with its owner", func() bool {
		g := d.State().GPUs
		return len(g) == 1 && g[0].State == occupancy.Lent && g[0].Owner == "default/cdiowner" && g[0].Borrower == "default/cdiborrower"
	})

	// The owner computes on its GPU (NVML samples, no new open): the loan ends.
	ownerActive.Store(int64(ownerPID))
	testutil.Eventually(t, 10*time.Second, "the borrower's process is dead", func() bool { return !testutil.Alive(borrowerPID) })
	if !testutil.Alive(ownerPID) {
		t.Fatal("the owner was harmed")
	}
	testutil.Eventually(t, 30*time.Second, "the borrower pod is evicted and gone", func() bool {
		_, err := kubectl(t, "get", "pod", "cdiborrower")
		return err != nil
	})
}
