package journal

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

// A batch's outcomes being fsynced (slowly, as under I/O load) must not
// hold back the next kill's intents: NoteAll returns while AppendAll's
// fsync is still in progress, and AppendAll returns only after it.
func TestIntentsDoNotWaitForAnOutcomesFsync(t *testing.T) {
	j, _, err := OpenJournal(filepath.Join(t.TempDir(), "preemptions.jsonl"), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	entered, release := make(chan struct{}), make(chan struct{})
	syncFile = func(f *os.File) error {
		close(entered)
		<-release
		return f.Sync()
	}
	defer func() { syncFile = (*os.File).Sync }()
	now := time.Now()
	appended := make(chan error, 1)
	go func() {
		appended <- j.AppendAll([]preempt.Record{{ID: "outcome", Time: now, Action: preempt.ActionKill, Result: "done"}})
	}()
	<-entered
	noted := make(chan error, 1)
	go func() {
		noted <- j.NoteAll([]preempt.Record{{ID: "intent", Time: now, Action: preempt.ActionKill, Result: preempt.ResultPending}})
	}()
	select {
	case err := <-noted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("the intents waited for another batch's fsync")
	}
	select {
	case <-appended:
		t.Fatal("AppendAll returned before its fsync")
	default:
	}
	close(release)
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
}

// A failed fsync outside the lock is counted and the records are written
// again durably (the journal keeps a record's last line).
func TestOutcomesWrittenAgainAfterAFailedFsync(t *testing.T) {
	p := filepath.Join(t.TempDir(), "preemptions.jsonl")
	j, _, err := OpenJournal(p, 10)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	syncFile = func(f *os.File) error {
		calls++
		if calls == 1 {
			return errors.New("EIO")
		}
		return f.Sync()
	}
	defer func() { syncFile = (*os.File).Sync }()
	if err := j.AppendAll([]preempt.Record{{ID: "outcome", Time: time.Now(), Action: preempt.ActionKill, Result: "done"}}); err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Fatalf("fsyncs %d, want 2 (the failed one, and the one after the write again)", calls)
	}
	if h := j.Health(); h.Failures != 1 {
		t.Fatalf("failures %d, want 1", h.Failures)
	}
	j.Close()
	j, _, err = OpenJournal(p, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if r := j.Recent(); len(r) != 1 || r[0].ID != "outcome" || r[0].Result != "done" {
		t.Fatalf("after reopening: %+v", r)
	}
}
