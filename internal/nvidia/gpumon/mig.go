package gpumon

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"golang.org/x/sys/unix"
)

// MIGIndexBase is where the indexes of MIG slices start: a slice's index is
// MIGIndexBase plus the minor M of its capability node nvidia-capM, above
// every N a /dev/nvidiaN can have, so a slice never takes a GPU's index.
const MIGIndexBase = 1 << 20

// DefaultMIGMinors is where the driver lists its MIG capability nodes.
const DefaultMIGMinors = "/proc/driver/nvidia-caps/mig-minors"

// MIGDevice is one MIG device NVML lists on a MIG-enabled GPU: a compute
// instance of a GPU instance.
type MIGDevice struct {
	GI, CI      int
	UUID        string // "MIG-..."
	Profile     string // e.g. "1g.10gb": NVML names a MIG device "<GPU name> MIG <profile>"
	MemoryTotal uint64 // bytes; 0 when NVML does not say
}

// MIGLister is an NVML that lists a MIG-enabled GPU's MIG devices
// (internal/nvidia's NVML is one). With an NVML that is not, a GPU in MIG
// mode is left alone.
type MIGLister interface {
	MIGDevices(gpu int) ([]MIGDevice, error)
}

// MIGNodes says where a MIG instance's capability node is found: the
// driver's table of capability minors and the directory of the nodes.
// Zero: slices are not looked for, and a GPU in MIG mode is left alone.
type MIGNodes struct {
	MinorsFile string // /proc/driver/nvidia-caps/mig-minors
	CapDir     string // <dev-dir>/nvidia-caps
	// ProcDevices is /proc/devices, where the nvidia-caps major is read
	// for a capability node not (yet) in CapDir; "" reads no major.
	ProcDevices string
}

// MIGCap names one line of mig-minors: gpuN/giG/access (CI -1) or
// gpuN/giG/ciC/access; N is the GPU's minor number.
type MIGCap struct{ GPU, GI, CI int }

// maxMIGMinors bounds what is read of the mig-minors file (a few thousand
// short lines on the largest nodes).
const maxMIGMinors = 1 << 20

// ParseMIGMinors reads the driver's mig-minors table: each instance's
// access capability and the minor of its /dev/nvidia-caps node. Other
// lines (config, monitor, entries of later drivers) are skipped.
func ParseMIGMinors(r io.Reader) (map[MIGCap]int, error) {
	out := map[MIGCap]int{}
	sc := bufio.NewScanner(io.LimitReader(r, maxMIGMinors))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		minor, err := strconv.Atoi(f[1])
		if err != nil || minor < 0 || minor > 1<<20-1 {
			continue
		}
		p := strings.Split(f[0], "/")
		if p[len(p)-1] != "access" || (len(p) != 3 && len(p) != 4) {
			continue
		}
		c := MIGCap{CI: -1}
		ok := num(p[0], "gpu", &c.GPU) && num(p[1], "gi", &c.GI)
		if len(p) == 4 {
			ok = ok && num(p[2], "ci", &c.CI)
		}
		if ok {
			out[c] = minor
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mig-minors: %w", err)
	}
	return out, nil
}

// num parses s as prefix followed by a number.
func num(s, prefix string, out *int) bool {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 {
		return false
	}
	*out = n
	return true
}

// capsMajor reads the nvidia-caps major from /proc/devices (a dynamic
// number); 0 when it is not there.
func capsMajor(procDevices string) uint32 {
	b, err := os.ReadFile(procDevices)
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[1] == "nvidia-caps" {
			if n, err := strconv.ParseUint(f[0], 10, 32); err == nil {
				return uint32(n)
			}
		}
	}
	return 0
}

// migSlices are the MIG instances of parent as GPUs of their own, each
// keyed by its GPU instance's access capability node (the node its
// processes hold open, beside the parent's /dev/nvidiaN, and the device
// number the kernel side tracks); parent is left alone, shown as their
// parent. Without slices (no lister, no table, no node) it is left alone
// as before, with the reason.
func (m *Monitor) migSlices(parent occupancy.GPU) []occupancy.GPU {
	found, err := m.findSlices(parent)
	if len(found) == 0 {
		if err == nil {
			err = errors.New("NVML lists no MIG instance on it")
		}
		m.log().Warn("GPU left alone: MIG is enabled and its slices cannot be tracked", "gpu", parent.Index, "device", parent.Device, "uuid", parent.UUID, "error", err)
		m.leftAlone = append(m.leftAlone, v1.StateLeftAlone{Device: parent.Device, UUID: parent.UUID, Reason: leftAloneMIG + ": " + err.Error()})
		return nil
	}
	var names []string
	for _, s := range found {
		names = append(names, fmt.Sprintf("gi%d %s %s", s.MIG.GI, s.MIG.Profile, s.Device))
	}
	m.log().Info("GPU in MIG mode: each slice is a GPU of its own; the parent stays out of the rules", "gpu", parent.Index, "uuid", parent.UUID, "slices", names)
	reason := migParentReason(len(found))
	if err != nil {
		// Shown, never hidden: a slice gpud cannot key is not protected.
		m.log().Warn("MIG slices not tracked: not protected", "gpu", parent.Index, "error", err)
		reason += "; not tracked, so not protected: " + err.Error()
	}
	m.leftAlone = append(m.leftAlone, v1.StateLeftAlone{Device: parent.Device, UUID: parent.UUID, Reason: reason})
	return found
}

// migParentReason is why a GPU in MIG mode whose slices are tracked is not
// itself judged: it is their parent.
func migParentReason(n int) string {
	return fmt.Sprintf("MIG enabled: the parent of %d slices, each judged and lent as a GPU of its own (gpus[].mig.parent); its node, which every slice's processes open, is not judged", n)
}

// findSlices joins NVML's MIG devices of parent with the driver's
// capability table; the error names the instances it could not key.
func (m *Monitor) findSlices(parent occupancy.GPU) ([]occupancy.GPU, error) {
	if m.MIGNodes.MinorsFile == "" {
		return nil, errors.New("no mig-minors file set")
	}
	lister, ok := m.Lib.(MIGLister)
	if !ok {
		return nil, errors.New("this NVML lists no MIG devices")
	}
	devs, err := lister.MIGDevices(parent.Index)
	if err != nil {
		return nil, fmt.Errorf("listing MIG devices: %w", err)
	}
	f, err := os.Open(m.MIGNodes.MinorsFile)
	if err != nil {
		return nil, fmt.Errorf("MIG capability minors: %w", err)
	}
	defer f.Close()
	minors, err := ParseMIGMinors(f)
	if err != nil {
		return nil, fmt.Errorf("MIG capability minors %s: %w", m.MIGNodes.MinorsFile, err)
	}
	var major uint32
	if m.MIGNodes.ProcDevices != "" {
		major = capsMajor(m.MIGNodes.ProcDevices)
	}
	var out []occupancy.GPU
	var errs []error
	seen := map[int]bool{}
	for _, d := range devs {
		// A GPU instance is the unit of memory and of access: its compute
		// instances are reached through its access node too. The first
		// compute instance listed names it.
		if seen[d.GI] {
			continue
		}
		seen[d.GI] = true
		capMinor, ok := minors[MIGCap{GPU: int(parent.Minor), GI: d.GI, CI: -1}]
		if !ok {
			errs = append(errs, fmt.Errorf("gpu%d/gi%d/access not in %s", parent.Minor, d.GI, m.MIGNodes.MinorsFile))
			continue
		}
		node := filepath.Join(m.MIGNodes.CapDir, "nvidia-cap"+strconv.Itoa(capMinor))
		var st unix.Stat_t
		switch err := unix.Stat(node, &st); {
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR:
			// The node's own number: what opens of it carry.
		case err != nil && errors.Is(err, os.ErrNotExist) && major != 0:
			// Not made yet (nvidia-modprobe makes it on first use): its
			// number is the nvidia-caps major and the table's minor.
			st.Rdev = unix.Mkdev(major, uint32(capMinor))
		case err != nil:
			errs = append(errs, fmt.Errorf("capability node of gi%d: %w", d.GI, err))
			continue
		default:
			errs = append(errs, fmt.Errorf("capability node %s: not a character device", node))
			continue
		}
		product := parent.Product
		if d.Profile != "" {
			product = strings.TrimSpace(product + " MIG " + d.Profile)
		}
		out = append(out, occupancy.GPU{
			Index: MIGIndexBase + capMinor, UUID: d.UUID, Product: product, Device: node,
			Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev),
			MIG: &occupancy.MIGSlice{Parent: parent.Index, ParentUUID: parent.UUID, ParentDevice: parent.Device,
				GI: d.GI, CI: d.CI, Profile: d.Profile, CapMinor: capMinor},
		})
	}
	slices.SortFunc(out, func(a, b occupancy.GPU) int { return a.Index - b.Index })
	return out, errors.Join(errs...)
}
