package deviceplugin

import (
	"fmt"
	"slices"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Static is a Backend with a fixed set of devices, each a device node
// mapped into the container: what a plain GPU plugin (nvidia.com/gpu)
// does. The tests use it to stand in for NVIDIA's plugin.
type Static struct {
	Notifier
	// Nodes maps device ID → host device node; the node appears in the
	// container at ContainerPath[id] (default: the same path).
	Nodes         map[string]string
	ContainerPath map[string]string
}

func (s *Static) Devices() []Device {
	var out []Device
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for k := range s.Nodes {
			if !yield(k) {
				return
			}
		}
	}) {
		out = append(out, Device{ID: id, Healthy: true})
	}
	return out
}

func (s *Static) Preferred(available, mustInclude []string, size int) []string {
	return Pick(available, mustInclude, size)
}

// Pick is a preferred allocation: mustInclude, then devices from ordered
// (best first) until size are picked; each once. Linear, for requests of
// thousands of ids.
func Pick(ordered, mustInclude []string, size int) []string {
	out := make([]string, 0, min(max(size, len(mustInclude)), len(ordered)+len(mustInclude)))
	picked := make(map[string]bool, cap(out))
	for _, id := range mustInclude {
		if !picked[id] {
			out, picked[id] = append(out, id), true
		}
	}
	for _, id := range ordered {
		if len(out) >= size {
			break
		}
		if !picked[id] {
			out, picked[id] = append(out, id), true
		}
	}
	return out
}

func (s *Static) Allocate(ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	var r pluginapi.ContainerAllocateResponse
	for _, id := range ids {
		host, ok := s.Nodes[id]
		if !ok {
			return nil, fmt.Errorf("%w: unknown device %q", ErrRefused, id)
		}
		ctr := s.ContainerPath[id]
		if ctr == "" {
			ctr = host
		}
		r.Devices = append(r.Devices, &pluginapi.DeviceSpec{HostPath: host, ContainerPath: ctr, Permissions: "rw"})
	}
	return &r, nil
}
