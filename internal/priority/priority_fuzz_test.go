package priority

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/occupancy"
	corev1 "k8s.io/api/core/v1"
)

// FuzzParseLabel: a gpud.io/priority value is accepted exactly when it is
// exactly high or low (no white space trimmed), and a class read back parses to
// itself. Anything else is ErrBadLabel with a bounded message that names the
// label and quotes the value (its first 64 bytes). Classify gives an
// accepted value's class, else the default, and counts a malformed label
// once per container however often it is seen.
func FuzzParseLabel(f *testing.F) {
	for _, s := range []string{"high", "low", // valid
		" high", "low\n", "\thigh\t", "", "HIGH", "High", "hi gh", "lo w", "highh", "hig", "unmanaged", "unclassified", "medium", // near misses
		"high\x00", "\u00a0low", "h\u0456gh", "\xff\xfe", strings.Repeat("x", 5000), strings.Repeat("é", 40)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		p, err := ParseLabel(v)
		switch v {
		case "high", "low":
			if err != nil || string(p) != v {
				t.Fatalf("ParseLabel(%q) = %q, %v", v, p, err)
			}
			if q, err := ParseLabel(string(p)); err != nil || q != p {
				t.Fatalf("class %q does not round-trip: %q, %v", p, q, err)
			}
		default:
			if err == nil || p != "" {
				t.Fatalf("ParseLabel(%q) = %q, %v: accepted", v, p, err)
			}
			if !errors.Is(err, ErrBadLabel) {
				t.Fatalf("error %v is not ErrBadLabel", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, LabelPriority) {
				t.Fatalf("error %q does not name the label", msg)
			}
			shown := v
			if len(shown) > 64 {
				shown = shown[:64] + "…"
			}
			if !strings.Contains(msg, strconv.Quote(shown)) {
				t.Fatalf("error %q does not quote the value %q", msg, shown)
			}
			if len(msg) > 400 || !utf8.ValidString(msg) {
				t.Fatalf("error message of %d bytes (valid UTF-8: %v)", len(msg), utf8.ValidString(msg))
			}
		}

		r := &Registry{Default: occupancy.Low}
		for i := 0; i < 3; i++ {
			got := r.Classify("c1", map[string]string{LabelPriority: v})
			if err == nil && got != p || err != nil && got != occupancy.Low {
				t.Fatalf("Classify(%q) = %q (parse: %q, %v)", v, got, p, err)
			}
		}
		if n, want := r.MalformedSeen.Load(), map[bool]uint64{true: 1, false: 0}[err != nil]; n != want {
			t.Fatalf("malformed seen %d times, want %d", n, want)
		}
	})
}

// FuzzPodCgroupPaths: the cgroup paths where a pod is looked for stay under
// kubepods whatever the uid, so a uid such as "../../x" never leads gpud to
// another cgroup; for a well-formed uid each path names that pod to the
// cgroup parser (the two must agree, or a pod's holders go unclassified).
func FuzzPodCgroupPaths(f *testing.F) {
	for _, uid := range []string{"1a2b3c4d-0000-1111-2222-333344445555", "15eb05479cc0a401db8494898de6d2f9",
		"", "../../../sys", "1a2b3c4d-0000-1111-2222-33334444555/", "1A2B3C4D-0000-1111-2222-333344445555",
		"1a2b3c4d_0000_1111_2222_333344445555", strings.Repeat("-", 36)} {
		for _, qos := range []string{"", "Guaranteed", "Burstable", "BestEffort", "Weird"} {
			f.Add(uid, qos)
		}
	}
	f.Fuzz(func(t *testing.T, uid, qos string) {
		paths := PodCgroupPaths(uid, corev1.PodQOSClass(qos))
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
			if got := cgroups.PodFromPath("/" + p); got != uid {
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
