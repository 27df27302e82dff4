package compute

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/safefs"
)

// JournalFile is the file, in gpud's state directory, listing the cgroups
// the compute scheduler may have frozen: written before the first freeze
// of a cgroup, so that a gpud that did not stop cleanly (SIGKILL, a
// crash, a node's power) is followed by one that thaws them at start, and
// `gpud uninstall` thaws them.
const JournalFile = "compute-frozen.json"

// Cgroup is a cgroup's freezer: its kind (cgroups.FreezerV1 or
// FreezerV2) and directory.
type Cgroup struct {
	Kind string `json:"kind"`
	Path string `json:"path"`
}

func writeJournal(dir string, cgs []Cgroup) error {
	d, err := safefs.OpenDir(dir, 0o755)
	if err != nil {
		return fmt.Errorf("compute: journal: %w", err)
	}
	defer d.Close()
	if len(cgs) == 0 {
		return d.Remove(JournalFile)
	}
	b, err := json.Marshal(cgs)
	if err != nil {
		return fmt.Errorf("compute: journal: %w", err)
	}
	return d.WriteFile(JournalFile, b, 0o600, true)
}

// readJournal reads the cgroups the journal in dir lists; none when there
// is no journal.
func readJournal(dir string) ([]Cgroup, error) {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil // no state directory: nothing journaled (not made here)
	}
	d, err := safefs.OpenDir(dir, 0o755)
	if err != nil {
		return nil, fmt.Errorf("compute: journal: %w", err)
	}
	defer d.Close()
	b, err := d.ReadOwned(JournalFile, 1<<20)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("compute: journal: %w", err)
	}
	var cgs []Cgroup
	if err := json.Unmarshal(b, &cgs); err != nil {
		return nil, fmt.Errorf("compute: journal %s: %w", filepath.Join(dir, JournalFile), err)
	}
	return cgs, nil
}

// underCgroupFS: a journaled path is thawed only inside a cgroup
// hierarchy (v1 freezer mount, v2 root), never a file elsewhere.
func underCgroupFS(c Cgroup, v2Root string) bool {
	root := v2Root
	if c.Kind == cgroups.FreezerV1 {
		root = cgroups.V1FreezerMount()
	}
	p := filepath.Clean(c.Path)
	return root != "" && p == c.Path && strings.HasPrefix(p, filepath.Clean(root)+"/")
}

// ThawJournal thaws every cgroup the journal in stateDir lists (a gpud
// that did not stop cleanly: the next one at start, `gpud uninstall`)
// and removes it. A cgroup gone is no error; v2Root is the cgroup v2
// mount (paths outside the hierarchies are ignored). A cgroup skip
// reports (nil: none) is left as it is: a preemption holds it frozen, and
// thawing it would undo that. It returns how many it thawed.
func ThawJournal(stateDir, v2Root string, fz Freezer, skip func(path string) bool) (int, error) {
	cgs, err := readJournal(stateDir)
	if err != nil || len(cgs) == 0 {
		return 0, err
	}
	n := 0
	var errs []error
	for _, c := range slices.Compact(cgs) {
		if !underCgroupFS(c, v2Root) {
			errs = append(errs, fmt.Errorf("compute: journal lists %s, not a cgroup", c.Path))
			continue
		}
		if skip != nil && skip(c.Path) {
			continue // the preemption executor's, from its journal
		}
		switch err := fz.Set(c, false); {
		case err == nil:
			n++
		case errors.Is(err, os.ErrNotExist):
		default:
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 { // else kept: the next try thaws what this one could not
		if err := writeJournal(stateDir, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// CgroupFreezer freezes cgroups through their freezer (the one `docker
// pause` uses on the host: cgroups.WorkloadFreezer).
type CgroupFreezer struct {
	ProcRoot, CgroupRoot string
}

// Locate finds the freezer of workload cgroup cgroupID that process pid
// is in.
func (f CgroupFreezer) Locate(pid int, cgroupID uint64) (Cgroup, error) {
	fz, err := cgroups.WorkloadFreezer(f.ProcRoot, f.CgroupRoot, pid, cgroupID)
	if err != nil {
		return Cgroup{}, err
	}
	defer fz.Close()
	return Cgroup{Kind: fz.Kind, Path: fz.Path}, nil
}

// freezeWait bounds the wait for a freeze to complete: a spinning task
// is frozen when it is next scheduled, under CPU contention a few ms
// later; one in an uninterruptible sleep later still, and then the next
// holder runs beside it rather than wait.
const freezeWait = 5 * time.Millisecond

// Set freezes (waiting up to freezeWait until the cgroup is frozen) or
// thaws c.
func (f CgroupFreezer) Set(c Cgroup, frozen bool) error {
	fz, err := cgroups.OpenFreezer(c.Kind, c.Path, 0)
	if err != nil {
		return err
	}
	defer fz.Close()
	if !frozen {
		return fz.Thaw()
	}
	if err := fz.Freeze(); err != nil {
		return err
	}
	if err := fz.WaitFrozen(freezeWait); err != nil && !errors.Is(err, cgroups.ErrFreezeTimeout) {
		return err
	}
	return nil
}

// Paused reports whether c is frozen, or freezing, by anyone.
func (f CgroupFreezer) Paused(c Cgroup) (bool, error) {
	fz, err := cgroups.OpenFreezer(c.Kind, c.Path, 0)
	if err != nil {
		return false, err
	}
	defer fz.Close()
	return fz.Paused()
}
