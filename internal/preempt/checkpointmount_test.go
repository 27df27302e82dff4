package preempt

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

type records []Record

func (r *records) Recent() []Record { return *r }

// Who gets a preempted task's checkpoint directory: only pods of the task
// in the namespace it was preempted in; one of them (the preempted pod, or
// the first to resume it) read-write, the others read-only.
func TestCheckpointMounts(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"train-42", "ml_train", "other"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(root, "planted")); err != nil {
		t.Fatal(err)
	}
	const victim, resumer, replica, stranger = "uid-victim", "uid-resumer", "uid-replica", "uid-stranger"
	recs := &records{
		{ID: "r1", Action: ActionKill, Victim: Party{PodUID: victim, Namespace: "ml", TaskID: "train-42"}},
		{ID: "d1", Action: ActionDeny, Victim: Party{PodUID: stranger, Namespace: "ml", TaskID: "other"}},
		{ID: "r2", Action: ActionKill, Victim: Party{PodUID: "uid-x", Namespace: "ml", TaskID: "ml/train"}},
		{ID: "r3", Action: ActionKill, Victim: Party{PodUID: "uid-y", Namespace: "ml", TaskID: "planted"}},
		{ID: "r4", Action: ActionKill, Victim: Party{PodUID: "uid-z", TaskID: "no-namespace"}},
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
		if ok && (m.Dir != filepath.Join("/host/ckpt", filepath.Base(m.Dir)) || m.TaskID != task) {
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
	*recs = append(*recs, Record{ID: "r5", Action: ActionKill, Victim: Party{PodUID: victim, Namespace: "ml", TaskID: "train-42"}})
	check("after a new kill, the first pod", replica, "ml", "train-42", want{true, false})
	check("after a new kill, the preempted pod", victim, "ml", "train-42", want{true, true})
	if m, _ := (&Checkpoints{Root: root, Records: recs}).For(replica, "ml", "train-42"); m.Dir != filepath.Join(root, "train-42") || m.RecordID != "r5" {
		t.Errorf("without HostRoot: %+v", m)
	}
	// Disabled without a root.
	if _, ok := (&Checkpoints{Records: recs}).For(replica, "ml", "train-42"); ok {
		t.Error("a mount without --checkpoint-root")
	}
}
