package journal

import (
	"fmt"
	"log/slog"
)

// Open opens the state directory's journal (OpenStateJournal) and, with a
// checkpoint root, first sets the old layout's directories (keyed by task
// id alone) aside, before any notice or mount, so that none is handed to a
// namespace (MigrateCheckpointRoot); it returns the checkpoint directories
// the journal keys, nil without a root. An error names the setting at
// fault (--state-dir, --checkpoint-root).
func Open(stateDir, checkpointRoot, hostCheckpointRoot string, log *slog.Logger) (*Journal, *Checkpoints, error) {
	j, err := OpenStateJournal(stateDir, log)
	if err != nil {
		return nil, nil, fmt.Errorf("--state-dir: %w", err)
	}
	if checkpointRoot == "" {
		return j, nil, nil
	}
	if _, err := MigrateCheckpointRoot(checkpointRoot, log); err != nil {
		j.Close()
		return nil, nil, fmt.Errorf("--checkpoint-root: %w", err)
	}
	return j, &Checkpoints{Root: checkpointRoot, HostRoot: hostCheckpointRoot, Records: j}, nil
}

// Mount is For as the workload sources ask it: the directory a container
// of the pod (uid, namespace) whose task is taskID gets mounted, and
// whether read-only.
func (c *Checkpoints) Mount(podUID, namespace, taskID string) (dir string, readOnly, ok bool) {
	m, ok := c.For(podUID, namespace, taskID)
	return m.Dir, m.ReadOnly, ok
}
