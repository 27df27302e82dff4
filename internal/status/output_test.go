package status

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// named is realistic() with names on its holders, one of them too long for
// the table, one made of terminal escapes.
func named() *v1.StateFile {
	f := realistic()
	h := f.GPUs[0].Holders
	h[0].Namespace, h[0].Pod, h[0].Container = "research-team-with-long-name", "llama-finetune-0", "trainer"
	h[1].Container = "triton\x1b[2J"
	return f
}

// TestRenderNames: the table names pods namespace/name and containers
// ctr/name, cut to its column; -o wide has them whole with the pod's
// container; both made printable.
func TestRenderNames(t *testing.T) {
	out := render(t, named())
	for _, want := range []string{"research-team-with-…", "ctr/triton?[2J"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "pod/1a2b3c4d") || strings.ContainsRune(out, '\x1b') {
		t.Errorf("table shows the UID or an escape:\n%s", out)
	}
	var b bytes.Buffer
	if err := Write(&b, named(), "wide", now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"research-team-with-long-name/llama-finetune-0", "trainer", "GPU-6f0e7c56-5bd8-4c38-9b1d-6c44e6f3b0a1",
		"pt_main_thread_with_a_long_name", "FDS"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("wide lacks %q:\n%s", want, b.String())
		}
	}
	// Without names (an older gpud's file, a pod not yet known): the ids.
	if out := render(t, realistic()); !strings.Contains(out, "pod/1a2b3c4d-000") || !strings.Contains(out, "ctr/3f1c2d4e5b6a") {
		t.Errorf("fallback to ids:\n%s", out)
	}
}

// TestEncodeYAML: -o yaml is block YAML with the JSON document's keys in
// its order, strings that look like other types quoted.
func TestEncodeYAML(t *testing.T) {
	f := named()
	f.Node = "true" // would read back as a bool unquoted
	var b bytes.Buffer
	if err := Encode(&b, f, "yaml"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.HasPrefix(out, "version: 1\nnode: \"true\"\nupdated_at: ") {
		t.Errorf("key order or quoting:\n%s", out)
	}
	for _, want := range []string{"      - pid: 4194301\n", "        namespace: research-team-with-long-name\n", "idle_since: null\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("yaml lacks %q:\n%s", want, out)
		}
	}
	if err := Encode(&b, f, "xml"); err == nil {
		t.Error("unknown format accepted")
	}
}

// TestWatchFrames: off a terminal, frames follow each other plainly (a
// blank line between tables, --- before YAML documents), each in one
// write; on a terminal each table clears the screen; a failing frame is
// reported and the watch goes on.
func TestWatchFrames(t *testing.T) {
	for _, tc := range []struct {
		format   string
		terminal bool
		want     string
	}{
		{"table", false, "A\n|\nB\n|\nC\n|"},
		{"wide", true, clearScreen + "A\n|" + clearScreen + "B\n|" + clearScreen + "C\n|"},
		{"yaml", false, "---\nA\n|---\nB\n|---\nC\n|"},
		{"json", true, "A\n|B\n|C\n|"},
	} {
		var out writes
		var errs bytes.Buffer
		n := 0
		ctx, cancel := context.WithCancel(context.Background())
		Watch(ctx, WatchOptions{Out: &out, Err: &errs, Terminal: tc.terminal, Every: time.Millisecond, Format: tc.format},
			func(w io.Writer) error {
				n++
				if n == 2 {
					return errors.New("state file gone")
				}
				if n == 4 {
					cancel()
				}
				io.WriteString(w, string(rune('A'+n/2))+"\n")
				return nil
			})
		if got := strings.Join(out, "|") + "|"; got != tc.want {
			t.Errorf("-o %s terminal %v: %q, want %q", tc.format, tc.terminal, got, tc.want)
		}
		if errs.String() != "gpud: state file gone\n" {
			t.Errorf("errors: %q", errs.String())
		}
	}
}

// writes records each Write.
type writes []string

func (w *writes) Write(p []byte) (int, error) { *w = append(*w, string(p)); return len(p), nil }
