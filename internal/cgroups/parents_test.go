package cgroups

import (
	"slices"
	"testing"
)

// withParents trusts ps for the test (SetParents is process-wide).
func withParents(t *testing.T, ps ...string) {
	t.Helper()
	old, err := SetParents(ps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { SetParents(old) })
}

const (
	id2    = "aaaa2d4e5b6a7980a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6bbbb"
	puid   = "1a2b3c4d-0000-1111-2222-333344445555"
	puidSd = "1a2b3c4d_0000_1111_2222_333344445555"
)

// A trusted parent (Docker --cgroup-parent, nerdctl, kubelet --cgroup-root)
// names the workloads where its runtime puts them, exactly as the default
// places do; without the setting the same paths name nothing (look-alikes).
func TestParseExtraParents(t *testing.T) {
	for _, tc := range []struct {
		name, v2, cid, pod string
	}{
		{"docker --cgroup-parent, cgroupfs", "/mycontainers/" + id, id, ""},
		{"below its container", "/mycontainers/" + id + "/docker-" + id2 + ".scope", id, ""},
		{"docker --cgroup-parent, systemd", "/my.slice/docker-" + id + ".scope", id, ""},
		{"nerdctl, systemd", "/my.slice/nerdctl-" + id + ".scope", id, ""},
		{"kubelet --cgroup-root, cgroupfs, guaranteed", "/kubelet/kubepods/pod" + puid + "/" + id, id, puid},
		{"kubelet --cgroup-root, cgroupfs, burstable", "/kubelet/kubepods/burstable/pod" + puid + "/" + id, id, puid},
		{"kubelet --cgroup-root, systemd, besteffort",
			"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + puidSd + ".slice/cri-containerd-" + id + ".scope",
			id, puid},
		{"kubelet --cgroup-root, systemd, guaranteed pod alone",
			"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" + puidSd + ".slice", "", puid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withParents(t)
			info, err := Parse("0::" + tc.v2 + "\n")
			if err != nil {
				t.Fatal(err)
			}
			if info.ContainerID != "" || info.PodUID != "" {
				t.Errorf("untrusted: %+v, want no workload", info)
			}
			withParents(t, "/mycontainers", "/my.slice", "/kubelet/kubepods", "/kubelet.slice/kubelet-kubepods.slice")
			info, err = Parse("0::" + tc.v2 + "\n")
			if err != nil {
				t.Fatal(err)
			}
			if info.ContainerID != tc.cid || info.PodUID != tc.pod || info.Lookalike {
				t.Errorf("trusted: %+v, want container %q pod %q", info, tc.cid, tc.pod)
			}
			// The naming cgroups are the ones Owned checks.
			if tc.cid != "" && (info.ContainerDir == "" || len(info.ContainerDir) > len(tc.v2) || tc.v2[:len(info.ContainerDir)] != info.ContainerDir) {
				t.Errorf("container dir %q is not a prefix of %q", info.ContainerDir, tc.v2)
			}
		})
	}
}

// A trusted parent gives its place only: the same names elsewhere, a
// container not directly in it, a pod's name of another driver, or a uid
// that is no UUID name nothing.
func TestParseExtraParentsPositional(t *testing.T) {
	withParents(t, "/mycontainers", "/kubelet/kubepods", "/kubelet.slice/kubelet-kubepods.slice")
	for _, v2 := range []string{
		"/mycontainers/x/" + id,                          // not directly in the parent
		"/mycontainersx/" + id,                           // a sibling whose name begins alike
		"/user.slice/user-1000.slice/mycontainers/" + id, // the parent's name in a delegated subtree
		"/kubelet/kubepods/besteffort/x/pod" + puid,
		"/kubelet/kubepods/guaranteed/pod" + puid,                                                  // no such QoS level
		"/kubelet.slice/kubelet-kubepods.slice/kubepods-pod" + puidSd + ".slice",                   // another prefix
		"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" + puid + ".slice",             // dashes: systemd never
		"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable-pod" + puidSd + ".slice", // not in its QoS slice
	} {
		info, err := Parse("0::" + v2 + "\n")
		if err != nil {
			t.Fatal(err)
		}
		if info.ContainerID != "" || info.PodUID != "" {
			t.Errorf("%s: %+v, want no workload", v2, info)
		}
	}
}

func TestCheckParent(t *testing.T) {
	for _, ok := range []string{"/mycontainers", "/kubelet.slice/kubelet-kubepods.slice", "/a/b"} {
		if err := CheckParent(ok); err != nil {
			t.Errorf("CheckParent(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "/", "relative", "/a/../b", "/a/", "/docker/" + id, "/kubepods/pod" + puid} {
		if err := CheckParent(bad); err == nil {
			t.Errorf("CheckParent(%q) accepted", bad)
		}
		if _, err := SetParents([]string{bad}); err == nil {
			t.Errorf("SetParents(%q) accepted", bad)
		}
	}
}

// The kernel is told the trusted parents as well (ExpectedParents), and the
// pod sources find a pod's cgroup there (PodPaths).
func TestExtraParentsExpectedAndPodPaths(t *testing.T) {
	withParents(t, "/mycontainers", "/kubelet/kubepods", "/kubelet.slice/kubelet-kubepods.slice")
	for leaf, want := range map[string][]string{
		id:                        {"docker", "mycontainers", "kubelet/kubepods", "kubelet.slice/kubelet-kubepods.slice"},
		"docker-" + id + ".scope": {"system.slice", "mycontainers", "kubelet/kubepods", "kubelet.slice/kubelet-kubepods.slice"},
		"pod" + puid: {"kubepods", "kubepods/burstable", "kubepods/besteffort", "kubelet/kubepods", "kubelet/kubepods/burstable", "kubelet/kubepods/besteffort",
			"mycontainers", "mycontainers/burstable", "mycontainers/besteffort"}, // a trusted parent may hold pods too
		"kubelet-kubepods-pod" + puidSd + ".slice":           {"kubelet.slice/kubelet-kubepods.slice"},
		"kubelet-kubepods-burstable-pod" + puidSd + ".slice": {"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice"},
		"unrelated": nil,
	} {
		got := ExpectedParents(leaf)
		slices.Sort(got)
		w := slices.Clone(want)
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Errorf("ExpectedParents(%.30s) = %v, want %v", leaf, got, w)
		}
	}
	paths := PodPaths(puid, "")
	for _, p := range []string{
		"kubelet/kubepods/pod" + puid, "kubelet/kubepods/burstable/pod" + puid, "kubelet/kubepods/besteffort/pod" + puid,
		"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod" + puidSd + ".slice",
		"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + puidSd + ".slice",
	} {
		if !slices.Contains(paths, p) {
			t.Errorf("PodPaths misses %s: %v", p, paths)
		}
	}
	// Each path PodPaths gives is one Parse names the pod by, and its leaf
	// one the kernel expects in its parent.
	for _, qos := range []string{"", "Guaranteed", "Burstable", "BestEffort"} {
		for _, p := range PodPaths(puid, qos) {
			if info, _ := Parse("0::/" + p + "\n"); info.PodUID != puid {
				t.Errorf("PodPaths(%q) gives %s, which Parse reads as %+v", qos, p, info)
			}
		}
	}
	if n := PodLeafNames(puid, "Burstable"); !slices.Contains(n, "kubelet-kubepods-burstable-pod"+puidSd+".slice") {
		t.Errorf("PodLeafNames misses the trusted slice's name: %v", n)
	}
}
