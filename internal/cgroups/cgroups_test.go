package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestV2RootFrom(t *testing.T) {
	hybrid := `25 1 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs rw
26 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
35 25 0:33 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
`
	pure := `30 1 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate
`
	for _, tc := range []struct {
		in   string
		root string
		mode Mode
		err  error
	}{
		{hybrid, "/sys/fs/cgroup/unified", Hybrid, nil},
		{pure, "/sys/fs/cgroup", Unified, nil},
		{"26 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", "", "", ErrNoV2},
		{"garbage\n\n - \n", "", "", ErrNoV2},
	} {
		root, mode, err := v2RootFrom(strings.NewReader(tc.in))
		if !errors.Is(err, tc.err) || root != tc.root || mode != tc.mode {
			t.Errorf("v2RootFrom = %q %q %v, want %q %q %v", root, mode, err, tc.root, tc.mode, tc.err)
		}
	}
}

const id = "3f1c2d4e5b6a7980a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in         string
		v2, cid, rt, pod string
	}{
		{"host", "0::/\n", "/", "", "", ""},
		{"docker v2 systemd", "0::/system.slice/docker-" + id + ".scope\n", "/system.slice/docker-" + id + ".scope", id, "docker", ""},
		{"docker v1 hybrid", "4:memory:/docker/" + id + "\n1:cpu:/docker/" + id + "\n0::/\n", "/", id, "docker", ""},
		{"kubepods systemd", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b3c4d_0000_1111_2222_333344445555.slice/cri-containerd-" + id + ".scope\n",
			"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b3c4d_0000_1111_2222_333344445555.slice/cri-containerd-" + id + ".scope",
			id, "containerd", "1a2b3c4d-0000-1111-2222-333344445555"},
		{"kubepods cgroupfs", "0::/kubepods/burstable/pod1a2b3c4d-0000-1111-2222-333344445555/" + id + "\n",
			"/kubepods/burstable/pod1a2b3c4d-0000-1111-2222-333344445555/" + id, id, "", "1a2b3c4d-0000-1111-2222-333344445555"},
		{"static pod (hash uid)", "0::/kubepods/besteffort/pod15eb05479cc0a401db8494898de6d2f9/" + id + "\n",
			"/kubepods/besteffort/pod15eb05479cc0a401db8494898de6d2f9/" + id, id, "", "15eb05479cc0a401db8494898de6d2f9"},
		{"guaranteed pod slice", "0::/kubepods.slice/kubepods-pod1a2b3c4d_0000_1111_2222_333344445555.slice/crio-" + id + ".scope\n",
			"/kubepods.slice/kubepods-pod1a2b3c4d_0000_1111_2222_333344445555.slice/crio-" + id + ".scope", id, "crio", "1a2b3c4d-0000-1111-2222-333344445555"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := Parse(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			want := Info{V2Path: tc.v2, ContainerID: tc.cid, Runtime: tc.rt, PodUID: tc.pod}
			info.PodDir, info.ContainerDir = "", "" // TestParseTrusted
			if info != want {
				t.Errorf("Parse = %+v, want %+v", info, want)
			}
		})
	}
}

// A container's or pod's name counts only where its runtime puts it, read
// from the root: the same leaf anywhere else (a delegated subtree's owner
// makes any name there) is a look-alike and names no workload, and
// anything below a workload's own cgroup is that workload's.
func TestParseTrusted(t *testing.T) {
	const pod = "1a2b3c4d-0000-1111-2222-333344445555"
	podU := strings.ReplaceAll(pod, "-", "_")
	other := strings.Repeat("e", 64)
	for _, tc := range []struct {
		name, path     string
		cid, rt, pod   string
		ctrDir, podDir string
		lookalike      bool
	}{
		{"docker systemd", "/system.slice/docker-" + id + ".scope", id, "docker", "", "/system.slice/docker-" + id + ".scope", "", false},
		{"docker cgroupfs", "/docker/" + id, id, "docker", "", "/docker/" + id, "", false},
		{"docker nested below its own", "/docker/" + id + "/docker-" + other + ".scope", id, "docker", "", "/docker/" + id, "", false},
		{"user subtree, scope name", "/user.slice/user-65534.slice/user@65534.service/docker-" + id + ".scope", "", "", "", "", "", true},
		{"user subtree, bare id", "/user.slice/user-65534.slice/user@65534.service/app.slice/" + id, "", "", "", "", "", true},
		{"docker name under another slice", "/machine.slice/docker-" + id + ".scope", "", "", "", "", "", true},
		{"docker below a made-up docker dir", "/x/docker/" + id, "", "", "", "", "", true},
		{"containerd scope outside a pod", "/system.slice/cri-containerd-" + id + ".scope", "", "", "", "", "", true},
		{"bare id at the root", "/" + id, "", "", "", "", "", true},
		{"pod cgroupfs guaranteed", "/kubepods/pod" + pod + "/" + id, id, "", pod, "/kubepods/pod" + pod + "/" + id, "/kubepods/pod" + pod, false},
		{"pod cgroupfs, deeper", "/kubepods/besteffort/pod" + pod + "/" + id + "/docker-" + other + ".scope", id, "", pod, "/kubepods/besteffort/pod" + pod + "/" + id, "/kubepods/besteffort/pod" + pod, false},
		{"pod systemd, container below", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podU + ".slice/crio-" + id + ".scope", id, "crio", pod,
			"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podU + ".slice/crio-" + id + ".scope", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podU + ".slice", false},
		{"pod's own cgroup", "/kubepods/burstable/pod" + pod, "", "", pod, "", "/kubepods/burstable/pod" + pod, false},
		{"container two below a pod", "/kubepods/pod" + pod + "/x/" + id, "", "", pod, "", "/kubepods/pod" + pod, false},
		{"pod dir under a user subtree", "/user.slice/kubepods/pod" + pod + "/" + id, "", "", "", "", "", true},
		{"pod slice, wrong qos parent", "/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod" + podU + ".slice", "", "", "", "", "", true},
		{"pod slice at the root", "/kubepods-pod" + podU + ".slice", "", "", "", "", "", true},
		{"pod dir, unknown qos dir", "/kubepods/weird/pod" + pod, "", "", "", "", "", true},
		{"host", "/user.slice/user-0.slice/session-1.scope", "", "", "", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, err := Parse("0::" + tc.path + "\n")
			if err != nil {
				t.Fatal(err)
			}
			want := Info{V2Path: tc.path, ContainerID: tc.cid, Runtime: tc.rt, PodUID: tc.pod,
				ContainerDir: tc.ctrDir, PodDir: tc.podDir, Lookalike: tc.lookalike}
			if info != want {
				t.Errorf("Parse = %+v,\nwant %+v", info, want)
			}
		})
	}
	// Ids read from a v1 line name no v2 cgroup to check for its owner.
	info, err := Parse("4:memory:/docker/" + id + "\n0::/\n")
	if err != nil || info.ContainerID != id || info.ContainerDir != "" {
		t.Errorf("v1 docker: %+v %v", info, err)
	}
}

// Owned keeps ids only where the naming cgroups are root's (gpud's own
// uid: whoever runs the test); another user's (only root can make one
// here) or a gone cgroup names no workload.
func TestOwned(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "docker", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	info, err := Parse("0::/docker/" + id + "/sub\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := Owned(root, info); got != info {
		t.Errorf("own cgroup: Owned = %+v, want %+v", got, info)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if got, want := Owned(root, info), (Info{V2Path: info.V2Path, Lookalike: true}); got != want {
			t.Errorf("a cgroup not root's: Owned = %+v, want %+v", got, want)
		}
	}
	if want := (Info{V2Path: info.V2Path, Lookalike: true}); Owned(t.TempDir(), info) != want {
		t.Errorf("a cgroup gone: Owned kept the ids")
	}
}

func TestParseRejectsGarbage(t *testing.T) {
	for _, in := range []string{"", "\n", "nonsense", "0:x", "1:cpu:relative"} {
		if _, err := Parse(in); !errors.Is(err, ErrBadCgroupFile) {
			t.Errorf("Parse(%q) err = %v, want ErrBadCgroupFile", in, err)
		}
	}
}

func TestLeafNames(t *testing.T) {
	id := strings.Repeat("ab", 32)
	if got := DockerLeafNames(id); len(got) != 2 || got[0] != "docker-"+id+".scope" || got[1] != id {
		t.Errorf("DockerLeafNames: %q", got)
	}
	for _, bad := range []string{"", "abc", "../" + id[3:], strings.ToUpper(id)} {
		if got := DockerLeafNames(bad); got != nil {
			t.Errorf("DockerLeafNames(%q) = %q, want nil", bad, got)
		}
	}
	uid := "0a1b2c3d-0000-1111-2222-333344445555"
	want := []string{"pod" + uid, "kubepods-burstable-pod0a1b2c3d_0000_1111_2222_333344445555.slice"}
	if got := PodLeafNames(uid, "Burstable"); !slices.Equal(got, want) {
		t.Errorf("PodLeafNames burstable: %q, want %q", got, want)
	}
	// Unknown QoS: every class's name, each once.
	if got := PodLeafNames(uid, ""); len(got) != 4 {
		t.Errorf("PodLeafNames, QoS unknown: %q", got)
	}
	if got := PodLeafNames("../x", "Guaranteed"); got != nil {
		t.Errorf("PodLeafNames of a bad uid: %q", got)
	}
}
