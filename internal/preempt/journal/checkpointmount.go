package journal

import (
	"os"
	"sync"

	"github.com/gpud/gpud/internal/preempt"
)

// CheckpointMount is a task's checkpoint directory as a container gets it.
type CheckpointMount struct {
	Dir      string // on the host
	ReadOnly bool
	TaskID   string
	RecordID string // the task's newest kill record
}

// Checkpoints decides which containers get a preempted task's checkpoint
// directory, and how. A task id is a label anyone can put on a pod, so the
// directory goes only to a pod of the namespace the task was preempted in
// (the tenant), and only one pod may write it, the one that owns it: the
// first pod of the task to start a container after the kill that is
//
//   - the pod that was preempted (the kill left the pod in place: a
//     restarted container resumes), or
//   - any pod of the task while the task's newest kill record is not yet
//     resumed: the pod resuming the task.
//
// The claim lasts until the task is preempted again (a new record); it is
// kept in memory, so after a gpud restart the first such pod claims again.
// Every other pod of the task in that namespace (a second replica, a pod
// started after the resume) gets it read-only: it may resume from the
// checkpoint, never overwrite or plant files in it. A task gpud never
// preempted, one preempted in another namespace, or one whose directory
// is not a plain directory gets nothing.
type Checkpoints struct {
	Root string // --checkpoint-root as gpud sees it; "" disables
	// HostRoot is Root as the runtime (the host) sees it, the mount's
	// source; "" is Root.
	HostRoot string
	Records  interface{ Recent() []preempt.Record }

	mu     sync.Mutex
	claims map[string]string // kill record id → the pod uid resuming the task
}

// For returns the checkpoint mount a container of the pod (uid,
// namespace) whose task is taskID gets, if any.
func (c *Checkpoints) For(podUID, namespace, taskID string) (CheckpointMount, bool) {
	if c == nil || c.Root == "" || c.Records == nil || podUID == "" || namespace == "" || taskID == "" {
		return CheckpointMount{}, false
	}
	recs := c.Records.Recent()
	var rec *preempt.Record
	live := map[string]bool{}
	for i := range recs {
		r := &recs[i]
		if r.Action == preempt.ActionKill {
			live[r.ID] = true
			// The task is (namespace, task id): another namespace's
			// kill of the same id is another task, with its own directory.
			if r.Victim.TaskID == taskID && r.Victim.Namespace == namespace {
				rec = r // the newest wins: records are oldest first
			}
		}
	}
	if rec == nil {
		return CheckpointMount{}, false
	}
	dir, err := TaskDir(c.Root, namespace, taskID)
	if err != nil {
		return CheckpointMount{}, false
	}
	// gpud made it (safefs, in a root-only directory); a symlink or
	// anything else there is not mounted into a container.
	if st, err := os.Lstat(dir); err != nil || !st.Mode().IsDir() {
		return CheckpointMount{}, false
	}
	host := dir
	if c.HostRoot != "" {
		host, _ = TaskDir(c.HostRoot, namespace, taskID)
	}
	m := CheckpointMount{Dir: host, ReadOnly: true, TaskID: taskID, RecordID: rec.ID}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.claims == nil {
		c.claims = map[string]string{}
	}
	for id := range c.claims { // bounded by the journal's recent records
		if !live[id] {
			delete(c.claims, id)
		}
	}
	if claim := c.claims[rec.ID]; claim == podUID || (claim == "" && (rec.Victim.PodUID == podUID || rec.ResumedAt == nil)) {
		c.claims[rec.ID] = podUID
		m.ReadOnly = false
	}
	return m, true
}
