//go:build cgo

package nvidia

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpud/gpud/internal/occupancy"
)

// Topology is where each GPU sits: its PCI address and its NVLink group.
type Topology struct {
	BusID map[int]string // minor → PCI bus id, sysfs's form (0000:3b:00.0)
	// Group maps the minor of each GPU with an active NVLink to the
	// lowest NVML index among the GPUs it reaches over NVLink (directly,
	// or through NVSwitches), itself included.
	Group map[int]int
}

// busID is a PCI address in sysfs's form: NVML's busId is
// "%08X:%02X:%02X.0" (nvml.h NVML_DEVICE_PCI_BUS_ID_FMT), sysfs's
// lower-case with a 4-digit domain.
func busID(p nvml.PciInfo) string {
	return fmt.Sprintf("%04x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
}

// Topology asks NVML each device's PCI info and NVLinks, as NVIDIA's own
// allocator (go-gpuallocator) does: for each link, nvmlDeviceGetNvLinkState,
// and for an active one nvmlDeviceGetNvLinkRemotePciInfo_v2. The GPUs and
// the remote ends (peer GPUs, NVSwitches) form a graph whose connected
// components are the groups. A GPU answering NVML_ERROR_NOT_SUPPORTED has
// no NVLink ("the device doesn't support this feature", nvml.h);
// NVML_ERROR_INVALID_ARGUMENT ("device or link is invalid") ends its links.
func (n *NVML) Topology() Topology {
	t := Topology{BusID: map[int]string{}, Group: map[int]int{}}
	parent := map[string]string{}
	var find func(string) string
	find = func(x string) string {
		if p, ok := parent[x]; ok && p != x {
			r := find(p)
			parent[x] = r
			return r
		}
		parent[x] = x
		return x
	}
	linked := map[int]bool{}
	for minor, d := range n.devices {
		p, ret := d.GetPciInfo()
		if ret != nvml.SUCCESS {
			continue
		}
		self := busID(p)
		t.BusID[minor] = self
		find(self)
		for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
			state, ret := d.GetNvLinkState(link)
			if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
				break
			}
			if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
				continue
			}
			remote, ret := d.GetNvLinkRemotePciInfo(link)
			if ret != nvml.SUCCESS {
				continue
			}
			parent[find(self)] = find(busID(remote))
			linked[minor] = true
		}
	}
	// A component with an active link is a group, named by its lowest
	// NVML index; a GPU in it whose own links are down (seen up from the
	// other end only) is in it too.
	hasLink, lowest := map[string]bool{}, map[string]int{}
	for minor, bus := range t.BusID {
		root, idx := find(bus), n.nvmlIdx[minor]
		hasLink[root] = hasLink[root] || linked[minor]
		if l, ok := lowest[root]; !ok || idx < l {
			lowest[root] = idx
		}
	}
	for minor, bus := range t.BusID {
		if root := find(bus); hasLink[root] {
			t.Group[minor] = lowest[root]
		}
	}
	return t
}

// annotateTopology sets each GPU's PCI bus id and NVLink group.
func (n *NVML) annotateTopology(gpus []occupancy.GPU) {
	t := n.Topology()
	for i := range gpus {
		if gpus[i].MIG != nil {
			continue // a slice's node is not its parent's minor
		}
		minor := int(gpus[i].Minor)
		gpus[i].PCIBusID = t.BusID[minor]
		if g, ok := t.Group[minor]; ok {
			gpus[i].NVLinkGroup = &g
		}
	}
}
