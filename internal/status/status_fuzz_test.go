package status

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	v1 "github.com/gpud/gpud/api/v1"

	"github.com/gpud/gpud/internal/occupancy"
)

// FuzzRender: any state file gpud status can read renders without error
// to exactly the table it describes (one line per holder, or per GPU
// without one; the last five preemptions), in printable UTF-8. Comm is
// whatever a process calls itself (prctl(PR_SET_NAME)) and ids come from
// the file: a newline, a terminal escape or a bidi override in them must
// not reach the terminal of whoever runs gpud status.
func FuzzRender(f *testing.F) {
	add := func(sf *v1.StateFile) {
		b, err := json.Marshal(sf)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	add(realistic())
	hostile := realistic()
	hostile.Node = "node\n\x1b[2Jowned"
	hostile.GPUs[0].Holders[0].Comm = "evil\x1b]0;pwned\x07"
	hostile.GPUs[0].Holders[1].Comm = "a\nb\rc\td"
	hostile.GPUs[0].Holders[1].ContainerID = "\u202eabc\u202c" + ctrID
	hostile.GPUs[1].Holders[0].Comm = "\xff\xfe\x80" + "ééééééééé"
	hostile.GPUs[1].Holders[0].Priority = "lo\x00w"
	hostile.GPUs[0].Holders[0].Namespace, hostile.GPUs[0].Holders[0].Pod = "ns\n", "\x1b[2J"+strings.Repeat("p", 90)
	hostile.GPUs[0].Holders[0].Container = "c\u202e\r"
	hostile.GPUs[0].Holders[1].Container = "\x1b]0;x\x07"
	hostile.GPUs[1].State = occupancy.Lent
	hostile.GPUs[1].Owner = "ns/\x1b[2J" + strings.Repeat("o", 100)
	hostile.GPUs[1].Borrower = "\u202e" + strings.Repeat("b", 100)
	hostile.Preemptions = []v1.RawPreemption{
		json.RawMessage(`{"time":"2025-03-01T11:59:00Z","gpu":1,"action":"kill\u001b[31m","victim":{"pid":1,"pod_uid":"\n\n"},"result":"\u0085done"}`),
		json.RawMessage(`"not an object"`),
	}
	add(hostile)
	add(&v1.StateFile{Version: 1})
	add(busy())
	f.Add([]byte(`{"version":1,"gpus":[{"index":-1,"state":"idle","idle_since":"0001-01-01T00:00:00Z","holders":[{"pid":2147483647,"fds":-5}]}]}`))
	f.Add([]byte(`{"version":1,"preemptions":[{},{},{},{},{},{},{},1,null,"x"]}`))
	f.Add([]byte(`{"version":2}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		sf, err := occupancy.ParseStateFile(in)
		if err != nil {
			return
		}
		var b, wide bytes.Buffer
		if err := Render(&b, sf, now); err != nil {
			t.Fatalf("Render: %v", err)
		}
		if err := RenderWide(&wide, sf, now); err != nil {
			t.Fatalf("RenderWide: %v", err)
		}
		out := b.String()
		for _, o := range []string{out, wide.String()} {
			if !utf8.ValidString(o) {
				t.Fatalf("output is not UTF-8:\n%q", o)
			}
			for _, r := range o {
				if r != '\n' && r != ' ' && !unicode.IsPrint(r) {
					t.Fatalf("unprintable %U in output:\n%q", r, o)
				}
			}
		}
		want := 3 // header, blank, column titles
		for _, g := range sf.GPUs {
			want += max(1, len(g.Holders))
		}
		lent := 0
		for _, g := range sf.GPUs {
			if g.Borrower != "" || g.State == occupancy.Lent {
				lent++
			}
		}
		if lent > 0 {
			want += 3 + lent // blank, title, column titles, one per lent GPU
		}
		if n := len(sf.Preemptions); n > 0 {
			want += 3 + min(n, 5) // blank, title, column titles, the last five
		}
		for _, l := range strings.Split(out, "\n") {
			if n := utf8.RuneCountInString(l); n > Width {
				t.Fatalf("line of %d columns: %q", n, l)
			}
		}
		if got := strings.Count(out, "\n"); got != want || !strings.HasSuffix(out, "\n") {
			t.Fatalf("%d lines, want %d:\n%s", got, want, out)
		}
		if got := strings.Count(wide.String(), "\n"); got != want {
			t.Fatalf("-o wide: %d lines, want %d:\n%s", got, want, wide.String())
		}
	})
}
