package daemon_test

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/status"
	"github.com/gpud/gpud/internal/testutil"
	"github.com/gpud/gpud/internal/workload"
)

// TestStateFileNamesHolders: the state file names a holder's workload, a
// pod by namespace and name (as the kube source registers it, with its
// UID), a Docker container by its name; `gpud status` shows those names,
// not the UID's or the container ID's prefix.
func TestStateFileNamesHolders(t *testing.T) {
	e := newEnv(t)
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		testutil.Skip(t, fmt.Sprintf("no Docker engine (make test starts one): %v %s", err, out))
	}
	e.start()

	// A pod's process: its cgroup registered as the pod source does.
	const podUID = "7d3f0c1e-aaaa-bbbb-cccc-0123456789ab"
	dir, cg := testutil.Cgroup(t, "names-pod")
	e.d.Registry().Put(workload.Workload{PodUID: podUID, Namespace: "team-a", Name: "trainer-0", Priority: occupancy.Low, CgroupID: cg})
	h := startHelper(t)
	testutil.JoinCgroup(t, dir, h.pid())
	h.doInt("open %s", e.gpus[0].Path)

	// A Docker container, named.
	name := fmt.Sprintf("names-%d", time.Now().UnixNano()%1e8) // fits the table's column
	id := dockerHolding(t, e.gpus[1], "--name", name)

	holder := func(f *v1.StateFile, gpu int) *v1.StateHolder {
		if gpu < len(f.GPUs) && len(f.GPUs[gpu].Holders) > 0 {
			return &f.GPUs[gpu].Holders[0]
		}
		return nil
	}
	f := testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		p, c := holder(f, 0), holder(f, 1)
		return p != nil && p.Pod != "" && c != nil && c.Container != ""
	})
	if p := holder(f, 0); p.PID != h.pid() || p.Namespace != "team-a" || p.Pod != "trainer-0" {
		t.Errorf("pod holder: %+v, want team-a/trainer-0", *p)
	}
	if c := holder(f, 1); c.ContainerID != id || c.Container != name || c.Namespace != "" || c.Pod != "" {
		t.Errorf("container holder: %+v, want container %s", *c, name)
	}
	// The control API's document is the same.
	if s := e.d.State(); holder(&s, 0) == nil || holder(&s, 0).Pod != "trainer-0" {
		t.Errorf("State(): %+v", s.GPUs[0].Holders)
	}

	var table bytes.Buffer
	if err := status.Render(&table, f, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"team-a/trainer-0", "ctr/" + name} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if strings.Contains(table.String(), "pod/7d3f") {
		t.Errorf("table shows the pod's UID:\n%s", table.String())
	}
}
