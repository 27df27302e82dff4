package dra

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"
)

// ComputeCapacity is the second consumable capacity of a shared GPU: the
// percent of its compute (SM time) a claim is promised, 0..100.
const ComputeCapacity resourceapi.QualifiedName = "compute"

// NVLinkGroupAttribute is the device attribute (gpud.io/nvlinkGroup) that
// GPUs joined by NVLink share: a claim's matchAttribute constraint on it
// keeps a multi-GPU claim on linked GPUs. A GPU without an active NVLink
// has none.
const NVLinkGroupAttribute resourceapi.QualifiedName = "nvlinkGroup"

// computePolicy is compute's request policy: integer percent (step 1:
// finer than a time-slicer holds a pod's share), at most the whole GPU,
// and 0 by default and as the minimum, so that a claim asking no compute
// (every memory claim, each unit of the gpud.io/gpu-mem extended resource)
// consumes none: it is placed as before, is given no target by the
// compute scheduler, and does not limit how many memory sharers a GPU
// takes.
func computePolicy() (resource.Quantity, *resourceapi.CapacityRequestPolicy) {
	pct := func(v int64) *resource.Quantity { return resource.NewQuantity(v, resource.DecimalSI) }
	return *pct(100), &resourceapi.CapacityRequestPolicy{
		Default:    pct(0),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: pct(0), Max: pct(100), Step: pct(1)},
	}
}

// ComputeConfig is the opaque device configuration a claim (or a class)
// gives driver gpud.io:
//
//	config:
//	- opaque:
//	    driver: gpud.io
//	    parameters: {apiVersion: gpud.io/v1, kind: ComputeConfig, hardCap: true}
type ComputeConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// HardCap: never more than the claim's compute, even on an idle GPU.
	HardCap bool `json:"hardCap"`
}

// ComputeConfigAPIVersion and ComputeConfigKind name ComputeConfig.
const (
	ComputeConfigAPIVersion = "gpud.io/v1"
	ComputeConfigKind       = "ComputeConfig"
)

// ErrBadConfig: a claim's opaque configuration for gpud.io is not a
// ComputeConfig gpud understands (the claim is not prepared: a typo must
// not silently leave a pod uncapped).
var ErrBadConfig = errors.New("bad opaque device configuration for driver " + DriverName)

// parseComputeConfig reads one opaque configuration strictly: known
// apiVersion and kind, no unknown field (by its exact name: encoding/json
// alone would take "hardcap" for hardCap), nothing after the object.
func parseComputeConfig(raw []byte) (ComputeConfig, error) {
	var c ComputeConfig
	want := fmt.Sprintf(`want {"apiVersion":%q,"kind":%q,"hardCap":true|false}`, ComputeConfigAPIVersion, ComputeConfigKind)
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&fields); err != nil {
		return c, fmt.Errorf("%w: %w (%s)", ErrBadConfig, err, want)
	}
	if dec.More() {
		return c, fmt.Errorf("%w: data after the object (%s)", ErrBadConfig, want)
	}
	for k := range fields {
		if k != "apiVersion" && k != "kind" && k != "hardCap" {
			return c, fmt.Errorf("%w: unknown field %q (%s)", ErrBadConfig, k, want)
		}
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, fmt.Errorf("%w: %w (%s)", ErrBadConfig, err, want)
	}
	if c.APIVersion != ComputeConfigAPIVersion || c.Kind != ComputeConfigKind {
		return c, fmt.Errorf("%w: apiVersion %q kind %q, want %q %q", ErrBadConfig, c.APIVersion, c.Kind, ComputeConfigAPIVersion, ComputeConfigKind)
	}
	return c, nil
}

// hardCaps returns, per request of the claim's allocation, whether its
// configuration asks for a hard cap. The allocation's configurations are
// the class's then the claim's, in order: a later one for the same request
// wins. A configuration naming no request applies to all; one naming a
// request "r" applies to its subrequests "r/s" too.
func hardCaps(c *resourceapi.ResourceClaim) (map[string]bool, error) {
	out := map[string]bool{}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		for _, cfg := range c.Status.Allocation.Devices.Config {
			if cfg.Opaque == nil || cfg.Opaque.Driver != DriverName || !appliesTo(cfg.Requests, r.Request) {
				continue
			}
			cc, err := parseComputeConfig(cfg.Opaque.Parameters.Raw)
			if err != nil {
				return nil, fmt.Errorf("dra: claim %s/%s, request %s: %w", c.Namespace, c.Name, r.Request, err)
			}
			out[r.Request] = cc.HardCap
		}
	}
	return out, nil
}

func appliesTo(requests []string, request string) bool {
	if len(requests) == 0 {
		return true
	}
	parent, _, _ := strings.Cut(request, "/")
	return slices.Contains(requests, request) || slices.Contains(requests, parent)
}

// consumedCompute is a result's consumed compute, 0 when it has none (a
// device published before compute was). A hard cap needs compute: a cap
// of nothing is a mistake, not a pod that never runs.
func consumedCompute(r resourceapi.DeviceRequestAllocationResult, hardCap bool) (int, error) {
	var v int64
	if q, ok := r.ConsumedCapacity[ComputeCapacity]; ok {
		var exact bool
		if v, exact = q.AsInt64(); !exact || v < 0 || v > 100 {
			return 0, fmt.Errorf("device %s for request %s: consumed compute %s, want 0..100", r.Device, r.Request, q.String())
		}
	}
	if hardCap && v == 0 {
		return 0, fmt.Errorf("request %s: %w: hardCap without compute (ask capacity.requests.compute)", r.Request, ErrBadConfig)
	}
	return int(v), nil
}

// computeAndTopology adds to a published device its compute capacity and
// its topology attributes.
func (d *Driver) computeAndTopology(dev *resourceapi.Device, g GPU) {
	value, policy := computePolicy()
	dev.Capacity[ComputeCapacity] = resourceapi.DeviceCapacity{Value: value, RequestPolicy: policy}
	d.topology(g, dev.Attributes)
}

// topology adds the GPU's topology attributes: the standard PCI bus id
// and PCIe root (resolved in sysfs; left out where it cannot be), and its
// NVLink group.
func (d *Driver) topology(g GPU, attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) {
	if g.NVLinkGroup != nil {
		attrs[NVLinkGroupAttribute] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(*g.NVLinkGroup))}
	}
	if g.PCIBusID == "" {
		return
	}
	if a, err := deviceattribute.GetPCIBusIDAttribute(g.PCIBusID); err == nil {
		attrs[a.Name] = a.Value
	}
	root, err := d.pcieRoot(g.PCIBusID)
	if err == nil {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(root)}
	}
}

// pcieRoot resolves a bus id's PCIe root once (a GPU does not move while
// the driver runs); a failure is logged once and not retried.
func (d *Driver) pcieRoot(busID string) (string, error) {
	d.rootMu.Lock()
	defer d.rootMu.Unlock()
	if r, ok := d.roots[busID]; ok {
		return r.root, r.err
	}
	var mods []deviceattribute.MachineModifier
	if d.cfg.SysDir != "" {
		mods = append(mods, deviceattribute.WithFSFromRoot(d.cfg.SysDir))
	}
	a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(busID, mods...)
	var r rootOf
	if err != nil {
		r.err = err
		if d.cfg.Log != nil {
			d.cfg.Log.Warn("PCIe root of a GPU not known: published without "+string(deviceattribute.StandardDeviceAttributePCIeRoot), "pci_bus_id", busID, "error", err)
		}
	} else {
		r.root = *a.Value.StringValue
	}
	if d.roots == nil {
		d.roots = map[string]rootOf{}
	}
	d.roots[busID] = r
	return r.root, r.err
}

type rootOf struct {
	root string
	err  error
}
