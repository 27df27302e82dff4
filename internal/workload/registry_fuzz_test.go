package workload

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gpud/gpud/internal/occupancy"
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
