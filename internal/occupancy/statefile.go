package occupancy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// StateVersion is the state file's schema version.
const StateVersion = 1

// ErrBadStateFile is returned for a state file that is not one gpud wrote.
var ErrBadStateFile = errors.New("occupancy: unreadable state file")

// StateFile is the JSON document at --state-file. Field names are a contract
// other tools rely on.
type StateFile struct {
	Version     int          `json:"version"`
	Node        string       `json:"node"`
	UpdatedAt   time.Time    `json:"updated_at"`
	Monitoring  bool         `json:"monitoring"`
	GPUs        []StateGPU   `json:"gpus"`
	Preemptions []Preemption `json:"preemptions"`
}

// StateGPU is one GPU in the state file.
type StateGPU struct {
	Index     int           `json:"index"`
	UUID      string        `json:"uuid"`
	Device    string        `json:"device"`
	State     State         `json:"state"`
	IdleSince *time.Time    `json:"idle_since"` // last activity, set while idle
	Owner     string        `json:"owner"`
	Borrower  string        `json:"borrower"`
	Holders   []StateHolder `json:"holders"`
	// Aliases are other device nodes of this GPU (same major:minor).
	Aliases []string `json:"aliases,omitempty"`
	// Enforced says whether the kernel gate applies the priority rules to
	// this GPU's opens now: false under --enforce=false, and for a GPU the
	// gate cannot protect. Absent in files of gpuds before it.
	Enforced *bool `json:"enforced,omitempty"`
}

// StateHolder is one process holding a GPU.
type StateHolder struct {
	PID         int       `json:"pid"`
	Comm        string    `json:"comm"`
	CgroupID    uint64    `json:"cgroup_id"`
	ContainerID string    `json:"container_id"`
	PodUID      string    `json:"pod_uid"`
	Priority    Priority  `json:"priority"`
	OpenedAt    time.Time `json:"opened_at"`
	FDs         int       `json:"fds"`
}

// Preemption is a record of a preemption (filled in by the preempt package).
type Preemption = json.RawMessage

// Render turns a snapshot into the state file document.
func Render(s Snapshot, node string, monitoring bool) StateFile {
	f := StateFile{
		Version: StateVersion, Node: node, UpdatedAt: s.Taken.UTC(), Monitoring: monitoring,
		GPUs: []StateGPU{}, Preemptions: []Preemption{},
	}
	for _, g := range s.GPUs {
		sg := StateGPU{Index: g.Index, UUID: g.UUID, Device: g.Device, State: g.State, Holders: []StateHolder{},
			Aliases: slices.Clone(g.Aliases)}
		if g.State == Idle {
			t := g.LastActive.UTC()
			sg.IdleSince = &t
		}
		for _, h := range g.Holders {
			pr := h.Priority
			if pr == "" {
				pr = Unclassified
			}
			sg.Holders = append(sg.Holders, StateHolder{
				PID: h.PID, Comm: h.Comm, CgroupID: h.CgroupID, ContainerID: h.ContainerID,
				PodUID: h.PodUID, Priority: pr, OpenedAt: h.OpenedAt.UTC(), FDs: len(h.FDs),
			})
		}
		f.GPUs = append(f.GPUs, sg)
	}
	return f
}

// MarkEnforced sets each GPU's Enforced from enforced (by GPU index).
func MarkEnforced(f *StateFile, enforced func(gpu int) bool) {
	for i := range f.GPUs {
		e := enforced(f.GPUs[i].Index)
		f.GPUs[i].Enforced = &e
	}
}

// WriteStateFile writes f to path atomically: a temporary file in the same
// directory, fsync, rename, fsync of the directory. Readers see the old or
// the new document, never a part.
func WriteStateFile(path string, f *StateFile) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("occupancy: encoding state: %w", err)
	}
	return WriteAtomic(path, append(b, '\n'))
}

// WriteAtomic replaces path with data atomically.
func WriteAtomic(path string, data []byte) error { return writeAtomic(path, data, true) }

// WriteVisible replaces path atomically without waiting for the disk: a
// reader sees the old or the new content, never a mix, but a crash of the
// host may lose the write. For notices that must be visible at once and
// are made durable later (WriteAtomic), off a latency-critical path.
func WriteVisible(path string, data []byte) error { return writeAtomic(path, data, false) }

func writeAtomic(path string, data []byte, durable bool) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("occupancy: creating %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("occupancy: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("occupancy: writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("occupancy: %w", err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return fmt.Errorf("occupancy: syncing %s: %w", tmp.Name(), err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("occupancy: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("occupancy: replacing %s: %w", path, err)
	}
	if !durable {
		return nil
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// ReadStateFile reads and validates a state file.
func ReadStateFile(path string) (*StateFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseStateFile(b)
}

// ParseStateFile validates a state file's content.
func ParseStateFile(b []byte) (*StateFile, error) {
	var f StateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadStateFile, err)
	}
	if f.Version != StateVersion {
		return nil, fmt.Errorf("%w: version %d, this gpud reads version %d", ErrBadStateFile, f.Version, StateVersion)
	}
	for i, g := range f.GPUs {
		switch g.State {
		case Free, Busy, Idle, Lent:
		default:
			return nil, fmt.Errorf("%w: gpus[%d].state %q", ErrBadStateFile, i, g.State)
		}
		for j, h := range g.Holders {
			if h.PID <= 0 {
				return nil, fmt.Errorf("%w: gpus[%d].holders[%d].pid %d", ErrBadStateFile, i, j, h.PID)
			}
		}
	}
	return &f, nil
}
