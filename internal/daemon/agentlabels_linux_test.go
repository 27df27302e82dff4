package daemon_test

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// dockerAgentEnv is an enforcing daemon on the Docker host with
// --default-priority low and the default agents.
func dockerAgentEnv(t *testing.T) *env {
	t.Helper()
	testutil.RequireRoot(t)
	e := enforcingEnv(t, "none")
	e.cfg.DefaultPriority = occupancy.Low
	e.start()
	return e
}

// holdAs starts, in the container, a root process that holds /dev/nvidiaN
// under the name comm (a script of that name: the kernel names a process
// after the file it execs) and blocks on a FIFO; it returns its host PID.
func (c *ctr) holdAs(gpu int, comm string) int {
	c.t.Helper()
	script := fmt.Sprintf(`mkfifo /tmp/f%[1]d; printf '#!/bin/sh\nexec 4<>/tmp/f%[1]d\nwhile :; do read x <&4; done\n' >/tmp/%[2]s; chmod +x /tmp/%[2]s; exec 3<>/dev/nvidia%[1]d; exec /tmp/%[2]s`, gpu, comm)
	if out, err := exec.Command("docker", "exec", "-d", c.id, "sh", "-c", script).CombinedOutput(); err != nil {
		c.t.Fatalf("docker exec: %v %s", err, out)
	}
	want := comm
	if len(want) > 15 {
		want = want[:15]
	}
	var pid int
	testutil.Eventually(c.t, 5*time.Second, "the process named "+comm+" holds the GPU", func() bool {
		for _, p := range c.pids() {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p))
			if fds, _ := c.e.truth.GPUFDs(p); strings.TrimSpace(string(b)) == want && len(fds[gpu]) > 0 {
				pid = p
				return true
			}
		}
		return false
	})
	return pid
}

// A name never makes a workload's process an agent (#32, class 3): a root
// process of an unlabelled container (low by default) that execs a copy
// named nvidia-persistenced is an ordinary low holder, and a high open
// kills it.
func TestAgentNameInContainerIsNoAgent(t *testing.T) {
	e := dockerAgentEnv(t)
	lo := e.container("fake-agent")
	fake := lo.holdAs(0, "nvidia-persistenced")
	testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		return testutil.HolderPriority(f, 0, fake) == occupancy.Low
	})
	if ex, err := e.d.Explain(fake); err != nil || ex.Reason == workload.ReasonAgent || ex.Priority != occupancy.Low {
		t.Errorf("explain of the container's nvidia-persistenced: %+v, %v", ex, err)
	}
	hi := e.container("fake-agent-hi", workload.LabelPriority+"=high")
	hi.hold(0)
	waitDead(t, e, fake, "a high open kills the container's process named like an agent")
}

// A container the operator started with gpud.io/agent=true is an agent
// whatever --default-priority says (#32, class 3): its process holding a
// GPU is listed under agents, not holders; a high open does not kill it;
// its own open of the GPU high holds is not refused by the kernel; and
// explain says so, allowing every GPU.
func TestAgentContainerNeverKilledNorRefused(t *testing.T) {
	e := dockerAgentEnv(t)
	ag := e.container("agent", workload.LabelAgent+"=true")
	pid := ag.hold(0)
	testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		return slices.Contains(pids(f.GPUs[0].Agents), pid) && !slices.Contains(pids(f.GPUs[0].Holders), pid)
	})
	hi := e.container("agent-hi", workload.LabelPriority+"=high")
	hiPID := hi.hold(0)
	testutil.WaitStateFile(t, e.cfg.StateFile, 5*time.Second, func(f *v1.StateFile) bool {
		return testutil.HolderPriority(f, 0, hiPID) == occupancy.High
	})
	time.Sleep(500 * time.Millisecond) // a kill would have come by now
	if !testutil.Alive(pid) {
		t.Fatal("a high open killed the agent container's holder")
	}
	if got := ag.tryOpen(0); got != "opened" {
		t.Errorf("the agent container's open of a GPU high holds: %q, want opened", got)
	}
	ex, err := e.d.Explain(pid)
	if err != nil || ex.Reason != workload.ReasonAgent || ex.Priority != occupancy.Unmanaged {
		t.Fatalf("explain of the agent: %+v, %v", ex, err)
	}
	for _, g := range ex.GPUs {
		if !g.Allow {
			t.Errorf("explain refuses the agent GPU %d (%s), which the kernel allowed", g.Index, g.Rule)
		}
	}
	// A low container beside it is refused: the gate enforces.
	lo := e.container("agent-lo")
	if got := lo.tryOpen(0); strings.Contains(got, "opened") {
		t.Errorf("a low open of the high-held GPU: %q, want refused", got)
	}
}

// An image's LABELs reach its containers' labels in Docker; a gpud.io/
// label counts only when the container was given it (#32, class 6e). An
// unlabelled container of an image declaring gpud.io/priority=high and
// gpud.io/agent=true gets the default (low), is no agent, and the kernel
// refuses its open of a GPU high holds. Given gpud.io/priority=high itself
// with another value on the image, a container keeps its own label.
func TestImageLabelsDoNotClassify(t *testing.T) {
	e := dockerAgentEnv(t)
	img := fmt.Sprintf("gpud-test-labelled:%d", time.Now().UnixNano())
	base, err := exec.Command("docker", "create", "gpud-test-busybox:latest", "true").CombinedOutput()
	if err != nil {
		t.Fatalf("docker create: %v %s", err, base)
	}
	id := strings.TrimSpace(string(base))
	defer exec.Command("docker", "rm", "-f", id).Run()
	if out, err := exec.Command("docker", "commit", "--change", "LABEL "+workload.LabelPriority+"=high",
		"--change", "LABEL "+workload.LabelAgent+"=true", "--change", "LABEL "+workload.LabelPreemptMode+"=freeze", id, img).CombinedOutput(); err != nil {
		t.Fatalf("docker commit: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", img).Run() })

	hi := e.container("image-hi", workload.LabelPriority+"=high")
	hi.hold(1)
	c := e.containerFrom(img, "image-labelled")
	w, _ := e.d.Registry().Lookup(occupancy.ProcInfo{ContainerID: c.id})
	if w.Priority != occupancy.Low || w.Agent || w.PreemptMode != "" {
		t.Errorf("a container whose image declares gpud.io/ labels: %+v, want the default low, no agent, no mode", w)
	}
	if got := c.tryOpen(1); strings.Contains(got, "opened") {
		t.Errorf("its open of a GPU high holds: %q, want refused", got)
	}
	own := e.containerFrom(img, "image-own", workload.LabelPriority+"=low")
	if w, _ := e.d.Registry().Lookup(occupancy.ProcInfo{ContainerID: own.id}); w.Priority != occupancy.Low {
		t.Errorf("a container given its own label low: %+v", w)
	}
	if n := e.d.Registry().ImageLabelsDropped.Load(); n < 2 {
		t.Errorf("image labels dropped for %d containers, want 2", n)
	}
}

// containerFrom is e.container with another image.
func (e *env) containerFrom(image, name string, labels ...string) *ctr {
	e.t.Helper()
	args := []string{"run", "-d", "--network", "none", "--name", name + "-" + fmt.Sprint(time.Now().UnixNano()%1e9),
		"--device", e.gpus[0].Path + ":/dev/nvidia0", "--device", e.gpus[1].Path + ":/dev/nvidia1"}
	for _, l := range labels {
		args = append(args, "--label", l)
	}
	args = append(args, image, "sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait")
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		e.t.Fatalf("docker run: %v %s", err, out)
	}
	c := &ctr{t: e.t, e: e, id: strings.TrimSpace(string(out))}
	e.t.Cleanup(func() { exec.Command("docker", "rm", "-f", c.id).Run() })
	testutil.Eventually(e.t, 5*time.Second, "container "+name+" classified", func() bool {
		w, ok := e.d.Registry().Lookup(occupancy.ProcInfo{ContainerID: c.id})
		return ok && w.CgroupID != 0
	})
	return c
}
