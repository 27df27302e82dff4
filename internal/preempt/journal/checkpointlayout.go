package journal

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/gpud/gpud/internal/safefs"
	"golang.org/x/sys/unix"
)

// LayoutFile marks a checkpoint root laid out by namespace
// (root/<namespace>/<task>, TaskDir). gpud writes it once the root holds
// nothing of the old layout (root/<task id>).
const LayoutFile = ".gpud-layout"

const layoutNamespaced = "namespaced\n"

// LegacyDir is where MigrateCheckpointRoot sets aside the directories of
// the old layout ("_legacy", "_legacy.1", ...: '_' is in no namespace).
const LegacyDir = "_legacy"

// maxLegacyNamed bounds the names one log line lists.
const maxLegacyNamed = 20

// MigrateCheckpointRoot readies root for the namespaced layout, once. A
// root without LayoutFile may hold directories of the old layout, keyed
// by task id alone: one such directory may hold what two namespaces wrote,
// and its name may be a namespace's ("train-42" is a valid one), so it
// would be taken for that namespace's directory. Each is moved, whole and
// unread, into root/_legacy (made 0700): never mounted nor written again,
// handed to no namespace; the log names them, and an operator who knows
// whose one is may move it to root/<namespace>/<task>. Then LayoutFile is
// written. Interrupted, it starts over: what is left goes to a new
// _legacy.N. It returns the names set aside.
func MigrateCheckpointRoot(root string, log *slog.Logger) ([]string, error) {
	d, err := safefs.OpenDir(root, 0o755)
	if err != nil {
		return nil, fmt.Errorf("preempt: checkpoint root: %w", err)
	}
	defer d.Close()
	if b, err := d.ReadOwned(LayoutFile, 64); err == nil && string(b) == layoutNamespaced {
		return nil, nil
	}
	var moved []string
	legacy := ""
	for {
		names, err := d.Names(1024)
		if err != nil {
			return moved, fmt.Errorf("preempt: checkpoint root: %w", err)
		}
		names = slices.DeleteFunc(names, func(n string) bool { return n == legacy })
		if len(names) == 0 {
			break
		}
		if legacy == "" {
			legacy = LegacyDir
			for i := 1; slices.Contains(names, legacy); i++ {
				legacy = LegacyDir + "." + strconv.Itoa(i)
			}
		}
		ld, err := d.SubDir(legacy, 0o700)
		if err != nil {
			return moved, fmt.Errorf("preempt: checkpoint root: %w", err)
		}
		for _, n := range names {
			// The entry itself moves (a symlink is not followed), within
			// one file system, so nothing of it is read or copied.
			if err := unix.Renameat(int(d.Fd()), n, int(ld.Fd()), n); err != nil {
				ld.Close()
				return moved, fmt.Errorf("preempt: setting aside %s: %w", filepath.Join(root, n), err)
			}
			moved = append(moved, n)
		}
		ld.Close()
	}
	if err := d.WriteFile(LayoutFile, []byte(layoutNamespaced), 0o644, true); err != nil {
		return moved, fmt.Errorf("preempt: checkpoint root: %w", err)
	}
	if len(moved) > 0 {
		named := moved[:min(len(moved), maxLegacyNamed)]
		log.Warn("checkpoint directories of the old layout (keyed by task id alone) set aside: no pod gets them mounted and no notice goes there; "+
			"move one to <checkpoint-root>/<namespace>/<task id> to hand it to that namespace's task",
			"checkpoint_root", root, "legacy_dir", filepath.Join(root, legacy), "count", len(moved), "names", named)
	}
	return moved, nil
}
