package journal

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

type records []preempt.Record

func (r *records) Recent() []preempt.Record { return *r }

// Who gets a preempted task's checkpoint directory: only pods of the task
// in the namespace it was preempted in; one of them (the preempted pod, or
// the first to resume it) read-write, the others read-only.
func TestCheckpointMounts(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"ml/train-42", "ml/ml%2Ftrain", "ml/other"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(root, "ml", "planted")); err != nil {
		t.Fatal(err)
	}
	const victim, resumer, replica, stranger = "uid-victim", "uid-resumer", "uid-replica", "uid-stranger"
	recs := &records{
		{ID: "r1", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: victim, Namespace: "ml", TaskID: "train-42"}},
		{ID: "d1", Action: preempt.ActionDeny, Victim: preempt.Party{PodUID: stranger, Namespace: "ml", TaskID: "other"}},
		{ID: "r2", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: "uid-x", Namespace: "ml", TaskID: "ml/train"}},
		{ID: "r3", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: "uid-y", Namespace: "ml", TaskID: "planted"}},
		{ID: "r4", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: "uid-z", TaskID: "no-namespace"}},
	}
	c := &Checkpoints{Root: root, HostRoot: "/host/ckpt", Records: recs}
	type want struct {
		ok, ro bool
	}
	check := func(what, uid, ns, task string, w want) {
		t.Helper()
		m, ok := c.For(uid, ns, task)
		if ok != w.ok || (ok && m.ReadOnly != w.ro) {
			t.Errorf("%s: %+v %v, want mounted %v read-only %v", what, m, ok, w.ok, w.ro)
		}
		if ok && (m.Dir != filepath.Join("/host/ckpt", ns, filepath.Base(m.Dir)) || m.TaskID != task) {
			t.Errorf("%s: dir %q: want the host's view of the task's directory", what, m.Dir)
		}
	}
	// Another tenant claiming the task id gets nothing, first or not.
	check("same task id, another namespace", stranger, "evil", "train-42", want{})
	// The first pod of the task while it is not resumed owns it.
	check("the resuming pod", resumer, "ml", "train-42", want{true, false})
	check("the resuming pod's next container", resumer, "ml", "train-42", want{true, false})
	check("a second pod of the task", replica, "ml", "train-42", want{true, true})
	check("the preempted pod after another pod claimed it", victim, "ml", "train-42", want{true, true})
	// Nothing for tasks gpud did not kill, records without a namespace, a
	// deny record, a symlink in the root, or an empty task id.
	check("a task never killed", resumer, "ml", "train-43", want{})
	check("a deny record's task", stranger, "ml", "other", want{})
	check("a record without a namespace", "uid-z", "", "no-namespace", want{})
	check("a symlink where the directory was", "uid-y", "ml", "planted", want{})
	check("no task id", resumer, "ml", "", want{})
	check("ns/name task ids", "uid-x", "ml", "ml/train", want{true, false})

	// Resumed, and gpud restarted (claims lost): the preempted pod still
	// owns it; any other pod reads only.
	now := time.Now()
	(*recs)[0].ResumedAt = &now
	c = &Checkpoints{Root: root, HostRoot: "/host/ckpt", Records: recs}
	check("after the resume, another pod", replica, "ml", "train-42", want{true, true})
	check("after the resume, the preempted pod", victim, "ml", "train-42", want{true, false})
	// A new kill of the task: the claim starts over.
	*recs = append(*recs, preempt.Record{ID: "r5", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: victim, Namespace: "ml", TaskID: "train-42"}})
	check("after a new kill, the first pod", replica, "ml", "train-42", want{true, false})
	check("after a new kill, the preempted pod", victim, "ml", "train-42", want{true, true})
	if m, _ := (&Checkpoints{Root: root, Records: recs}).For(replica, "ml", "train-42"); m.Dir != filepath.Join(root, "ml", "train-42") || m.RecordID != "r5" {
		t.Errorf("without HostRoot: %+v", m)
	}
	// Disabled without a root.
	if _, ok := (&Checkpoints{Records: recs}).For(replica, "ml", "train-42"); ok {
		t.Error("a mount without --checkpoint-root")
	}
}

// The same task id in two namespaces is two tasks: each namespace's pods
// get their own directory, with their own notice, whichever was preempted
// last; "ns/name" and "ns_name" are two directories too.
func TestCheckpointsKeyedByNamespace(t *testing.T) {
	root := t.TempDir()
	recs := &records{
		{ID: "a1", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: "uid-a", Namespace: "team-a", TaskID: "train-42"}},
		{ID: "b1", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: "uid-b", Namespace: "team-b", TaskID: "train-42"}},
		{ID: "a2", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: "uid-c", Namespace: "team-a", TaskID: "team-a/p"}},
		{ID: "a3", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: "uid-d", Namespace: "team-a", TaskID: "team-a_p"}},
	}
	for _, r := range *recs {
		if _, err := WriteNotice(root, Notice{TaskID: r.Victim.TaskID, Namespace: r.Victim.Namespace, RecordID: r.ID}); err != nil {
			t.Fatal(err)
		}
	}
	c := &Checkpoints{Root: root, Records: recs}
	dirs := map[string]string{}
	for _, r := range *recs {
		m, ok := c.For(r.Victim.PodUID, r.Victim.Namespace, r.Victim.TaskID)
		if !ok || m.ReadOnly || m.RecordID != r.ID {
			t.Fatalf("%s's own pod: %+v %v, want its record's directory, read-write", r.ID, m, ok)
		}
		if other, dup := dirs[m.Dir]; dup {
			t.Errorf("%s and %s share %s", r.ID, other, m.Dir)
		}
		dirs[m.Dir] = r.ID
		b, err := os.ReadFile(filepath.Join(m.Dir, CheckpointFile))
		if err != nil || !strings.Contains(string(b), `"record_id": "`+r.ID+`"`) {
			t.Errorf("%s's directory %s holds %q, %v: want its own notice", r.ID, m.Dir, b, err)
		}
		if filepath.Dir(m.Dir) != filepath.Join(root, r.Victim.Namespace) {
			t.Errorf("%s: %s is not under its namespace's directory", r.ID, m.Dir)
		}
	}
	// A third namespace naming the id: nothing (it was never preempted there).
	if m, ok := c.For("uid-x", "team-x", "train-42"); ok {
		t.Errorf("a namespace that was never preempted: %+v", m)
	}
}

// Directories of the old layout (root/<task id>) are set aside, whole, on
// the first start: a task id that is also a namespace's name ("ml") is not
// taken for that namespace's directory, no pod gets any of them mounted,
// and new notices go to fresh directories. Once done, never again; cut
// short, it starts over.
func TestMigrateCheckpointRoot(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"train-42", "ml/train-42", "_docker"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "ml", "train-42", "model.ckpt"), []byte("another tenant's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(root, "planted")); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	moved, err := MigrateCheckpointRoot(root, log)
	if err != nil || !slices.Equal(moved, []string{"_docker", "ml", "planted", "train-42"}) {
		t.Fatalf("moved %v, %v", moved, err)
	}
	if _, err := os.Lstat(filepath.Join(root, LegacyDir, "ml", "train-42", "model.ckpt")); err != nil {
		t.Errorf("the old directory was not kept whole: %v", err)
	}
	if st, err := os.Lstat(filepath.Join(root, LegacyDir, "planted")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the planted symlink: %v, %v", st, err)
	}
	recs := &records{{ID: "r1", Action: preempt.ActionKill, Victim: preempt.Party{PodUID: "uid-a", Namespace: "ml", TaskID: "train-42"}}}
	c := &Checkpoints{Root: root, Records: recs}
	if m, ok := c.For("uid-a", "ml", "train-42"); ok {
		t.Errorf("namespace ml got a directory before any notice of its own: %+v", m)
	}
	if _, err := WriteNotice(root, Notice{Namespace: "ml", TaskID: "train-42", RecordID: "r1"}); err != nil {
		t.Fatal(err)
	}
	m, ok := c.For("uid-a", "ml", "train-42")
	if !ok {
		t.Fatal("no mount after the notice")
	}
	if ents, _ := os.ReadDir(m.Dir); len(ents) != 1 || ents[0].Name() != CheckpointFile {
		t.Errorf("the new directory holds %v, want the notice alone", ents)
	}
	// Done once: a second start moves nothing (not the new layout's dirs).
	if moved, err := MigrateCheckpointRoot(root, log); err != nil || len(moved) != 0 {
		t.Errorf("second run: moved %v, %v", moved, err)
	}
	// Cut short before the marker: what is left, _legacy included, goes to
	// a new _legacy.N.
	root = t.TempDir()
	for _, d := range []string{LegacyDir + "/a", "b"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if moved, err := MigrateCheckpointRoot(root, log); err != nil || !slices.Equal(moved, []string{LegacyDir, "b"}) {
		t.Errorf("interrupted: moved %v, %v", moved, err)
	}
	if _, err := os.Stat(filepath.Join(root, LegacyDir+".1", LegacyDir, "a")); err != nil {
		t.Errorf("interrupted: %v", err)
	}
}
