package journal

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
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
	// Namespace is the task's Kubernetes namespace ("" for a Docker
	// container): with TaskID, the key of its directory.
	Namespace string `json:"namespace,omitempty"`
	RecordID  string `json:"record_id"`
}

// DockerScope is the checkpoint root's directory of the tasks of Docker
// containers (no Kubernetes namespace): Docker has one scope per host, and
// whoever may start a container there is root's equal. '_' is in no
// namespace name, so no namespace can be given it.
const DockerScope = "_docker"

// maxElem bounds one path element gpud makes of a task id (NAME_MAX is 255).
const maxElem = 200

// TaskDir returns the task's checkpoint directory:
// root/<namespace>/<task id>, root/_docker/<task id> for a Docker
// container's task (namespace ""). Keys carry the namespace, so a pod
// naming another namespace's task id gets a directory of its own. The
// namespace must be a Kubernetes namespace name (a DNS label: no '/', '.',
// '_'); the task id is escaped into one path element, one to one: bytes
// other than [A-Za-z0-9_-] and a '.' not first become %XX (so no "..",
// no hidden name, and "ns/name" is not "ns_name"); a long id is cut and
// ends in '~' and its hash ('~' is otherwise always escaped).
func TaskDir(root, namespace, taskID string) (string, error) {
	scope, task, err := taskElems(namespace, taskID)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, scope, task), nil
}

func taskElems(namespace, taskID string) (scope, task string, err error) {
	scope = DockerScope
	if namespace != "" {
		if !validNamespace(namespace) {
			return "", "", fmt.Errorf("preempt: unusable namespace %q", namespace)
		}
		scope = namespace
	}
	if taskID == "" {
		return "", "", errors.New("preempt: empty task id")
	}
	return scope, escapeElem(taskID), nil
}

// validNamespace: a DNS-1123 label, as Kubernetes names a namespace.
func validNamespace(ns string) bool {
	if len(ns) > 63 || ns[0] == '-' || ns[len(ns)-1] == '-' {
		return false
	}
	for i := 0; i < len(ns); i++ {
		if c := ns[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func escapeElem(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' && i > 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	e := b.String()
	if len(e) > maxElem {
		sum := sha256.Sum256([]byte(s))
		e = e[:maxElem-33] + "~" + hex.EncodeToString(sum[:16])
	}
	return e
}

// WriteNotice writes the task's CheckpointFile atomically and durably.
func WriteNotice(root string, n Notice) (string, error) { return writeNotice(root, n, true) }

// WriteNoticeVisible writes it atomically, visible at once, without
// waiting for the disk (two fsyncs: milliseconds, tens under I/O load):
// for the instant before a kill with a grace period.
func WriteNoticeVisible(root string, n Notice) (string, error) { return writeNotice(root, n, false) }

// writeNotice writes into root/<namespace>/<task>: root must be a directory only root
// can change (safefs); the task's directory may be the task's own (it
// writes its checkpoints there), so gpud opens it without following a
// symlink and writes only through its descriptor: a new file, renamed
// over the notice, never a write through what the task put there.
func writeNotice(root string, n Notice, durable bool) (string, error) {
	scope, task, err := taskElems(n.Namespace, n.TaskID)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, scope, task)
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
	// The namespace's directory is gpud's alone (never mounted): a task
	// cannot plant anything beside its own directory.
	sd, err := rd.SubDir(scope, 0o755)
	if err != nil {
		return p, fmt.Errorf("preempt: checkpoint notice: %w", err)
	}
	defer sd.Close()
	td, err := sd.SubDir(task, 0o755)
	if err != nil {
		return p, fmt.Errorf("preempt: checkpoint notice: %w", err)
	}
	defer td.Close()
	if err := td.WriteFile(CheckpointFile, append(b, '\n'), 0o644, durable); err != nil {
		return p, fmt.Errorf("preempt: checkpoint notice: %w", err)
	}
	return p, nil
}
