package uninstall

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/safefs"
	"github.com/gpud/gpud/internal/sharing/compute"
)

// JournalFile is the preemption journal's name in the state directory.
const JournalFile = "preemptions.jsonl"

// maxEntries bounds the entries read from a directory gpud wrote in (the
// checkpoint root holds one directory per preempted task).
const maxEntries = 100000

// Paths are gpud's settings that name what it leaves on a node, as
// `gpud run` was given them.
type Paths struct {
	// HostRoot is where the node's / is seen: "/" on the node itself,
	// /host in a cleaner pod (the node's / mounted there by the Job's patch). The paths
	// below are the node's, resolved under it.
	HostRoot       string
	PinDir         string // --bpf-pin-dir; opened as given (a bpffs mount), not under HostRoot
	StateFile      string // --state-file
	ControlSocket  string // --control-socket
	StateDir       string // --state-dir
	CheckpointRoot string // --checkpoint-root
	DRACDIDir      string // --dra-cdi-dir: where the claims' CDI specs are
	// KeepRecords keeps the preemption journal (and so the state directory).
	KeepRecords bool
	// RemoveDRAClaims removes the DRA checkpoint and the CDI specs of
	// claims still prepared too (their pods' containers then cannot
	// restart): for when those pods are gone.
	RemoveDRAClaims bool
}

// Node removes gpud's state from this node: the pinned gate first (so
// that nothing judges opens any more), then its files and the directories
// left empty. It goes on past a failure and returns them all.
func Node(p Paths, log *slog.Logger) error {
	if p.HostRoot == "" {
		p.HostRoot = "/"
	}
	var errs []error
	if p.PinDir != "" {
		if err := bpf.Uninstall(p.PinDir); err != nil {
			errs = append(errs, err)
		} else {
			log.Info("pinned gate removed", "pin_dir", p.PinDir)
		}
	}
	rm := func(path string) {
		if path == "" {
			return
		}
		if err := removeFile(p.HostRoot, path); err != nil {
			errs = append(errs, err)
		}
	}
	if p.StateDir != "" {
		// What a gpud that did not stop cleanly left frozen for compute
		// shares (paths as gpud saw them: this process has its mounts).
		n, err := compute.ThawJournal(filepath.Join(p.HostRoot, p.StateDir), "/sys/fs/cgroup", compute.CgroupFreezer{}, nil)
		if err != nil {
			errs = append(errs, err)
		}
		if n > 0 {
			log.Info("thawed the cgroups the compute scheduler left frozen", "cgroups", n)
		}
	}
	rm(p.StateFile)
	rm(p.ControlSocket)
	if !p.KeepRecords && p.StateDir != "" {
		rm(filepath.Join(p.StateDir, JournalFile))
	}
	if p.CheckpointRoot != "" {
		if err := removeNotices(p.HostRoot, p.CheckpointRoot, log); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeClaims(p, log); err != nil {
		errs = append(errs, err)
	}
	// Directories last, deepest first, each only if empty and gpud's
	// (its name says so, or it is inside the state directory): an empty
	// /tmp or /run that a setting pointed into is not removed.
	dirs := []string{p.CheckpointRoot, dirOf(p.StateFile), dirOf(p.ControlSocket)}
	if !p.KeepRecords {
		dirs = append(dirs, p.StateDir)
	}
	for _, d := range dirs {
		if d == "" || !ownedDir(d, p.StateDir) {
			continue
		}
		if err := removeDir(p.HostRoot, d); err != nil {
			if errors.Is(err, unix.ENOTEMPTY) {
				log.Warn("directory not empty: kept", "dir", d)
				continue
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Clean reports what of gpud is still on this node (nothing: nil): the
// readiness check of a cleaner pod.
func Clean(p Paths) []string {
	if p.HostRoot == "" {
		p.HostRoot = "/"
	}
	var left []string
	if p.PinDir != "" {
		if err := unix.Lstat(filepath.Join(p.PinDir, bpf.GatePin), new(unix.Stat_t)); err == nil {
			left = append(left, filepath.Join(p.PinDir, bpf.GatePin))
		}
	}
	for _, f := range []string{p.StateFile, p.ControlSocket} {
		if f == "" {
			continue
		}
		if err := unix.Lstat(filepath.Join(p.HostRoot, f), new(unix.Stat_t)); err == nil {
			left = append(left, f)
		}
	}
	return left
}

func dirOf(path string) string {
	if path == "" {
		return ""
	}
	return filepath.Dir(path)
}

// ownedDir says whether gpud may remove the directory d when it is empty.
func ownedDir(d, stateDir string) bool {
	d = filepath.Clean(d)
	if d == "/" {
		return false
	}
	if stateDir != "" && strings.HasPrefix(d, filepath.Clean(stateDir)+"/") {
		return true
	}
	return strings.Contains(filepath.Base(d), "gpud")
}

// openDir opens the directory at path (under root) to remove things in
// it: nil, and no error, when it is not there.
func openDir(root, path string) (*safefs.Dir, error) {
	d, err := safefs.OpenExisting(root, path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("uninstall: %s: %w", path, err)
	}
	return d, nil
}

// removeFile removes the file at path (under root).
func removeFile(root, path string) error {
	d, err := openDir(root, filepath.Dir(path))
	if d == nil {
		return err
	}
	defer d.Close()
	if err := d.Remove(filepath.Base(path)); err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	return nil
}

// removeDir removes the directory at path (under root) if it is empty.
func removeDir(root, path string) error {
	d, err := openDir(root, filepath.Dir(path))
	if d == nil {
		return err
	}
	defer d.Close()
	if err := d.RemoveDir(filepath.Base(path)); err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	return nil
}

// removeNotices removes the preemption notices gpud left, one per task
// directory (root/<namespace>/<task>, and the old layout's root/<task>
// set aside under root/_legacy*), the task and namespace directories left
// empty, and the layout marker; a task's own files stay.
func removeNotices(root, checkpointRoot string, log *slog.Logger) error {
	d, err := openDir(root, checkpointRoot)
	if d == nil {
		return err
	}
	defer d.Close()
	names, err := d.Names(maxEntries)
	if err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	var errs []error
	tasks := 0
	for _, n := range names {
		if n == journal.LayoutFile {
			continue
		}
		scope := filepath.Join(checkpointRoot, n)
		sd, err := safefs.OpenExisting(root, scope)
		if err != nil {
			// Not a directory gpud would write in (a file, a symlink, not
			// root's): not gpud's, left alone.
			log.Warn("checkpoint entry left alone", "path", scope, "error", err)
			continue
		}
		tds, err := sd.Names(maxEntries)
		if err != nil {
			sd.Close()
			errs = append(errs, err)
			continue
		}
		for _, tn := range tds {
			td, err := safefs.OpenExisting(root, filepath.Join(scope, tn))
			if err != nil {
				log.Warn("checkpoint entry left alone", "path", filepath.Join(scope, tn), "error", err)
				continue
			}
			err = td.Remove(journal.CheckpointFile)
			td.Close()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			tasks++
			if err := sd.RemoveDir(tn); err != nil && !errors.Is(err, unix.ENOTEMPTY) {
				errs = append(errs, err)
			}
		}
		sd.Close()
		if err := d.RemoveDir(n); err != nil && !errors.Is(err, unix.ENOTEMPTY) {
			errs = append(errs, err)
		}
	}
	if err := d.Remove(journal.LayoutFile); err != nil {
		errs = append(errs, err)
	}
	if tasks > 0 {
		log.Info("preemption notices removed", "checkpoint_root", checkpointRoot, "tasks", tasks)
	}
	return errors.Join(errs...)
}
