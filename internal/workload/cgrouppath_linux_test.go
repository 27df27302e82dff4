package workload_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/workload"
)

// A Docker container started with --cgroup-parent is in no default place:
// the engine's word on its cgroup (Workload.CgroupPath, read from its init
// process) names it, at that path and below, wherever the parent is; the
// same leaf elsewhere, or a path beside it, names nothing (a look-alike).
func TestRecordedCgroupPathNamesTheContainer(t *testing.T) {
	const id = "3f1c2d4e5b6a7980a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718"
	cgRoot, procRoot := t.TempDir(), t.TempDir()
	for _, d := range []string{"mycontainers/" + id + "/nested", "user.slice/x/" + id, "mycontainersx/" + id} {
		if err := os.MkdirAll(filepath.Join(cgRoot, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	proc := func(pid int, v2 string) {
		dir := filepath.Join(procRoot, fmt.Sprint(pid))
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		stat := fmt.Sprintf("%d (p%d) S", pid, pid) + strings.Repeat(" 1", 18) + " 77" + strings.Repeat(" 1", 30)
		os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644)
		os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::"+v2+"\n"), 0o644)
	}
	proc(10, "/mycontainers/"+id)
	proc(11, "/mycontainers/"+id+"/nested")
	proc(12, "/user.slice/x/"+id)
	proc(13, "/mycontainersx/"+id)

	reg := &workload.Registry{Default: occupancy.Unmanaged}
	reg.Put(workload.Workload{ContainerID: id, Name: "low", Priority: occupancy.Low, CgroupPath: "/mycontainers/" + id})
	var seen cgroups.Lookalikes
	fs := &occupancy.ProcFS{Root: procRoot, CgroupRoot: cgRoot, Containers: reg.ContainerAt, Lookalikes: &seen}
	class := func(pid int) (occupancy.ProcInfo, error) {
		info, err := fs.Info(pid)
		if err == nil {
			reg.ClassifyProc(&info)
		}
		return info, err
	}
	for _, pid := range []int{10, 11} {
		info, err := class(pid)
		if err != nil || info.ContainerID != id || info.Priority != occupancy.Low {
			t.Errorf("pid %d in the recorded cgroup: %+v, %v; want the low container", pid, info, err)
		}
	}
	if n := seen.Count.Load(); n != 0 {
		t.Errorf("%d look-alikes counted for the container's own cgroups", n)
	}
	for _, pid := range []int{12, 13} {
		info, err := class(pid)
		if err != nil || info.ContainerID != "" || info.Priority != occupancy.Unmanaged {
			t.Errorf("pid %d beside the recorded cgroup: %+v, %v; want a host process", pid, info, err)
		}
	}
	if n := seen.Count.Load(); n != 2 {
		t.Errorf("look-alikes counted: %d, want 2", n)
	}
	reg.Remove(id)
	if info, _ := class(11); info.ContainerID != "" {
		t.Errorf("a removed container's cgroup still names it: %+v", info)
	}
}

func TestContainerAt(t *testing.T) {
	const a = "aaaa2d4e5b6a7980a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718"
	const b = "bbbb2d4e5b6a7980a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718"
	reg := &workload.Registry{}
	reg.Put(workload.Workload{ContainerID: a, CgroupPath: "/p/" + a})
	// A container put inside another's cgroup by its parent: the deepest wins.
	reg.Put(workload.Workload{ContainerID: b, CgroupPath: "/p/" + a + "/q/" + b})
	for path, want := range map[string]string{
		"/p/" + a:                         a,
		"/p/" + a + "/x":                  a,
		"/p/" + a + "/q/" + b + "/y":      b,
		"/p/" + a + "/q/../../" + a + "x": "",
		"/p":                              "",
		"/":                               "",
		"p/" + a:                          "",
	} {
		id, dir, ok := reg.ContainerAt(path)
		if id != want || ok != (want != "") || (ok && !strings.HasPrefix(path, dir)) {
			t.Errorf("ContainerAt(%q) = %q %q %v, want %q", path, id, dir, ok, want)
		}
	}
	// A new start elsewhere moves it; the old path names nothing.
	reg.Put(workload.Workload{ContainerID: a, CgroupPath: "/r/" + a})
	if id, _, ok := reg.ContainerAt("/p/" + a); ok {
		t.Errorf("the old path still names %s", id)
	}
	if id, _, _ := reg.ContainerAt("/r/" + a + "/z"); id != a {
		t.Errorf("the new path names %q", id)
	}
}
