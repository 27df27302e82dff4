package lending

import (
	"path/filepath"
	"strconv"

	"github.com/gpud/gpud/internal/occupancy"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// deviceSpecs are the device nodes a borrower of g gets: a whole GPU's
// /dev/nvidiaN; a MIG slice's parent node and its capability node
// /dev/nvidia-caps/nvidia-capM, as NVIDIA's runtime gives a container of a
// MIG device (its NVIDIA_VISIBLE_DEVICES is the slice's MIG UUID). A node
// already in have (the parent of two lent slices) is not given twice.
func (l *Lender) deviceSpecs(have []*pluginapi.DeviceSpec, g occupancy.GPU) []*pluginapi.DeviceSpec {
	add := func(host, ctr string) {
		for _, d := range have {
			if d.ContainerPath == ctr {
				return
			}
		}
		have = append(have, &pluginapi.DeviceSpec{HostPath: host, ContainerPath: ctr, Permissions: "rw"})
	}
	if g.MIG == nil {
		add(l.hostPath(g.Device), "/dev/nvidia"+strconv.Itoa(g.Index))
		return have
	}
	add(l.hostPath(g.MIG.ParentDevice), "/dev/nvidia"+strconv.Itoa(g.MIG.Parent))
	capNode := filepath.Join("nvidia-caps", filepath.Base(g.Device))
	host := g.Device
	if l.cfg.HostDevDir != "" {
		host = filepath.Join(l.cfg.HostDevDir, capNode)
	}
	add(host, "/dev/"+capNode)
	return have
}
