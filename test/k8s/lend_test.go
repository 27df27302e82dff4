//go:build k8s

package k8s

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"log/slog"

	"github.com/gpud/gpud/internal/deviceplugin"
	"github.com/gpud/gpud/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// resourcePod is a pod asking for one device of resource, with labels
// (key: value pairs) if any.
func resourcePod(t *testing.T, name, resource string, labels ...string) {
	t.Helper()
	testPod{name: name, labels: labels, onNode: true, restart: "Never", container: limitOne(resource)}.run(t)
}

// limitOne is a container's limit of one device of resource.
func limitOne(resource string) string {
	return fmt.Sprintf("    resources: {limits: {%q: 1}}\n", resource)
}

func allocatable(t *testing.T, resource string) string {
	out, _ := kubectl(t, "get", "node", env(t, "NODE_NAME"), "-o",
		"jsonpath={.status.allocatable."+strings.ReplaceAll(resource, ".", "\\.")+"}")
	return out
}

// waitUnallocatable waits, once the plugin serving resource has stopped,
// until the node no longer counts it allocatable. kubelet marks a stopped
// plugin's devices unhealthy at once but reports them in the node's status
// up to its status interval (10 s) later: the next test, waiting for "1",
// took the old count for its own plugin's and its pod was refused ("no
// healthy devices present"), as in the second run of `go test -count=3`.
func waitUnallocatable(t *testing.T, resource string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, resource+" no longer allocatable after its plugin stopped", func() bool {
		n := allocatable(t, resource)
		return n == "" || n == "0"
	})
}

func registrations(t *testing.T, gp string) int {
	out, _ := kubectl(t, "-n", "gpud-system", "logs", gp)
	return strings.Count(out, "device plugin registered")
}

// A pod admitted before gpud registered runs without the GPU it asked for
// (kubelet does not fail it): gpud reports it, with an Event on the pod.
func TestPodAdmittedBeforeRegistrationIsReported(t *testing.T) {
	dev, _ := fakeGPU(t)
	// A resource no test registered before (kubelet keeps a pod asking a
	// resource it once knew Pending), whatever order the tests run in, and
	// no earlier run of this test (go test -count=3): the node keeps a
	// stopped plugin's resource in its capacity for 5 minutes.
	early := fmt.Sprintf("gpud.io/early-idle-gpu-%d", time.Now().UnixNano())
	resourcePod(t, "early", early)
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/early", "--timeout=60s")
	deployLending(t, dev, "{op: add, path: /spec/template/spec/containers/0/args/-, value: --resource-name="+early+"}")
	testutil.Eventually(t, 30*time.Second, "an Event reports the pod running without its GPU", func() bool {
		out, _ := kubectl(t, "get", "events", "--field-selector", "involvedObject.name=early,reason=GPUNotAllocated", "-o", "name")
		return out != ""
	})
}

// Lending on the real kubelet, gpud in its DaemonSet pod: the
// owner holds the GPU through a stand-in for nvidia.com/gpu and goes idle;
// a borrower asking gpud.io/idle-gpu gets it with its env; the owner's open
// kills the borrower and the GPU is listed Unhealthy; a request for a GPU
// that is busy is refused; kubelet, then containerd, restart during a
// second loan, and the owner still takes its GPU back.
func TestLendIdleGPUOnARealKubelet(t *testing.T) {
	dev, gpu := fakeGPU(t)
	startStandin(t, gpu)

	root, _ := filepath.Abs("../..")
	gp := deployLending(t, dev)
	podRes := filepath.Join(env(t, "KUBELET_ROOT"), "pod-resources")
	testutil.Eventually(t, 30*time.Second, "gpud registered gpud.io/idle-gpu and kubelet lists it", func() bool {
		return allocatable(t, "gpud.io/idle-gpu") != "" && allocatable(t, "nvidia.com/gpu") == "1"
	})

	// The owner holds the GPU through nvidia.com/gpu, then goes idle.
	resourcePod(t, "owner", "nvidia.com/gpu")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/owner", "--timeout=60s")
	ownerPID := hold(t, podHolders(t, gp), "owner")
	testutil.Eventually(t, 15*time.Second, "the idle GPU is listed Healthy", func() bool { return allocatable(t, "gpud.io/idle-gpu") == "1" })

	// A borrower gets it, with the device and the env inside.
	resourcePod(t, "borrower", "gpud.io/idle-gpu")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/borrower", "--timeout=60s")
	envs := mustKubectl(t, "exec", "borrower", "--", "sh", "-c", "echo $GPUD_GPU $GPUD_OWNER $NVIDIA_VISIBLE_DEVICES; ls /dev/nvidia0")
	if envs != "0 default/owner 0\n/dev/nvidia0" {
		t.Fatalf("inside the borrower: %q", envs)
	}
	alloc, err := deviceplugin.ListAllocated(context.Background(), filepath.Join(podRes, "kubelet.sock"))
	if err != nil || len(alloc["gpud.io/idle-gpu"]) != 1 || alloc["gpud.io/idle-gpu"][0].Name != "borrower" {
		t.Fatalf("PodResources: %+v %v", alloc, err)
	}
	borrowerPID := hold(t, podHolders(t, gp), "borrower")
	testutil.Eventually(t, 10*time.Second, "the state file shows the loan", func() bool {
		out, _ := kubectl(t, "-n", "gpud-system", "exec", gp, "--", "/gpud", "status", "-o", "json")
		return strings.Contains(out, `"state": "lent"`) && strings.Contains(out, `"owner": "default/owner"`) &&
			strings.Contains(out, `"borrower": "default/borrower"`)
	})

	// A request for a GPU that is busy now (the borrower uses it) is refused
	// with a clear error, never silently granted.
	conn, err := grpc.NewClient("unix://"+filepath.Join(env(t, "DEVICE_PLUGINS_DIR"), "gpud.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = pluginapi.NewDevicePluginClient(conn).Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"gpu-0"}}}})
	conn.Close()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "no longer lendable") {
		t.Fatalf("Allocate of a busy GPU: %v, want FailedPrecondition", err)
	}

	// The owner comes back: its open kills the borrower, which is evicted;
	// the GPU is listed Unhealthy (seen on a ListAndWatch stream of our own,
	// beside kubelet's: the node's allocatable is only refreshed every 10 s).
	health := watchHealth(t, filepath.Join(env(t, "DEVICE_PLUGINS_DIR"), "gpud.sock"), "gpu-0")
	start := time.Now()
	if out := mustKubectl(t, "exec", "owner", "--", "sh", "-c", "exec 4<>/dev/nvidia0 && echo back"); out != "back" {
		t.Fatalf("owner's open: %q", out)
	}
	testutil.Eventually(t, 10*time.Second, "the borrower's process is dead", func() bool { return !testutil.Alive(borrowerPID) })
	t.Logf("owner's open → borrower dead within %v (kubectl exec included)", time.Since(start))
	// gpud's own figure: decision (the owner's open, at the gate) → borrower
	// confirmed dead, from its preemption record.
	testutil.Eventually(t, 10*time.Second, "a kill record for the borrower", func() bool {
		ms, ok := killRecords(t, gp)[borrowerPID]
		if ok {
			t.Logf("gpud's record: owner's open → borrower dead in %.2f ms", ms)
			if ms > 250 {
				t.Errorf("borrower kill took %.2f ms", ms)
			}
		}
		return ok
	})
	testutil.Eventually(t, 30*time.Second, "the borrower pod is gone", func() bool { _, err := kubectl(t, "get", "pod", "borrower"); return err != nil })
	waitHealth(t, health, pluginapi.Unhealthy, 5*time.Second)

	// Idle again, a second borrower; kubelet restarts: gpud re-registers
	// within 2 s and the running borrower keeps its device.
	waitHealth(t, health, pluginapi.Healthy, 15*time.Second)
	resourcePod(t, "borrower2", "gpud.io/idle-gpu")
	mustKubectl(t, "wait", "--for=condition=Ready", "pod/borrower2", "--timeout=60s")
	b2 := hold(t, podHolders(t, gp), "borrower2")
	before := registrations(t, gp)
	out, err := exec.Command(filepath.Join(root, "scripts/cluster.sh"), "restart-kubelet", env(t, "GPUD_CLUSTER_DIR")).CombinedOutput()
	if err != nil {
		t.Fatalf("restart-kubelet: %v %s", err, out)
	}
	restarted := time.Now()
	testutil.Eventually(t, 10*time.Second, "gpud re-registered", func() bool { return registrations(t, gp) > before })
	if took := time.Since(restarted); took > 2*time.Second+time.Second { // the log poll itself costs up to ~1 s
		t.Errorf("re-registration took %v after kubelet was back", took)
	} else {
		t.Logf("re-registered %v after kubelet was back (log polling included)", took)
	}
	if !testutil.Alive(b2) {
		t.Fatal("the running borrower lost its process across the kubelet restart")
	}
	if out := mustKubectl(t, "exec", "borrower2", "--", "ls", "/dev/nvidia0"); out != "/dev/nvidia0" {
		t.Fatalf("borrower2's device after the restart: %q", out)
	}

	// containerd restarts during the loan: the borrower runs on (its shim
	// outlives containerd), gpud keeps the loan, and the owner's next open
	// still takes the GPU back. No borrower is orphaned by the restarts of
	// kubelet and containerd.
	if out, err := exec.Command(filepath.Join(root, "scripts/cluster.sh"), "restart-containerd", env(t, "GPUD_CLUSTER_DIR")).CombinedOutput(); err != nil {
		t.Fatalf("restart-containerd: %v %s", err, out)
	}
	if !testutil.Alive(b2) {
		t.Fatal("the running borrower lost its process across the containerd restart")
	}
	testutil.Eventually(t, 10*time.Second, "the loan to borrower2 is still shown", func() bool {
		out, _ := kubectl(t, "-n", "gpud-system", "exec", gp, "--", "/gpud", "status", "-o", "json")
		return strings.Contains(out, `"state": "lent"`) && strings.Contains(out, `"borrower": "default/borrower2"`)
	})
	// kubelet reconnects to containerd by itself; exec works again then.
	testutil.Eventually(t, 30*time.Second, "the owner opens its GPU again", func() bool {
		out, err := kubectl(t, "exec", "owner", "--", "sh", "-c", "exec 5<>/dev/nvidia0 && echo back")
		return err == nil && out == "back"
	})
	testutil.Eventually(t, 10*time.Second, "borrower2's process is dead", func() bool { return !testutil.Alive(b2) })
	testutil.Eventually(t, 10*time.Second, "a kill record for borrower2", func() bool { _, ok := killRecords(t, gp)[b2]; return ok })
	testutil.Eventually(t, 30*time.Second, "borrower2 is evicted and gone", func() bool { _, err := kubectl(t, "get", "pod", "borrower2"); return err != nil })
	if !testutil.Alive(ownerPID) {
		t.Fatal("the owner was harmed")
	}
}

// startStandin serves a stand-in for NVIDIA's device plugin until the test
// ends: resource nvidia.com/gpu, its device "0" the fake GPU node, through
// which owner pods hold the GPU.
func startStandin(t *testing.T, gpu string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	standin := &deviceplugin.Plugin{ResourceName: "nvidia.com/gpu", KubeletDir: env(t, "DEVICE_PLUGINS_DIR"),
		Endpoint: "test-nvidia.sock", Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Backend: &deviceplugin.Static{Nodes: map[string]string{"0": gpu}, ContainerPath: map[string]string{"0": "/dev/nvidia0"}}}
	done := make(chan struct{})
	go func() { standin.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; waitUnallocatable(t, "nvidia.com/gpu") })
}

// watchHealth follows gpud's ListAndWatch stream: the health of device
// id (gpu-0 for the fake GPU without NVML, its UUID with).
func watchHealth(t *testing.T, sock, id string) <-chan string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 64)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			for _, d := range resp.Devices {
				if d.ID == id {
					select {
					case out <- d.Health:
					default:
					}
				}
			}
		}
	}()
	return out
}

// waitHealth waits until the stream reports the watched device as want.
func waitHealth(t *testing.T, health <-chan string, want string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case h := <-health:
			if h == want {
				return
			}
		case <-deadline:
			t.Fatalf("the lent device never listed %s", want)
		}
	}
}

// deployLending deploys gpud with the device plugin on (idle after 2 s),
// pointed at the fake GPU directory and the test kubelet's PodResources.
func deployLending(t *testing.T, dev string, extra ...string) string {
	t.Helper()
	podRes := filepath.Join(env(t, "KUBELET_ROOT"), "pod-resources")
	return deployGpud(t, dev, append([]string{
		fmt.Sprintf("{op: replace, path: /spec/template/spec/volumes/4/hostPath/path, value: %s}", podRes),
		"{op: add, path: /spec/template/spec/containers/0/args/-, value: --device-plugin}",
		fmt.Sprintf("{op: add, path: /spec/template/spec/containers/0/args/-, value: --host-dev-dir=%s}", dev),
		"{op: add, path: /spec/template/spec/containers/0/args/-, value: --idle-after=2s}"}, extra...)...)
}
