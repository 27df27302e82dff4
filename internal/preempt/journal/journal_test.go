package journal

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

func TestJournalSurvivesTornWriteAndKeepsLast(t *testing.T) {
	p := filepath.Join(t.TempDir(), "j", "preemptions.jsonl")
	j, skipped, err := OpenJournal(p, 3)
	if err != nil || skipped != 0 {
		t.Fatal(err, skipped)
	}
	now := time.Now()
	for i := 0; i < 5; i++ {
		if err := j.Append(preempt.Record{ID: j.NewID(now), GPU: i, Action: preempt.ActionKill, Victim: preempt.Party{TaskID: "t"}}); err != nil {
			t.Fatal(err)
		}
	}
	j.Close()
	// a crash in the middle of a line
	f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"id":"half","gpu":`)
	f.Close()
	j, skipped, err = OpenJournal(p, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if skipped != 1 {
		t.Errorf("skipped %d lines, want the torn one", skipped)
	}
	r := j.Recent()
	if len(r) != 3 || r[0].GPU != 2 || r[2].GPU != 4 {
		t.Fatalf("recent = %+v, want GPUs 2..4", r)
	}
	ids := map[string]bool{}
	for _, x := range r {
		if ids[x.ID] {
			t.Fatalf("duplicate id %s", x.ID)
		}
		ids[x.ID] = true
	}
}

func TestJournalResumedOnceAndDurable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "preemptions.jsonl")
	j, _, _ := OpenJournal(p, 10)
	j.Append(preempt.Record{ID: "a", Action: preempt.ActionKill, Victim: preempt.Party{TaskID: "train"}})
	if _, ok, _ := j.Resumed("", "other", time.Now()); ok {
		t.Fatal("resumed a task without a record")
	}
	if _, ok, err := j.Resumed("", "train", time.Now()); !ok || err != nil {
		t.Fatal("not resumed", err)
	}
	if _, ok, _ := j.Resumed("", "train", time.Now()); ok {
		t.Fatal("resumed twice")
	}
	j.Close()
	j, _, _ = OpenJournal(p, 10)
	defer j.Close()
	r := j.Recent()
	if len(r) != 1 || r[0].ResumedAt == nil {
		t.Fatalf("after reopening: %+v (one record, resumed)", r)
	}
}

// A task is its namespace and its id, as its checkpoint directory is: a
// pod of namespace B naming the task id of A's preempted pod resumes
// nothing of A's (a resumed record hands A's directory read-only to A's
// later pods), and A's own open still resumes A's record even when B's
// kill of the same id is newer. A Docker container's task ("") is a third.
func TestJournalResumedKeyedByNamespace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "preemptions.jsonl")
	j, _, err := OpenJournal(p, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	j.Append(preempt.Record{ID: "a", Action: preempt.ActionKill, Victim: preempt.Party{Namespace: "team-a", TaskID: "train"}})
	j.Append(preempt.Record{ID: "b", Action: preempt.ActionKill, Victim: preempt.Party{Namespace: "team-b", TaskID: "train"}})
	if _, ok, _ := j.Resumed("team-c", "train", time.Now()); ok {
		t.Fatal("a namespace without a kill resumed another's task")
	}
	if _, ok, _ := j.Resumed("", "train", time.Now()); ok {
		t.Fatal("a Docker container resumed a pod's task")
	}
	rec, ok, err := j.Resumed("team-a", "train", time.Now())
	if !ok || err != nil || rec.ID != "a" {
		t.Fatalf("team-a's open resumed %q (%v, %v), want its own record a", rec.ID, ok, err)
	}
	for _, r := range j.Recent() {
		if r.ID == "b" && r.ResumedAt != nil {
			t.Fatal("team-a's open marked team-b's record resumed")
		}
	}
	if rec, ok, _ := j.Resumed("team-b", "train", time.Now()); !ok || rec.ID != "b" {
		t.Fatalf("team-b's open resumed %q (%v), want its own record b", rec.ID, ok)
	}
}

// A task's directory is keyed by its namespace and its id, each one path
// element that cannot leave the root, one to one: "ns/pod" and "ns_pod"
// are two tasks, and so are the same id in two namespaces.
func TestTaskDir(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, c := range []struct{ ns, id, want string }{
		{"ml", "train-42", "/r/ml/train-42"},
		{"evil", "train-42", "/r/evil/train-42"},
		{"ml", "ml/train", "/r/ml/ml%2Ftrain"},
		{"ml", "ml_train", "/r/ml/ml_train"},
		{"ml", "../etc", "/r/ml/%2E.%2Fetc"},
		{"ml", "..", "/r/ml/%2E."},
		{"ml", ".", "/r/ml/%2E"},
		{"ml", ".hidden", "/r/ml/%2Ehidden"},
		{"ml", "a%2Fb", "/r/ml/a%252Fb"},
		{"", "train-42", "/r/" + DockerScope + "/train-42"},
		{"", "/my-container", "/r/" + DockerScope + "/%2Fmy-container"},
	} {
		if got, err := TaskDir("/r", c.ns, c.id); err != nil || got != c.want {
			t.Errorf("TaskDir(%q, %q) = %q, %v; want %q", c.ns, c.id, got, err, c.want)
		}
	}
	a, _ := TaskDir("/r", "ml", long)
	b, _ := TaskDir("/r", "ml", long+"y")
	if a == b || len(filepath.Base(a)) > maxElem || filepath.Dir(a) != "/r/ml" || !strings.Contains(a, "~") {
		t.Errorf("long ids: %q, %q", a, b)
	}
	for _, bad := range []struct{ ns, id string }{
		{"ml", ""}, {"..", "x"}, {".", "x"}, {"a/b", "x"}, {"_docker", "x"}, {"ML", "x"}, {"-a", "x"}, {strings.Repeat("a", 64), "x"},
	} {
		if d, err := TaskDir("/r", bad.ns, bad.id); err == nil {
			t.Errorf("TaskDir(%q, %q) accepted: %q", bad.ns, bad.id, d)
		}
	}
}

func TestJournalCompactsWhenLarge(t *testing.T) {
	p := filepath.Join(t.TempDir(), "preemptions.jsonl")
	j, _, _ := OpenJournal(p, 5)
	pad := strings.Repeat("x", 4096)
	for i := 0; i < maxJournalBytes/4096+10; i++ {
		j.Append(preempt.Record{ID: j.NewID(time.Now()), GPU: i, Action: preempt.ActionDeny, Result: pad})
	}
	last := j.Recent()
	j.Close()
	j, _, err := OpenJournal(p, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	st, _ := os.Stat(p)
	if st.Size() > 64<<10 {
		t.Fatalf("journal still %d bytes after compaction", st.Size())
	}
	if got := j.Recent(); len(got) != 5 || got[4].ID != last[4].ID {
		t.Fatalf("records lost in compaction: %d kept", len(got))
	}
	if err := j.Append(preempt.Record{ID: "after", Action: preempt.ActionKill}); err != nil {
		t.Fatal(err)
	}
}
