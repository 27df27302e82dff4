package journal

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

// A full disk under the journal (a real 64 KiB tmpfs, filled): a record the
// disk cuts mid-line is truncated back (the file keeps whole lines only),
// kept, and with the records after it written by the retry timer once
// space returns, in order; the reopened journal has every record and skips
// nothing. Before, the fragment stayed, the next record was glued to it,
// and both were lost.
func TestJournalFullDisk(t *testing.T) {
	mnt := testutil.SmallFS(t, 64<<10)
	p := filepath.Join(mnt, "preemptions.jsonl")
	j, _, err := OpenJournal(p, 50)
	if err != nil {
		t.Fatal(err)
	}
	rec := func(id string, comm int) preempt.Record {
		return preempt.Record{ID: id, Time: time.Now().UTC(), Action: preempt.ActionKill, Result: "done",
			Victim: preempt.Party{PID: 42, Comm: strings.Repeat("v", comm)}}
	}
	if err := j.Append(rec("a", 10)); err != nil {
		t.Fatal(err)
	}
	filler := testutil.Fill(t, mnt)
	// b is longer than what is left of the journal's last page: the disk
	// takes part of it (a short write), then refuses the rest.
	for _, r := range []preempt.Record{rec("b", 6000), rec("c", 10)} {
		if err := j.Append(r); err == nil {
			t.Fatalf("record %s written on a full disk", r.ID)
		}
	}
	if err := j.Note(rec("d", 10)); err == nil {
		t.Fatal("record d written on a full disk")
	}
	// Whole lines only on disk, while the disk is full.
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		t.Fatalf("the journal ends in a fragment while the disk is full (%d bytes): %q", len(b), tail(b))
	}
	for i, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		var r preempt.Record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("line %d is not a record: %q", i+1, tail(line))
		}
	}
	h := j.Health()
	if h.Failures == 0 || h.Pending != 3 || h.Lost != 0 || h.LastError == nil || !strings.Contains(h.LastError.Error(), "no space left") {
		t.Fatalf("health on a full disk: %+v; want failures, 3 pending", h)
	}
	// Records appear in memory (and so in the state file) at once.
	if r := j.Recent(); len(r) != 4 {
		t.Fatalf("recent = %d records, want 4", len(r))
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if j.Health().Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiting records were never written after space returned")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// After space returns, nothing more is needed: reopen as a new gpud would.
	j2, skipped, err := OpenJournal(p, 50)
	if err != nil {
		t.Fatal(err)
	}
	defer j2.Close()
	var ids []string
	for _, r := range j2.Recent() {
		ids = append(ids, r.ID)
	}
	if skipped != 0 || strings.Join(ids, ",") != "a,b,c,d" {
		t.Fatalf("reopened: %d lines skipped, records %v; want 0 skipped and a,b,c,d", skipped, ids)
	}
	if r := j2.Recent()[1]; len(r.Victim.Comm) != 6000 {
		t.Fatalf("record b came back with a %d-byte comm", len(r.Victim.Comm))
	}
	j.Close()
}

func tail(b []byte) []byte {
	if len(b) > 80 {
		return b[len(b)-80:]
	}
	return b
}
