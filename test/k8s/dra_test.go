//go:build k8s

package k8s

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

// The two shared GPUs' UUIDs, as the NVML double names them.
const (
	shareUUID0 = "GPU-5a1e0c7d-2b3f-4c8e-9d10-6e7f8a9b0c01"
	shareUUID1 = "GPU-5a1e0c7d-2b3f-4c8e-9d10-6e7f8a9b0c02"
)

// sharePod runs a pod with a claim of mem of gpud.io's GPU memory, from a
// claim template of its own; the scheduler places it (no nodeName: DRA
// claims are allocated by the scheduler).
func sharePod(t *testing.T, name, mem string, labels ...string) {
	t.Helper()
	sharePodOn(t, name, mem, "", labels...)
}

// sharePodOn is sharePod on the GPU with UUID uuid (a CEL selector on the
// device's uuid attribute), its container holding that GPU open; "" lets
// the scheduler choose and holds nothing.
func sharePodOn(t *testing.T, name, mem, uuid string, labels ...string) {
	t.Helper()
	pod := testPod{name: name, labels: labels, restart: "Never", container: claimedGPU,
		spec: fmt.Sprintf("  resourceClaims:\n  - name: gpu\n    resourceClaimTemplateName: %s\n", name)}
	selector := ""
	if uuid != "" {
		selector = fmt.Sprintf("\n          selectors: [{cel: {expression: 'device.attributes[\"gpud.io\"].uuid == \"%s\"'}}]", uuid)
		pod.command = "exec 3<>$(ls /dev/nvidia[0-9]*); " + sleepUntilTerm
	}
	apply(t, fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: %[1]s, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu-mem.gpud.io%[3]s
          capacity: {requests: {memory: %[2]s}}
---
`, name, mem, selector)+pod.manifest(t))
	t.Cleanup(func() {
		kubectl(t, "delete", "pod", name, "--grace-period=0", "--force", "--ignore-not-found")
		kubectl(t, "delete", "resourceclaimtemplate", name, "--ignore-not-found")
	})
}

// claimOf is the device and memory the scheduler allocated to pod's claim.
func claimOf(t *testing.T, pod string) (device string, memory string) {
	t.Helper()
	name := mustKubectl(t, "get", "pod", pod, "-o", "jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}")
	out := mustKubectl(t, "get", "resourceclaim", name, "-o",
		`jsonpath={.status.allocation.devices.results[0].device} {.status.allocation.devices.results[0].consumedCapacity.memory}`)
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("claim %s of %s: allocation %q", name, pod, out)
	}
	return f[0], f[1]
}

// draCheckpoint is gpud's checkpoint of prepared claims on the host.
func draCheckpoint(t *testing.T) map[string]struct {
	Name       string    `json:"name"`
	PreparedAt time.Time `json:"prepared_at"`
} {
	t.Helper()
	var c struct {
		Claims map[string]struct {
			Name       string    `json:"name"`
			PreparedAt time.Time `json:"prepared_at"`
		} `json:"claims"`
	}
	b, err := os.ReadFile("/var/lib/gpud/dra-claims.json")
	if err != nil {
		t.Fatalf("gpud's DRA checkpoint: %v", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("gpud's DRA checkpoint: %v\n%s", err, b)
	}
	return c.Claims
}

func memQty(t *testing.T, s string) uint64 {
	t.Helper()
	for suf, m := range map[string]uint64{"Gi": 1 << 30, "Mi": 1 << 20} {
		if n, ok := strings.CutSuffix(s, suf); ok {
			v, err := strconv.ParseUint(n, 10, 64)
			if err == nil {
				return v * m
			}
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("quantity %q", s)
	}
	return v
}

// deploySharing deploys gpud from its chart with dra.enabled on two fake
// GPUs of 16 GiB each, answered by the NVML double under the driver root
// the chart mounts; it returns the double and gpud's pod.
func deploySharing(t *testing.T) (*testutil.NVMLDouble, string) {
	t.Helper()
	double, gp, _ := deploySharingDev(t)
	return double, gp
}

// deploySharingDev is deploySharing that also returns the fake GPUs'
// device directory (nvidia0: GPU 0, shareUUID0; nvidia1: GPU 1).
func deploySharingDev(t *testing.T) (*testutil.NVMLDouble, string, string) {
	t.Helper()
	dev, _ := fakeGPU(t)
	if err := unix.Mknod(filepath.Join(dev, "nvidia1"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	double := testutil.NewNVMLDouble(t, filepath.Join(root, "usr/lib/x86_64-linux-gnu"),
		testutil.NVMLGPU{Index: 0, Minor: 229, UUID: shareUUID0, Name: "NVIDIA L4", MemoryTotal: 16 << 30},
		testutil.NVMLGPU{Index: 1, Minor: 7, UUID: shareUUID1, Name: "NVIDIA L4", MemoryTotal: 16 << 30})
	kr := env(t, "KUBELET_ROOT")
	gp := deployChart(t, dev, "dra.enabled=true", "dra.memoryReserve=0Mi", "hostPaths.driverRoot="+root,
		"hostPaths.kubeletPlugins="+filepath.Join(kr, "plugins"), "hostPaths.kubeletPluginsRegistry="+filepath.Join(kr, "plugins_registry"),
		"dra.cdiDir="+env(t, "CDI_SPEC_DIR"))
	return double, gp, dev
}

// GPU sharing by memory, end to end: gpud from its chart with
// dra.enabled, two fake GPUs of 16 GiB answered by the NVML double. The
// node's ResourceSlice lists both with their memory; pods asking 8, 12, 4
// and 4 GiB are all placed with no GPU over 16 GiB; a fifth asking 12 GiB
// stays Pending with the scheduler's reason; each pod sees exactly its GPU
// and its limit; an extended-resource pod runs on the mapping. gpud and
// kubelet restarted: pods keep running, nothing prepared twice. A claim
// deleted while gpud is down is unprepared after.
func TestSharingByMemoryThroughDRA(t *testing.T) {
	double, gp := deploySharing(t)

	// The slice: both GPUs, their memory a consumable capacity.
	var slice string
	testutil.Eventually(t, 60*time.Second, "the node's ResourceSlice lists both GPUs", func() bool {
		out, err := kubectl(t, "get", "resourceslices", "--field-selector", "spec.driver=gpud.io", "-o",
			`jsonpath={range .items[*].spec.devices[*]}{.name}={.capacity.memory.value},{.attributes.uuid.string},{.allowMultipleAllocations};{end}`)
		slice = out
		return err == nil && strings.Count(out, "=16Gi,") == 2
	})
	for _, u := range []string{shareUUID0, shareUUID1} {
		if !strings.Contains(slice, strings.ToLower(u)+"=16Gi,"+u+",true") {
			t.Errorf("the slice lacks %s with 16Gi and multiple allocations: %s", u, slice)
		}
	}

	// Four pods that fit the two GPUs only when each GPU's memory is
	// counted on its own.
	want := map[string]string{"sh8": "8Gi", "sh12": "12Gi", "sh4a": "4Gi", "sh4b": "4Gi"}
	for _, p := range []string{"sh8", "sh12", "sh4a", "sh4b"} {
		sharePod(t, p, want[p])
		if out, err := kubectl(t, "wait", "--for=condition=Ready", "pod/"+p, "--timeout=90s"); err != nil {
			desc, _ := kubectl(t, "describe", "pod", p)
			t.Fatalf("pod %s asking %s never Ready: %v %s\n%s", p, want[p], err, out, desc)
		}
	}
	used := map[string]uint64{}
	for p, mem := range want {
		d, m := claimOf(t, p)
		if m != mem {
			t.Errorf("%s's claim consumed %s, want %s", p, m, mem)
		}
		used[d] += memQty(t, m)
		// Inside: exactly its GPU, and its limit.
		out, err := kubectl(t, "exec", p, "--", "sh", "-c", "echo $GPUD_GPU_MEMORY_LIMIT_MIB $GPUD_GPU_UUID $NVIDIA_VISIBLE_DEVICES; ls /dev | grep -c '^nvidia[0-9]'")
		if err != nil {
			t.Fatalf("exec in %s: %v %s", p, err, out)
		}
		f := strings.Fields(out)
		if len(f) != 4 || f[0] != strconv.FormatUint(memQty(t, mem)>>20, 10) || strings.ToLower(f[1]) != d || f[2] != f[1] || f[3] != "1" {
			t.Errorf("inside %s (claim on %s, %s): %q; want the limit in MiB, the GPU's UUID twice and one GPU node", p, d, mem, out)
		}
	}
	for d, u := range used {
		if u > 16<<30 {
			t.Errorf("GPU %s holds %d GiB of shares, more than its 16", d, u>>30)
		}
	}
	if len(used) != 2 {
		t.Errorf("shares on %d GPUs, want both used: %v", len(used), used)
	}

	waitHostState(t, 20*time.Second, "the state file's DRA section: both GPUs offered, four claims", func(f *v1.StateFile) bool {
		return f.DRA != nil && f.DRA.Driver == "gpud.io" && f.DRA.Offered == 2 && f.DRA.Claims == 4 && len(f.DRA.NotOffered) == 0
	})

	// A fifth asking 12 GiB: no GPU has 12 left.
	sharePod(t, "sh12b", "12Gi")
	testutil.Eventually(t, 30*time.Second, "the fifth pod unschedulable, with the scheduler's reason", func() bool {
		out, _ := kubectl(t, "get", "pod", "sh12b", "-o", `jsonpath={.status.phase} {.status.conditions[?(@.type=="PodScheduled")].reason}`)
		return out == "Pending Unschedulable"
	})
	msg := mustKubectl(t, "get", "pod", "sh12b", "-o", `jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}`)
	if !strings.Contains(msg, "claim") {
		t.Errorf("the scheduler's reason does not name the claim: %q", msg)
	}
	t.Logf("the fifth pod: %s", msg)
	kubectl(t, "delete", "pod", "sh12b", "--grace-period=0", "--force")

	// gpushare's form: an extended resource, served by DRA (each unit a
	// share of dra.memoryDefault, 4 GiB).
	resourcePodScheduled(t, "shext", "gpud.io/gpu-mem")
	if out, err := kubectl(t, "wait", "--for=condition=Ready", "pod/shext", "--timeout=90s"); err != nil {
		desc, _ := kubectl(t, "describe", "pod", "shext")
		t.Fatalf("the extended-resource pod never Ready: %v %s\n%s", err, out, desc)
	}
	if out, err := kubectl(t, "exec", "shext", "--", "sh", "-c", "echo $GPUD_GPU_MEMORY_LIMIT_MIB"); err != nil || out != "4096" {
		t.Errorf("the extended-resource pod's limit: %q (%v), want 4096", out, err)
	}
	kubectl(t, "delete", "pod", "shext", "--grace-period=0", "--force")
	testutil.Eventually(t, 60*time.Second, "the extended-resource pod's claim unprepared", func() bool { return len(draCheckpoint(t)) == 4 })

	// Restarts: gpud's pod, then kubelet. The pods keep running, their
	// claims prepared once.
	before := draCheckpoint(t)
	started := map[string]string{}
	for p := range want {
		started[p] = mustKubectl(t, "get", "pod", p, "-o", "jsonpath={.status.containerStatuses[0].state.running.startedAt}")
	}
	mustKubectl(t, "-n", "gpud-system", "delete", "pod", gp, "--wait=true")
	testutil.Eventually(t, 90*time.Second, "gpud's new pod Ready", func() bool {
		out, err := kubectl(t, "-n", "gpud-system", "get", "pod", "-l", "app.kubernetes.io/instance=gpud",
			"-o", `jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status};{end}`)
		return err == nil && !strings.Contains(out, gp+" ") && strings.HasSuffix(out, " True;") && strings.Count(out, ";") == 1
	})
	root2, _ := filepath.Abs("../..")
	if out, err := exec.Command(filepath.Join(root2, "scripts/cluster.sh"), "restart-kubelet").CombinedOutput(); err != nil {
		t.Fatalf("restarting kubelet: %v\n%s", err, out)
	}
	testutil.Eventually(t, 60*time.Second, "the node Ready again", func() bool {
		out, _ := kubectl(t, "get", "node", env(t, "NODE_NAME"), "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True"
	})
	time.Sleep(5 * time.Second) // kubelet prepares its pods' claims again as it starts
	after := draCheckpoint(t)
	for uid, c := range before {
		if a, ok := after[uid]; !ok || !a.PreparedAt.Equal(c.PreparedAt) {
			t.Errorf("claim %s (%s): prepared at %v before the restarts, %+v after: prepared twice or lost", uid, c.Name, c.PreparedAt, a)
		}
	}
	for p := range want {
		out := mustKubectl(t, "get", "pod", p, "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].state.running.startedAt}")
		if out != "Running 0 "+started[p] {
			t.Errorf("%s after the restarts: %q, want Running, never restarted (started %s)", p, out, started[p])
		}
	}

	// A claim deleted while gpud is down: gpud's pod kept off the node,
	// a pod and its claim deleted, gpud back.
	mustKubectl(t, "-n", "gpud-system", "patch", "daemonset", "gpud", "--type=merge", "-p", `{"spec":{"template":{"spec":{"nodeSelector":{"gpud.io/test-off":"true"}}}}}`)
	testutil.Eventually(t, 60*time.Second, "gpud's pod gone", func() bool {
		out, _ := kubectl(t, "-n", "gpud-system", "get", "pod", "-l", "app.kubernetes.io/instance=gpud", "-o", "name")
		return out == ""
	})
	claim := mustKubectl(t, "get", "pod", "sh4b", "-o", "jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}")
	claimUID := mustKubectl(t, "get", "resourceclaim", claim, "-o", "jsonpath={.metadata.uid}")
	kubectl(t, "delete", "pod", "sh4b", "--grace-period=0", "--force")
	testutil.Eventually(t, 60*time.Second, "the claim deleted", func() bool {
		_, err := kubectl(t, "get", "resourceclaim", claim)
		return err != nil
	})
	if _, ok := draCheckpoint(t)[claimUID]; !ok {
		t.Fatalf("claim %s left the checkpoint while gpud was down", claimUID)
	}
	mustKubectl(t, "-n", "gpud-system", "patch", "daemonset", "gpud", "--type=json", "-p", `[{"op":"remove","path":"/spec/template/spec/nodeSelector/gpud.io~1test-off"}]`)
	testutil.Eventually(t, 90*time.Second, "the deleted claim unprepared once gpud is back", func() bool {
		_, ok := draCheckpoint(t)[claimUID]
		_, err := os.Stat(filepath.Join(env(t, "CDI_SPEC_DIR"), "gpud.io-claim_"+claimUID+".json"))
		return !ok && os.IsNotExist(err)
	})
	for _, p := range []string{"sh8", "sh12", "sh4a"} {
		if out := mustKubectl(t, "get", "pod", p, "-o", "jsonpath={.status.phase}"); out != "Running" {
			t.Errorf("%s: %s after gpud came back", p, out)
		}
	}

	// Which GPUs a node shares: its gpud.io/shared-gpus label (read every
	// 30 s) overrides the chart's list.
	sliceDevices := func() string {
		out, _ := kubectl(t, "get", "resourceslices", "--field-selector", "spec.driver=gpud.io", "-o", `jsonpath={range .items[*].spec.devices[*]}{.attributes.uuid.string};{end}`)
		return out
	}
	node := env(t, "NODE_NAME")
	mustKubectl(t, "label", "node", node, "gpud.io/shared-gpus=1")
	t.Cleanup(func() { kubectl(t, "label", "node", node, "gpud.io/shared-gpus-") })
	testutil.Eventually(t, 60*time.Second, "the label keeps GPU 0 out of the slice", func() bool { return sliceDevices() == shareUUID1+";" })
	f := waitHostState(t, 10*time.Second, "why GPU 0 is not shared", func(f *v1.StateFile) bool {
		return f.DRA != nil && len(f.DRA.NotOffered) == 1 && f.DRA.NotOffered[0].Index == 0
	})
	if !strings.Contains(f.DRA.NotOffered[0].Reason, "gpud.io/shared-gpus") {
		t.Errorf("not offered because %q, want the label named", f.DRA.NotOffered[0].Reason)
	}
	mustKubectl(t, "label", "node", node, "gpud.io/shared-gpus-")
	testutil.Eventually(t, 60*time.Second, "both GPUs back in the slice", func() bool { return strings.Count(sliceDevices(), ";") == 2 })

	// A GPU that turns unhealthy is tainted in the slice at once (XID 79:
	// fallen off the bus, NoExecute; drataint_test.go has the rest).
	xid := time.Now()
	testutil.Eventually(t, 20*time.Second, "an XID 79 taints GPU 1 NoExecute", func() bool {
		double.XID(t, 1, 79) // repeated: events before gpud registered are not delivered
		return strings.Contains(deviceTaints(t), shareUUID1+"=gpud.io/unhealthy=xid-79:NoExecute,;")
	})
	t.Logf("XID → the GPU tainted in the slice: %s", time.Since(xid).Round(time.Millisecond))
}

// resourcePodScheduled is resourcePod placed by the scheduler (an
// extended resource DRA serves is allocated by the scheduler).
func resourcePodScheduled(t *testing.T, name, resource string) {
	t.Helper()
	testPod{name: name, restart: "Never", container: limitOne(resource)}.run(t)
}

// The share rule on the real cluster: a low pod and a high pod share one
// GPU (16 GiB), 4 GiB and 8 GiB. The NVML double reports the low pod's
// process at 6 GiB: it is over its share, warned (state, Event, metric)
// and left alone while the GPU has room. Then the GPU fills up so that the
// high pod's unused 6 GiB is no longer free: the low pod is preempted
// (killed), the high one untouched.
func TestShareRuleOnTheCluster(t *testing.T) {
	double, _ := deploySharing(t)
	testutil.Eventually(t, 60*time.Second, "the node's ResourceSlice", func() bool {
		out, _ := kubectl(t, "get", "resourceslices", "--field-selector", "spec.driver=gpud.io", "-o", "jsonpath={.items[*].spec.devices[*].name}")
		return strings.Count(out, "gpu-") == 2
	})
	sharePodOn(t, "srlow", "4Gi", shareUUID0, "gpud.io/priority", "low")
	sharePodOn(t, "srhigh", "8Gi", shareUUID0, "gpud.io/priority", "high")
	for _, p := range []string{"srlow", "srhigh"} {
		if out, err := kubectl(t, "wait", "--for=condition=Ready", "pod/"+p, "--timeout=90s"); err != nil {
			desc, _ := kubectl(t, "describe", "pod", p)
			t.Fatalf("%s never Ready: %v %s\n%s", p, err, out, desc)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			st, _ := kubectl(t, "get", "pod", "srlow", "-o", "jsonpath={.status}")
			ev, _ := kubectl(t, "get", "events", "--field-selector", "involvedObject.name=srlow", "-o", "custom-columns=R:.reason,M:.message")
			b, _ := json.MarshalIndent(hostState(t), "", " ")
			t.Logf("srlow status %s\nevents:\n%s\nstate:\n%s", st, ev, b)
		}
	})
	holders := fileHolders(hostStateFile)
	low, high := hold(t, holders, "srlow"), hold(t, holders, "srhigh")

	// 6 GiB on a 4 GiB share; the GPU has 8 GiB free, the high pod's
	// unused 6 GiB fits: warned, not preempted.
	double.SetProcesses(t, testutil.NVMLProcess{GPU: 0, PID: low, Memory: 6 << 30}, testutil.NVMLProcess{GPU: 0, PID: high, Memory: 2 << 30})
	share := func(f *v1.StateFile, pod string) *v1.StateShare {
		for i := range f.GPUs {
			for j, s := range f.GPUs[i].Shares {
				if s.PodName == pod {
					return &f.GPUs[i].Shares[j]
				}
			}
		}
		return nil
	}
	waitHostState(t, 20*time.Second, "the low pod over its share, warned", func(f *v1.StateFile) bool {
		s := share(f, "srlow")
		return s != nil && s.Over && s.UsedBytes == 6<<30 && s.RequestedBytes == 4<<30 && s.Priority == v1.Low && !s.Preempted
	})
	testutil.Eventually(t, 20*time.Second, "a GPUMemoryOverShare Event on the low pod", func() bool {
		out, _ := kubectl(t, "get", "events", "--field-selector", "involvedObject.name=srlow,reason=GPUMemoryOverShare", "-o", "name")
		return out != ""
	})
	if _, body := httpGet(t, "http://127.0.0.1:9407/metrics"); !strings.Contains(body, "gpud_gpu_memory_share_over{") {
		t.Errorf("no gpud_gpu_memory_share_over series:\n%s", grepLines(body, "share"))
	}
	time.Sleep(3 * time.Second) // three samples: still nobody preempted
	if !testutil.Alive(low) || !testutil.Alive(high) {
		t.Fatalf("preempted while the GPU had room: low alive %v, high alive %v", testutil.Alive(low), testutil.Alive(high))
	}

	// The GPU fills up (another context's 6 GiB): 2 GiB free, the high
	// pod was promised 6 more. The low pod, over its share, goes.
	double.SetGPUs(t,
		testutil.NVMLGPU{Index: 0, Minor: 229, UUID: shareUUID0, Name: "NVIDIA L4", MemoryTotal: 16 << 30, MemoryUsed: 14 << 30},
		testutil.NVMLGPU{Index: 1, Minor: 7, UUID: shareUUID1, Name: "NVIDIA L4", MemoryTotal: 16 << 30})
	testutil.Eventually(t, 20*time.Second, "the low pod's process killed", func() bool { return !testutil.Alive(low) })
	if !testutil.Alive(high) {
		t.Error("the high pod was preempted")
	}
	f := waitHostState(t, 20*time.Second, "a kill record for the low pod", func(f *v1.StateFile) bool { return killOf(f, low) != nil })
	if r := killOf(f, low); !strings.Contains(r.Rule, "share") {
		t.Errorf("the kill's rule %q does not name the share", r.Rule)
	}
	// A high sharer's need chose it (the shared/high row): its Event says so.
	if out, _ := kubectl(t, "get", "events", "--field-selector", "involvedObject.name=srlow,reason=GPUPreemptedForShare", "-o", "name"); out == "" {
		t.Error("no GPUPreemptedForShare Event on the low pod")
	}
}
