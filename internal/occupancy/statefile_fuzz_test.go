package occupancy

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func FuzzParseStateFile(f *testing.F) {
	doc := Render(sampleSnapshot(), "node-a", true)
	doc.Preemptions = []Preemption{json.RawMessage(`{"pid":100,"gpu":1}`)}
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
		if f1.Version != f2.Version || f1.Node != f2.Node || !f1.UpdatedAt.Equal(f2.UpdatedAt) ||
			f1.Monitoring != f2.Monitoring || len(f1.GPUs) != len(f2.GPUs) || len(f1.Preemptions) != len(f2.Preemptions) {
			t.Fatalf("document changed by a round trip:\n%+v\n%+v", f1, f2)
		}
	})
}
