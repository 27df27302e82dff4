package nvidia

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"

	"github.com/gpud/gpud/internal/occupancy"
	"golang.org/x/sys/unix"
)

// ErrNoGPUs is returned when the device directory has no nvidiaN node.
var ErrNoGPUs = errors.New("nvidia: no nvidia[0-9]+ device nodes")

var gpuNodeRe = regexp.MustCompile(`^nvidia([0-9]+)$`)

// DiscoverGPUs stats the nvidiaN character devices in devDir.
func DiscoverGPUs(devDir string) ([]occupancy.GPU, error) {
	st, err := os.Stat(devDir)
	if err != nil {
		return nil, fmt.Errorf("device dir: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("device dir %s: not a directory", devDir)
	}
	ents, err := os.ReadDir(devDir)
	if err != nil {
		return nil, fmt.Errorf("device dir: %w", err)
	}
	var gpus []occupancy.GPU
	for _, e := range ents {
		m := gpuNodeRe.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		p := filepath.Join(devDir, e.Name())
		var s unix.Stat_t
		if err := unix.Stat(p, &s); err != nil {
			return nil, fmt.Errorf("device %s: %w", p, err)
		}
		if s.Mode&unix.S_IFMT != unix.S_IFCHR {
			continue
		}
		idx, _ := strconv.Atoi(m[1])
		gpus = append(gpus, occupancy.GPU{Index: idx, Device: p, Major: unix.Major(s.Rdev), Minor: unix.Minor(s.Rdev)})
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoGPUs, devDir)
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	return gpus, nil
}
