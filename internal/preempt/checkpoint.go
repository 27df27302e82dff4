package preempt

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpud/gpud/internal/safefs"
)

// CheckpointFile is the file gpud writes into a task's checkpoint directory
// before it kills the task. The workload contract: on start, a
// task that finds it (or GPUD_RESUME_FROM) resumes from its own checkpoint
// in the same directory instead of starting over.
const CheckpointFile = "gpud-preempted.json"

// Notice is the content of CheckpointFile.
type Notice struct {
	Time     time.Time `json:"time"`
	GPU      int       `json:"gpu"`
	Reason   string    `json:"reason"`
	Signal   string    `json:"signal"` // the first signal the task gets
	GraceSec float64   `json:"grace_seconds"`
	TaskID   string    `json:"task_id"`
	RecordID string    `json:"record_id"`
}

// TaskDir returns root/<task id>, with the id made safe as one path element
// ("ns/name" becomes "ns_name"; no "..").
func TaskDir(root, taskID string) (string, error) {
	safe := strings.NewReplacer("/", "_", "\\", "_", "\x00", "_").Replace(taskID)
	if safe == "" || safe == "." || safe == ".." {
		return "", fmt.Errorf("preempt: unusable task id %q", taskID)
	}
	return filepath.Join(root, safe), nil
}

// WriteNotice writes the task's CheckpointFile atomically and durably.
func WriteNotice(root string, n Notice) (string, error) { return writeNotice(root, n, true) }

// writeNoticeVisible writes it atomically, visible at once, without
// waiting for the disk (two fsyncs: milliseconds, tens under I/O load):
// for the instant before a kill with a grace period.
func writeNoticeVisible(root string, n Notice) (string, error) { return writeNotice(root, n, false) }

// writeNotice writes into root/<task>: root must be a directory only root
// can change (safefs); the task's directory may be the task's own (it
// writes its checkpoints there), so gpud opens it without following a
// symlink and writes only through its descriptor: a new file, renamed
// over the notice, never a write through what the task put there.
func writeNotice(root string, n Notice, durable bool) (string, error) {
	dir, err := TaskDir(root, n.TaskID)
	if err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, CheckpointFile)
	rd, err := safefs.OpenDir(root, 0o755)
	if err != nil {
		return p, fmt.Errorf("preempt: checkpoint root: %w", err)
	}
	defer rd.Close()
	td, err := rd.SubDir(filepath.Base(dir), 0o755)
	if err != nil {
		return p, fmt.Errorf("preempt: checkpoint notice: %w", err)
	}
	defer td.Close()
	if err := td.WriteFile(CheckpointFile, append(b, '\n'), 0o644, durable); err != nil {
		return p, fmt.Errorf("preempt: checkpoint notice: %w", err)
	}
	return p, nil
}
