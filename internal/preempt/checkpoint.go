package preempt

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
)

// CheckpointFile is the file gpud writes into a task's checkpoint directory
// before it kills the task (claim 6). The workload contract: on start, a
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
func WriteNotice(root string, n Notice) (string, error) {
	return writeNotice(root, n, occupancy.WriteAtomic)
}

// writeNoticeVisible writes it atomically, visible at once, without
// waiting for the disk (two fsyncs: milliseconds, tens under I/O load):
// for the instant before a kill with a grace period.
func writeNoticeVisible(root string, n Notice) (string, error) {
	return writeNotice(root, n, occupancy.WriteVisible)
}

func writeNotice(root string, n Notice, write func(string, []byte) error) (string, error) {
	dir, err := TaskDir(root, n.TaskID)
	if err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, CheckpointFile)
	return p, write(p, append(b, '\n'))
}
