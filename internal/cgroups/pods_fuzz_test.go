package cgroups

import (
	"strings"
	"testing"
)

// FuzzPodPaths: the cgroup paths where a pod is looked for stay under
// kubepods whatever the uid, so a uid such as "../../x" never leads gpud to
// another cgroup; for a well-formed uid each path names that pod to the
// cgroup parser (the two must agree, or a pod's holders go unclassified).
func FuzzPodPaths(f *testing.F) {
	for _, uid := range []string{"1a2b3c4d-0000-1111-2222-333344445555", "15eb05479cc0a401db8494898de6d2f9",
		"", "../../../sys", "1a2b3c4d-0000-1111-2222-33334444555/", "1A2B3C4D-0000-1111-2222-333344445555",
		"1a2b3c4d_0000_1111_2222_333344445555", strings.Repeat("-", 36)} {
		for _, qos := range []string{"", "Guaranteed", "Burstable", "BestEffort", "Weird"} {
			f.Add(uid, qos)
		}
	}
	f.Fuzz(func(t *testing.T, uid, qos string) {
		paths := PodPaths(uid, qos)
		valid := uuidOrHash(uid)
		if !valid {
			if len(paths) != 0 {
				t.Fatalf("uid %q (not a UUID nor 32 hex): paths %q", uid, paths)
			}
			return
		}
		if len(paths) == 0 {
			t.Fatalf("uid %q: no paths", uid)
		}
		for _, p := range paths {
			if !strings.HasPrefix(p, "kubepods/") && !strings.HasPrefix(p, "kubepods.slice/") || strings.Contains(p, "..") {
				t.Fatalf("uid %q: path %q outside kubepods", uid, p)
			}
			if got := PodFromPath("/" + p); got != uid {
				t.Fatalf("uid %q: path %q parses to pod %q", uid, p, got)
			}
		}
	})
}

// uuidOrHash is the test's own statement of a well-formed pod uid.
func uuidOrHash(s string) bool {
	hex := func(s string) bool {
		for _, c := range s {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
		return true
	}
	if len(s) == 32 {
		return hex(s)
	}
	g := strings.Split(s, "-")
	if len(s) != 36 || len(g) != 5 {
		return false
	}
	for i, n := range []int{8, 4, 4, 4, 12} {
		if len(g[i]) != n || !hex(g[i]) {
			return false
		}
	}
	return true
}
