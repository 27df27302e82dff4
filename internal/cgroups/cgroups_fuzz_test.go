package cgroups

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	hexID   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	podUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$|^[0-9a-f]{32}$`)
)

// FuzzParse: whatever a /proc/<pid>/cgroup file holds, Parse either refuses
// it with ErrBadCgroupFile, or returns ids that are well formed (a 64-hex
// container id, a UUID or 32-hex pod uid, or empty), that the file really
// names, a known runtime only with a container, and a v2 path from the
// file's "0::" line. A holder is never attributed to a workload whose id
// the file does not contain.
func FuzzParse(f *testing.F) {
	const pod = "1a2b3c4d-0000-1111-2222-333344445555"
	podU := strings.ReplaceAll(pod, "-", "_")
	// Real files: host, Docker (systemd and cgroupfs drivers, hybrid),
	// kubelet (both drivers, every QoS class, static pods), CRI-O.
	f.Add("0::/\n")
	f.Add("0::/user.slice/user-0.slice/session-1.scope\n")
	f.Add("0::/system.slice/docker-" + id + ".scope\n")
	f.Add("4:memory:/docker/" + id + "\n1:cpu:/docker/" + id + "\n0::/\n")
	f.Add("0::/docker/" + id + "\n")
	f.Add("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + podU + ".slice/cri-containerd-" + id + ".scope\n")
	f.Add("0::/kubepods.slice/kubepods-pod" + podU + ".slice/crio-" + id + ".scope\n")
	f.Add("0::/kubepods/burstable/pod" + pod + "/" + id + "\n")
	f.Add("0::/kubepods/besteffort/pod15eb05479cc0a401db8494898de6d2f9/" + id + "\n")
	f.Add("12:pids:/kubepods/pod" + pod + "/" + id + "\n0::/kubepods/pod" + pod + "/" + id + "\n")
	// A container's own nested cgroups under its id.
	f.Add("0::/system.slice/docker-" + id + ".scope/init\n")
	f.Add("0::/docker/" + id + "/sub\n")
	// Near misses: ids one short, upper case, not hex; a UUID made of
	// dashes; wrong separators; relative paths; no v2 line; garbage.
	f.Add("0::/system.slice/docker-" + id[1:] + ".scope\n")
	f.Add("0::/system.slice/docker-" + strings.ToUpper(id) + ".scope\n")
	f.Add("0::/system.slice/docker-" + strings.Repeat("g", 64) + ".scope\n")
	f.Add("0::/kubepods/pod" + strings.Repeat("-", 36) + "/x\n")
	f.Add("0::/kubepods.slice/kubepods-pod" + strings.Repeat("_", 36) + ".slice\n")
	f.Add("0::/kubepods/pod" + pod[:35] + "/x\n")
	f.Add("0::/kubepods/pod" + pod + "0/x\n")
	f.Add("0::relative\n")
	f.Add("0:/\n")
	f.Add("\n\n")
	f.Add("")
	f.Add("0::/\r\n")
	f.Add("0::/a:b:c\n1:name=systemd:/x\n")
	f.Fuzz(func(t *testing.T, in string) {
		info, err := Parse(in)
		if err != nil {
			if !errors.Is(err, ErrBadCgroupFile) {
				t.Fatalf("error not ErrBadCgroupFile: %v", err)
			}
			if info != (Info{}) {
				t.Fatalf("info returned with an error: %+v", info)
			}
			return
		}
		if again, _ := Parse(in); again != info {
			t.Fatalf("not deterministic: %+v then %+v", info, again)
		}
		if info.ContainerID != "" {
			if !hexID.MatchString(info.ContainerID) {
				t.Fatalf("container id %q is not 64 hex digits", info.ContainerID)
			}
			if !strings.Contains(in, info.ContainerID) {
				t.Fatalf("container id %q is not in the file", info.ContainerID)
			}
		}
		switch info.Runtime {
		case "":
		case "docker", "containerd", "crio":
			if info.ContainerID == "" {
				t.Fatalf("runtime %q without a container", info.Runtime)
			}
		default:
			t.Fatalf("runtime %q", info.Runtime)
		}
		if info.PodUID != "" {
			if !podUUID.MatchString(info.PodUID) {
				t.Fatalf("pod uid %q is neither a UUID nor 32 hex digits", info.PodUID)
			}
			if !strings.Contains(in, info.PodUID) && !strings.Contains(in, strings.ReplaceAll(info.PodUID, "-", "_")) {
				t.Fatalf("pod uid %q is not in the file", info.PodUID)
			}
		}
		// The v2 path is the path of a "0::" line.
		var v2 []string
		for _, line := range strings.Split(in, "\n") {
			if p, ok := strings.CutPrefix(line, "0::"); ok {
				v2 = append(v2, p)
			}
		}
		if len(v2) == 0 && info.V2Path != "" || len(v2) > 0 && info.V2Path != v2[len(v2)-1] {
			t.Fatalf("v2 path %q, file's 0:: paths %q", info.V2Path, v2)
		}
		// The v2 line decides when it names a container: what the path
		// alone says is what Parse says.
		if info.V2Path != "" {
			if cid, rt := ContainerFromPath(info.V2Path); cid != "" && (cid != info.ContainerID || rt != info.Runtime) {
				t.Fatalf("v2 path names %q (%q), Parse says %q (%q)", cid, rt, info.ContainerID, info.Runtime)
			}
		}
	})
}

// FuzzContainerFromPath: a container is named only at a runtime's place,
// read from the root: /docker/<id>, /system.slice/docker-<id>.scope, or the
// element right below a pod's cgroup at kubelet's place; whatever comes
// below it is that container's.
func FuzzContainerFromPath(f *testing.F) {
	f.Add("/docker/" + id)
	f.Add("/docker/" + id + "/sub")
	f.Add("/docker/x/" + id)
	f.Add("/kubepods/besteffort/pod15eb05479cc0a401db8494898de6d2f9/" + id)
	f.Add("/system.slice/docker-" + id + ".scope")
	f.Add("/system.slice/cri-containerd-" + id + ".scope/" + id)
	f.Add("/user.slice/user-1000.slice/user@1000.service/docker-" + id + ".scope")
	f.Add("")
	f.Add("/")
	f.Fuzz(func(t *testing.T, p string) {
		cid, rt := ContainerFromPath(p)
		if cid == "" {
			if rt != "" {
				t.Fatalf("runtime %q without a container", rt)
			}
			return
		}
		if !hexID.MatchString(cid) {
			t.Fatalf("container id %q", cid)
		}
		els := strings.Split(strings.TrimPrefix(p, "/"), "/")
		switch {
		case len(els) >= 2 && els[0] == "docker" && els[1] == cid:
		case len(els) >= 2 && els[0] == "system.slice" && els[1] == "docker-"+cid+".scope":
		default:
			pod := PodFromPath(p)
			if pod == "" {
				t.Fatalf("%q: container %q outside a runtime's place", p, cid)
			}
			// Directly below the pod's element.
			i := slices.IndexFunc(els, func(el string) bool {
				return el == "pod"+pod || strings.Contains(el, "-pod"+strings.ReplaceAll(pod, "-", "_")+".slice")
			})
			if i < 0 || i+1 >= len(els) || !strings.Contains(els[i+1], cid) || i > 2 {
				t.Fatalf("%q: container %q not right below pod %q", p, cid, pod)
			}
		}
		if rt != "docker" && rt != "" && rt != "containerd" && rt != "crio" {
			t.Fatalf("runtime %q", rt)
		}
	})
}

// FuzzValidPodUID: ValidPodUID accepts exactly the uids the pod path
// patterns take, and each is found again in both drivers' paths.
func FuzzValidPodUID(f *testing.F) {
	for _, s := range []string{"1a2b3c4d-0000-1111-2222-333344445555", "15eb05479cc0a401db8494898de6d2f9", "",
		strings.Repeat("-", 36), "1a2b3c4d_0000_1111_2222_333344445555", "1A2B3C4D-0000-1111-2222-333344445555", "../x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uid string) {
		if ValidPodUID(uid) != podUUID.MatchString(uid) {
			t.Fatalf("ValidPodUID(%q) = %v", uid, ValidPodUID(uid))
		}
		if !ValidPodUID(uid) {
			return
		}
		for _, p := range []string{"/kubepods/burstable/pod" + uid + "/" + id,
			"/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + id + ".scope"} {
			if got := PodFromPath(p); got != uid {
				t.Fatalf("PodFromPath(%q) = %q, want %q", p, got, uid)
			}
		}
	})
}
