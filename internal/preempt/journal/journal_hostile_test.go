package journal

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

// A damaged line longer than any record (here 3 MiB of garbage, then a
// 2 MiB one torn at the end of the file) is skipped and counted: it must
// not stop gpud from opening its journal, nor cost the records around it.
func TestJournalSkipsOverlongLines(t *testing.T) {
	p := filepath.Join(t.TempDir(), "preemptions.jsonl")
	var b bytes.Buffer
	b.WriteString(`{"id":"before","gpu":1}` + "\n")
	b.WriteString(`{"id":"x","comm":"` + strings.Repeat("A", 3<<20) + `"}` + "\n")
	b.WriteString(`{"id":"after","gpu":2}` + "\n")
	b.WriteString(strings.Repeat("\xff", 2<<20))
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	j, skipped, err := OpenJournal(p, 10)
	if err != nil {
		t.Fatalf("OpenJournal: %v", err)
	}
	if skipped != 2 {
		t.Errorf("skipped %d lines, want the 2 over-long ones", skipped)
	}
	r := j.Recent()
	if len(r) != 2 || r[0].ID != "before" || r[1].ID != "after" {
		t.Fatalf("recent = %+v, want before and after", r)
	}
	// The torn tail is closed off: the next record is readable.
	if err := j.Append(preempt.Record{ID: "next", Time: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	j.Close()
	j, skipped, err = OpenJournal(p, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if r := j.Recent(); skipped != 2 || len(r) != 3 || r[2].ID != "next" {
		t.Fatalf("reopened: skipped %d, recent %+v; want 2 skipped and before, after, next", skipped, r)
	}
}

// A negative keep (a caller's mistake) keeps nothing in memory, and panics nowhere.
func TestJournalNegativeKeep(t *testing.T) {
	p := filepath.Join(t.TempDir(), "preemptions.jsonl")
	if err := os.WriteFile(p, []byte(`{"id":"a"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	j, _, err := OpenJournal(p, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if err := j.Append(preempt.Record{ID: "b"}); err != nil {
		t.Fatal(err)
	}
	if r := j.Recent(); len(r) != 0 {
		t.Fatalf("recent = %+v with keep -1", r)
	}
}
