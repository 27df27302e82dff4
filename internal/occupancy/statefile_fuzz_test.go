package occupancy

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	v1 "github.com/gpud/gpud/api/v1"
)

func FuzzParseStateFile(f *testing.F) {
	doc := Render(sampleSnapshot(), "node-a", true)
	doc.Preemptions = []v1.RawPreemption{json.RawMessage(`{"pid":100,"gpu":1}`)}
	valid, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		f.Fatal(err)
	}
	empty, err := json.Marshal(Render(Snapshot{Taken: t0}, "", false))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Add(empty)
	f.Add([]byte(`{"version":1,"gpus":[{"state":"lent","holders":[{"pid":1}]}],"preemptions":null}`))
	f.Add([]byte(`{"version":1,"updated_at":"2025-03-01T12:00:00+05:30"}`))
	// Near misses, each refused: another version, an unknown state, a
	// holder without a pid, a torn document, the wrong types.
	f.Add([]byte(`{"version":2,"gpus":[]}`))
	f.Add([]byte(`{"version":1,"gpus":[{"state":"borrowed"}]}`))
	f.Add([]byte(`{"version":1,"gpus":[{"state":"busy","holders":[{"pid":0}]}]}`))
	f.Add([]byte(`{"version":1,"gpus":[{"state":"busy","holders":[{"pid":-7}]}]}`))
	f.Add([]byte(`{"version":1,"gpus":[{"state":"busy","holders":[{"pid":1.5}]}]}`))
	f.Add([]byte(`{"version":"1"}`))
	f.Add([]byte(`{"version":1,"gpus":{}}`))
	f.Add([]byte(`[{"version":1}]`))
	f.Add([]byte(`null`))
	f.Add([]byte(``))
	// Accepted oddities: duplicate keys, unknown fields, nulls, escapes.
	f.Add([]byte(`{"version":1,"version":1,"extra":{"a":[1,2]},"node":"n\u0000\n\u202e","gpus":null,"preemptions":[null,1,"x",{}]}`))
	f.Add([]byte(`{"version":1,"gpus":[{"index":-1,"state":"idle","idle_since":null,"holders":[{"pid":2147483647,"cgroup_id":18446744073709551615,"fds":-1}]}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		f1, err := ParseStateFile(in)
		if err != nil {
			if !errors.Is(err, ErrBadStateFile) {
				t.Fatalf("error not ErrBadStateFile: %v", err)
			}
			if f1 != nil {
				t.Fatal("document returned with an error")
			}
			return
		}
		// What parses is a document gpud could have written: this version,
		// known states, holders with a pid.
		if f1.Version != v1.StateVersion {
			t.Fatalf("accepted version %d", f1.Version)
		}
		for i, g := range f1.GPUs {
			switch g.State {
			case Free, Busy, Idle, Lent:
			default:
				t.Fatalf("accepted gpus[%d].state %q", i, g.State)
			}
			for j, h := range g.Holders {
				if h.PID <= 0 {
					t.Fatalf("accepted gpus[%d].holders[%d].pid %d", i, j, h.PID)
				}
			}
		}
		// What parses re-encodes, and parses again to the same document.
		b1, err := json.Marshal(f1)
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", f1, err)
		}
		f2, err := ParseStateFile(b1)
		if err != nil {
			t.Fatalf("re-parsing %s: %v", b1, err)
		}
		b2, err := json.Marshal(f2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("encodings differ:\n%s\n%s", b1, b2)
		}
		f3, err := ParseStateFile(b2)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(f2, f3) {
			t.Fatalf("documents differ:\n%+v\n%+v", f2, f3)
		}
		// In the indented form gpud status -o json and earlier gpuds wrote, too.
		bi, err := json.MarshalIndent(f1, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		fi, err := ParseStateFile(append(bi, '\n'))
		if err != nil {
			t.Fatalf("re-parsing the indented form: %v", err)
		}
		if bc, _ := json.Marshal(fi); !bytes.Equal(bc, b1) {
			t.Fatalf("indented form parses to\n%s\nwant\n%s", bc, b1)
		}
		if f1.Version != f2.Version || f1.Node != f2.Node || !f1.UpdatedAt.Equal(f2.UpdatedAt) ||
			f1.Monitoring != f2.Monitoring || len(f1.GPUs) != len(f2.GPUs) || len(f1.Preemptions) != len(f2.Preemptions) {
			t.Fatalf("document changed by a round trip:\n%+v\n%+v", f1, f2)
		}
	})
}
