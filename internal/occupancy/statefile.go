package occupancy

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/safefs"
)

// ErrBadStateFile is returned for a state file that is not one gpud wrote.
var ErrBadStateFile = errors.New("occupancy: unreadable state file")

// Render turns a snapshot into the state file document.
func Render(s Snapshot, node string, monitoring bool) v1.StateFile {
	f := v1.StateFile{
		Version: v1.StateVersion, Node: node, UpdatedAt: s.Taken.UTC(), Monitoring: monitoring,
		GPUs: []v1.StateGPU{}, Preemptions: []v1.RawPreemption{},
	}
	for _, g := range s.GPUs {
		sg := v1.StateGPU{Index: g.Index, UUID: g.UUID, Device: g.Device, State: g.State, Holders: []v1.StateHolder{},
			Aliases: slices.Clone(g.Aliases)}
		if g.NVMLIndex != nil {
			n := *g.NVMLIndex
			sg.NVMLIndex = &n
		}
		if m := g.MIG; m != nil {
			sg.MIG = &v1.StateMIG{Parent: m.Parent, ParentUUID: m.ParentUUID, ParentDevice: m.ParentDevice, GI: m.GI, CI: m.CI, Profile: m.Profile}
		}
		if g.State == Idle {
			t := g.LastActive.UTC()
			sg.IdleSince = &t
		}
		if g.Memory != nil {
			sg.Memory = &v1.StateMemory{TotalBytes: g.Memory.Total, UsedBytes: g.Memory.Used, FreeBytes: g.Memory.Free()}
		}
		if g.Health.Unhealthy {
			t := g.Health.Since.UTC()
			sg.Health = &v1.StateGPUHealth{Reason: g.Health.Reason, Since: &t, Events: g.Health.Events}
		} else if g.Memory != nil || g.Health.Events > 0 { // NVML is there to tell
			sg.Health = &v1.StateGPUHealth{Healthy: true, Events: g.Health.Events}
		}
		for _, h := range g.Holders {
			sg.Holders = append(sg.Holders, stateHolder(h))
		}
		for _, h := range g.Agents {
			sg.Agents = append(sg.Agents, stateHolder(h))
		}
		f.GPUs = append(f.GPUs, sg)
	}
	return f
}

func stateHolder(h HolderView) v1.StateHolder {
	pr := h.Priority
	if pr == "" {
		pr = Unclassified
	}
	sh := v1.StateHolder{
		PID: h.PID, Comm: h.Comm, CgroupID: h.CgroupID, ContainerID: h.ContainerID,
		PodUID: h.PodUID, Priority: pr, OpenedAt: h.OpenedAt.UTC(), FDs: len(h.FDs),
		OpenedBeforeClassified: h.OpenedUnknown, MemoryBytes: h.Memory,
	}
	if !h.LastActive.IsZero() {
		t := h.LastActive.UTC()
		sh.LastActive = &t
	}
	return sh
}

// WriteStateFile writes f to path atomically: a temporary file in the same
// directory, fsync, rename, fsync of the directory. Readers see the old or
// the new document, never a part.
func WriteStateFile(path string, f *v1.StateFile) error { return writeStateFile(path, f, true) }

// writeStateFile is WriteStateFile; durable false leaves out the fsyncs
// (the Writer makes its writes durable apart, syncFile). The document is
// compact: indenting it took two thirds of a write's CPU with 500 holders
// (1.3 of 1.9 ms on a busy 2-vCPU machine), on the path from a change to
// the file; `gpud status -o json` shows it indented.
func writeStateFile(path string, f *v1.StateFile, durable bool) error {
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("occupancy: encoding state: %w", err)
	}
	return writeAtomic(path, append(b, '\n'), durable)
}

// syncFile makes the file at path, as it is now, durable: an fsync of it
// and of its directory (which holds the rename that put it there).
func syncFile(path string) error {
	for _, p := range []string{path, filepath.Dir(path)} {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("occupancy: syncing: %w", err)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("occupancy: syncing %s: %w", p, err)
		}
	}
	return nil
}

// WriteAtomic replaces path with data atomically.
func WriteAtomic(path string, data []byte) error { return writeAtomic(path, data, true) }

// WriteVisible replaces path atomically without waiting for the disk: a
// reader sees the old or the new content, never a mix, but a crash of the
// host may lose the write. For notices that must be visible at once and
// are made durable later (WriteAtomic), off a latency-critical path.
func WriteVisible(path string, data []byte) error { return writeAtomic(path, data, false) }

func writeAtomic(path string, data []byte, durable bool) error {
	// The directory must be one only root can change (safefs); the file is
	// created exclusively there and renamed into place, so a symlink or a
	// file another user planted is replaced, never written through.
	d, err := safefs.OpenDir(filepath.Dir(path), 0o755)
	if err != nil {
		return fmt.Errorf("occupancy: %w", err)
	}
	defer d.Close()
	if err := d.WriteFile(filepath.Base(path), data, 0o644, durable); err != nil {
		return fmt.Errorf("occupancy: %w", err)
	}
	return nil
}

// ReadStateFile reads and validates a state file.
func ReadStateFile(path string) (*v1.StateFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseStateFile(b)
}

// maxStateFile bounds what gpud reads back of a state file: a document for
// hundreds of GPUs and holders is well under it.
const maxStateFile = 64 << 20

// ReadOwnStateFile reads back a state file gpud wrote, to take settings
// from it (the monitoring switch): the directory must pass safefs's rule
// and the file must be a regular file root owns that nobody else can
// write, not a symlink; otherwise the error wraps safefs.ErrUnsafe.
func ReadOwnStateFile(path string) (*v1.StateFile, error) {
	d, err := safefs.OpenDir(filepath.Dir(path), 0o755)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	b, err := d.ReadOwned(filepath.Base(path), maxStateFile)
	if err != nil {
		return nil, err
	}
	return ParseStateFile(b)
}

// ParseStateFile validates a state file's content.
func ParseStateFile(b []byte) (*v1.StateFile, error) {
	var f v1.StateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadStateFile, err)
	}
	if f.Version != v1.StateVersion {
		return nil, fmt.Errorf("%w: version %d, this gpud reads version %d", ErrBadStateFile, f.Version, v1.StateVersion)
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
		for j, h := range g.Agents {
			if h.PID <= 0 {
				return nil, fmt.Errorf("%w: gpus[%d].agents[%d].pid %d", ErrBadStateFile, i, j, h.PID)
			}
		}
	}
	return &f, nil
}

// LastMonitoring returns the monitoring switch the state file at path says
// the previous gpud left (on when there is none). The switch is taken only
// from a state file gpud wrote (root's, not writable by others, not a
// symlink): anyone else's is ignored and replaced. A damaged file is set
// aside and rebuilt from the kernel and /proc.
func LastMonitoring(path string, log *slog.Logger) bool {
	prev, err := ReadOwnStateFile(path)
	switch {
	case err == nil:
		return prev.Monitoring
	case errors.Is(err, safefs.ErrUnsafe):
		log.Warn("state file not written by gpud: its settings are ignored, and it is replaced", "path", path, "error", err)
	case !errors.Is(err, os.ErrNotExist):
		aside := path + ".corrupt"
		_ = os.Rename(path, aside)
		log.Warn("state file unreadable; rebuilding it from the kernel and /proc", "path", path, "moved_to", aside, "error", err)
	}
	return true
}
