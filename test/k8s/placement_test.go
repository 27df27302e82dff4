//go:build k8s

package k8s

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

// templatePod runs a pod whose claim template "name" has the request "gpu"
// (more lines of its exactly:, indented ten spaces) and more lines of the
// claim's devices: (indented six); the scheduler places it.
func templatePod(t *testing.T, name, request, devices string) {
	t.Helper()
	pod := testPod{name: name, restart: "Never", container: claimedGPU,
		spec: fmt.Sprintf("  resourceClaims:\n  - name: gpu\n    resourceClaimTemplateName: %s\n", name)}
	apply(t, fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: %s, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu-mem.gpud.io
%s%s---
`, name, request, devices)+pod.manifest(t))
	t.Cleanup(func() {
		kubectl(t, "delete", "pod", name, "--grace-period=0", "--force", "--ignore-not-found")
		kubectl(t, "delete", "resourceclaimtemplate", name, "--ignore-not-found")
	})
}

// computeOn is a templatePod asking compute (and 1Gi of memory) of the GPU
// with UUID uuid, with more lines of the claim's devices.
func computeOn(t *testing.T, name, uuid string, compute int, devices string) {
	t.Helper()
	templatePod(t, name, fmt.Sprintf("          selectors: [{cel: {expression: 'device.attributes[\"gpud.io\"].uuid == \"%s\"'}}]\n"+
		"          capacity: {requests: {memory: 1Gi, compute: %d}}\n", uuid, compute), devices)
}

func waitReady(t *testing.T, pod string) {
	t.Helper()
	if out, err := kubectl(t, "wait", "--for=condition=Ready", "pod/"+pod, "--timeout=90s"); err != nil {
		desc, _ := kubectl(t, "describe", "pod", pod)
		t.Fatalf("pod %s never Ready: %v %s\n%s", pod, err, out, desc)
	}
}

// allocated is the devices of pod's claim and each one's consumed compute.
func allocated(t *testing.T, pod string) (devices, compute []string) {
	t.Helper()
	name := mustKubectl(t, "get", "pod", pod, "-o", "jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}")
	out := mustKubectl(t, "get", "resourceclaim", name, "-o",
		`jsonpath={range .status.allocation.devices.results[*]}{.device}={.consumedCapacity.compute};{end}`)
	for _, r := range strings.Split(strings.TrimSuffix(out, ";"), ";") {
		d, c, _ := strings.Cut(r, "=")
		devices, compute = append(devices, d), append(compute, c)
	}
	return devices, compute
}

// checkpointShares is gpud's checkpoint's shares, by claim name.
func checkpointShares(t *testing.T) map[string][]struct {
	Compute int  `json:"compute"`
	HardCap bool `json:"hard_cap"`
} {
	t.Helper()
	var c struct {
		Claims map[string]struct {
			Name   string `json:"name"`
			Shares []struct {
				Compute int  `json:"compute"`
				HardCap bool `json:"hard_cap"`
			} `json:"shares"`
		} `json:"claims"`
	}
	b, err := os.ReadFile("/var/lib/gpud/dra-claims.json")
	if err != nil || json.Unmarshal(b, &c) != nil {
		t.Fatalf("gpud's DRA checkpoint: %v\n%s", err, b)
	}
	out := map[string][]struct {
		Compute int  `json:"compute"`
		HardCap bool `json:"hard_cap"`
	}{}
	for _, cl := range c.Claims {
		out[cl.Name] = append(out[cl.Name], cl.Shares...)
	}
	return out
}

// Compute is a second consumable capacity: pods asking compute 30 and 70
// of one GPU are both placed on it, a third asking 50 of it stays Pending
// with the scheduler's reason; prepared claims carry their compute and a
// hard cap asked by opaque configuration; a configuration gpud does not
// understand fails the claim's preparation, saying why.
func TestComputeSharingThroughDRA(t *testing.T) {
	deploySharing(t)
	testutil.Eventually(t, 60*time.Second, "the node's ResourceSlice lists compute on both GPUs", func() bool {
		out, err := kubectl(t, "get", "resourceslices", "--field-selector", "spec.driver=gpud.io", "-o",
			`jsonpath={range .items[*].spec.devices[*]}{.name}={.capacity.compute.value}/{.capacity.compute.requestPolicy.default};{end}`)
		return err == nil && strings.Count(out, "=100/0;") == 2
	})
	gpu0 := strings.ToLower(shareUUID0)
	hardCap := "      config:\n      - opaque: {driver: gpud.io, parameters: {apiVersion: gpud.io/v1, kind: ComputeConfig, hardCap: true}}\n"
	computeOn(t, "c30", shareUUID0, 30, hardCap)
	computeOn(t, "c70", shareUUID0, 70, "")
	for p, want := range map[string]string{"c30": "30", "c70": "70"} {
		waitReady(t, p)
		if d, c := allocated(t, p); !slices.Equal(d, []string{gpu0}) || !slices.Equal(c, []string{want}) {
			t.Errorf("%s: devices %v compute %v, want %s with %s", p, d, c, gpu0, want)
		}
	}
	shares := checkpointShares(t)
	claim30 := mustKubectl(t, "get", "pod", "c30", "-o", "jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}")
	claim70 := mustKubectl(t, "get", "pod", "c70", "-o", "jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}")
	if s := shares[claim30]; len(s) != 1 || s[0].Compute != 30 || !s[0].HardCap {
		t.Errorf("c30's prepared shares %+v, want compute 30, hard cap", s)
	}
	if s := shares[claim70]; len(s) != 1 || s[0].Compute != 70 || s[0].HardCap {
		t.Errorf("c70's prepared shares %+v, want compute 70, no hard cap", s)
	}

	// 30 + 70: nothing left of GPU 0's compute (its memory is mostly free).
	computeOn(t, "c50", shareUUID0, 50, "")
	testutil.Eventually(t, 30*time.Second, "the third pod unschedulable", func() bool {
		out, _ := kubectl(t, "get", "pod", "c50", "-o", `jsonpath={.status.phase} {.status.conditions[?(@.type=="PodScheduled")].reason}`)
		return out == "Pending Unschedulable"
	})
	msg := mustKubectl(t, "get", "pod", "c50", "-o", `jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}`)
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("the scheduler's reason: %q, want it to say it cannot allocate the claim", msg)
	}
	t.Logf("the third pod: %s", msg)

	// A misspelt key: the claim is allocated, its preparation fails with
	// the reason in the pod's events.
	computeOn(t, "cbad", shareUUID1, 10,
		"      config:\n      - opaque: {driver: gpud.io, parameters: {apiVersion: gpud.io/v1, kind: ComputeConfig, hardcap: true}}\n")
	testutil.Eventually(t, 60*time.Second, "the bad configuration's reason in the pod's events", func() bool {
		out, _ := kubectl(t, "get", "events", "--field-selector", "involvedObject.name=cbad", "-o", "jsonpath={.items[*].message}")
		return strings.Contains(out, `unknown field \"hardcap\"`) || strings.Contains(out, `unknown field "hardcap"`)
	})
	if ph := mustKubectl(t, "get", "pod", "cbad", "-o", "jsonpath={.status.phase}"); ph != "Pending" {
		t.Errorf("the pod with a bad configuration is %s, want Pending (not started uncapped)", ph)
	}
}

// NVML double topology for TestNVLinkPlacementThroughDRA: four GPUs,
// NVML 0 linked to 2 and 1 to 3, so that the first two devices of the
// slice (0 and 1) are not linked.
var topoUUIDs = []string{shareUUID0, shareUUID1, "GPU-5a1e0c7d-2b3f-4c8e-9d10-6e7f8a9b0c03", "GPU-5a1e0c7d-2b3f-4c8e-9d10-6e7f8a9b0c04"}

func deployTopology(t *testing.T) {
	t.Helper()
	dev, _ := fakeGPU(t)
	minors := []int{229, 7, 8, 9} // nvidia0 is fakeGPU's 10:229
	for i := 1; i < 4; i++ {
		if err := unix.Mknod(filepath.Join(dev, fmt.Sprintf("nvidia%d", i)), unix.S_IFCHR|0o666, int(unix.Mkdev(1, uint32(minors[i])))); err != nil {
			t.Fatal(err)
		}
	}
	pci := []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"}
	peer := []int{2, 3, 0, 1}
	var gpus []testutil.NVMLGPU
	for i := range 4 {
		gpus = append(gpus, testutil.NVMLGPU{Index: i, Minor: minors[i], UUID: topoUUIDs[i], Name: "NVIDIA H100", MemoryTotal: 16 << 30,
			PCI: pci[i], NVLinks: []string{pci[peer[i]], pci[peer[i]], ""}})
	}
	root := t.TempDir()
	testutil.NewNVMLDouble(t, filepath.Join(root, "usr/lib/x86_64-linux-gnu"), gpus...)
	kr := env(t, "KUBELET_ROOT")
	deployChart(t, dev, "dra.enabled=true", "dra.memoryReserve=0Mi", "hostPaths.driverRoot="+root,
		"hostPaths.kubeletPlugins="+filepath.Join(kr, "plugins"), "hostPaths.kubeletPluginsRegistry="+filepath.Join(kr, "plugins_registry"),
		"dra.cdiDir="+env(t, "CDI_SPEC_DIR"))
}

// A claim for two GPUs with a matchAttribute constraint on
// gpud.io/nvlinkGroup lands on a linked pair; the slice carries each GPU's
// group and PCI bus id.
func TestNVLinkPlacementThroughDRA(t *testing.T) {
	deployTopology(t)
	var slice string
	testutil.Eventually(t, 60*time.Second, "the node's ResourceSlice lists four GPUs with their NVLink groups", func() bool {
		out, err := kubectl(t, "get", "resourceslices", "--field-selector", "spec.driver=gpud.io", "-o",
			`jsonpath={range .items[*].spec.devices[*]}{.name}={.attributes.nvlinkGroup.int},{.attributes.resource\.kubernetes\.io/pciBusID.string};{end}`)
		slice = out
		return err == nil && strings.Count(out, "=") == 4
	})
	for i, u := range topoUUIDs {
		want := fmt.Sprintf("%s=%d,", strings.ToLower(u), []int{0, 1, 0, 1}[i])
		if !strings.Contains(slice, want) {
			t.Errorf("the slice lacks %s: %s", want, slice)
		}
	}
	templatePod(t, "linked", "          count: 2\n          capacity: {requests: {memory: 1Gi}}\n",
		"      constraints:\n      - {requests: [gpu], matchAttribute: gpud.io/nvlinkGroup}\n")
	waitReady(t, "linked")
	d, _ := allocated(t, "linked")
	slices.Sort(d)
	pairs := [][]string{{strings.ToLower(topoUUIDs[0]), strings.ToLower(topoUUIDs[2])}, {strings.ToLower(topoUUIDs[1]), strings.ToLower(topoUUIDs[3])}}
	for _, p := range pairs {
		slices.Sort(p)
	}
	if !slices.Equal(d, pairs[0]) && !slices.Equal(d, pairs[1]) {
		t.Errorf("the two-GPU claim got %v, want a linked pair %v", d, pairs)
	}
	if out, err := kubectl(t, "exec", "linked", "--", "sh", "-c", "ls /dev | grep -c '^nvidia[0-9]'"); err != nil || out != "2" {
		t.Errorf("GPU nodes in the pod: %q (%v), want 2", out, err)
	}
	// The same claim without the constraint: the scheduler takes the
	// first two devices that fit, here not a linked pair (what the
	// constraint is for).
	templatePod(t, "unlinked", "          count: 2\n          capacity: {requests: {memory: 1Gi}}\n", "")
	waitReady(t, "unlinked")
	u, _ := allocated(t, "unlinked")
	slices.Sort(u)
	t.Logf("without the constraint: %v (linked pairs: %v)", u, pairs)
}
