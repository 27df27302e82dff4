package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
	"golang.org/x/sys/unix"
)

// ErrNoGPUs is returned when the device directory has no nvidiaN node.
var ErrNoGPUs = errors.New("nvidia: no nvidia[0-9]+ device nodes")

var gpuNodeRe = regexp.MustCompile(`^nvidia([0-9]+)$`)

// ErrBadGPUNode is returned for nvidiaN nodes gpud cannot name a GPU by.
var ErrBadGPUNode = errors.New("nvidia: unusable GPU device node")

// maxGPUIndex bounds N in nvidiaN: the largest minor number a kernel gives.
const maxGPUIndex = 1<<20 - 1

// DiscoverGPUs stats the nvidiaN character devices in devDir. A GPU is its
// device number, not its name: nodes that are the same device (same
// major:minor, e.g. an operator's second name for it) are one GPU, named by
// its lowest N, the other nodes listed in Aliases. Two different devices
// cannot claim one index (nvidia1 and nvidia01), and N must be a number a
// kernel could give as a minor: such nodes are an error naming them, not a
// GPU silently left out.
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
	type node struct {
		idx  int
		path string
		dev  uint64
	}
	var nodes []node
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
		idx, err := strconv.Atoi(m[1])
		if err != nil || idx > maxGPUIndex {
			return nil, fmt.Errorf("%w: %s: the number after nvidia must be at most %d", ErrBadGPUNode, p, maxGPUIndex)
		}
		nodes = append(nodes, node{idx: idx, path: p, dev: s.Rdev})
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoGPUs, devDir)
	}
	sort.Slice(nodes, func(i, j int) bool {
		if nodes[i].idx != nodes[j].idx {
			return nodes[i].idx < nodes[j].idx
		}
		return nodes[i].path < nodes[j].path
	})
	byDev := map[uint64]int{} // device number → position in gpus
	byIdx := map[int]node{}   // index → the node that named it
	var gpus []occupancy.GPU
	for _, n := range nodes {
		if i, ok := byDev[n.dev]; ok {
			gpus[i].Aliases = append(gpus[i].Aliases, n.path)
			continue
		}
		if other, ok := byIdx[n.idx]; ok {
			return nil, fmt.Errorf("%w: %s and %s are different devices (%d:%d, %d:%d) with the same GPU index %d",
				ErrBadGPUNode, other.path, n.path, unix.Major(other.dev), unix.Minor(other.dev),
				unix.Major(n.dev), unix.Minor(n.dev), n.idx)
		}
		byDev[n.dev], byIdx[n.idx] = len(gpus), n
		gpus = append(gpus, occupancy.GPU{Index: n.idx, Device: n.path, Major: unix.Major(n.dev), Minor: unix.Minor(n.dev)})
	}
	return gpus, nil
}

// WaitGPUs is DiscoverGPUs, tried again every interval while devDir has no
// GPU node yet: on a node whose driver is still being installed (the GPU
// Operator's driver container) the nodes come minutes after gpud starts.
// waiting is called once, before the first wait. Any other error (no such
// directory, an unusable node) is returned at once: waiting would not
// mend it.
func WaitGPUs(ctx context.Context, devDir string, interval time.Duration, waiting func(error)) ([]occupancy.GPU, error) {
	for first := true; ; first = false {
		gpus, err := DiscoverGPUs(devDir)
		if !errors.Is(err, ErrNoGPUs) {
			return gpus, err
		}
		if first && waiting != nil {
			waiting(err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(interval):
		}
	}
}

// SameNodes reports whether two discoveries found the same GPUs: the same
// indexes, device numbers and node paths (what NVML adds is not compared).
func SameNodes(a, b []occupancy.GPU) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Index != b[i].Index || a[i].Major != b[i].Major || a[i].Minor != b[i].Minor || a[i].Device != b[i].Device {
			return false
		}
	}
	return true
}

// WatchNodes looks at the device directory every interval and returns,
// with what it found, when its GPU nodes are no longer gpus or when stop
// reports true; false when ctx ends first. A directory that cannot be read
// for a moment changes nothing; one with no GPU node left does (the driver
// was unloaded).
func WatchNodes(ctx context.Context, devDir string, gpus []occupancy.GPU, interval time.Duration, stop func() bool) ([]occupancy.GPU, bool) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, false
		case <-tick.C:
		}
		now, err := DiscoverGPUs(devDir)
		if err != nil && !errors.Is(err, ErrNoGPUs) {
			continue
		}
		if stop() || !SameNodes(now, gpus) {
			return now, true
		}
	}
}
