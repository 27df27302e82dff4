package dra

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// A shared GPU publishes compute beside memory: 100 percent, integer
// steps, 0 by default (a claim that names no compute consumes none); and
// where it sits: its NVLink group, PCI bus id and PCIe root.
func TestDevicesOfferComputeAndTopology(t *testing.T) {
	sys := t.TempDir()
	// sysfs: /sys/bus/pci/devices/<bdf> links to the device under its root.
	dev := filepath.Join(sys, "devices", "pci0000:3a", "0000:3a:00.0", "0000:3b:00.0")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	links := filepath.Join(sys, "bus", "pci", "devices")
	if err := os.MkdirAll(links, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", filepath.Join(links, "0000:3b:00.0")); err != nil {
		t.Fatal(err)
	}
	d := &Driver{cfg: Config{Reserve: 512 << 20, Min: 256 << 20, Step: 256 << 20, Default: 4 << 30, SysDir: sys}}
	gpus := testGPUs()
	gpus[0].PCIBusID, gpus[0].NVLinkGroup = "0000:3b:00.0", ptr.To(1)
	gpus[1].PCIBusID = "0000:5e:00.0" // not in this sysfs: no root
	devs := d.Devices(gpus)
	if len(devs) != 2 {
		t.Fatalf("%d devices", len(devs))
	}
	for _, dv := range devs {
		c, ok := dv.Capacity[ComputeCapacity]
		p := c.RequestPolicy
		if !ok || c.Value.Value() != 100 || p == nil || p.Default.Value() != 0 || p.ValidRange == nil ||
			p.ValidRange.Min.Value() != 0 || p.ValidRange.Max.Value() != 100 || p.ValidRange.Step.Value() != 1 {
			t.Errorf("%s: compute capacity %+v", dv.Name, c)
		}
		if _, ok := dv.Capacity[MemoryCapacity]; !ok {
			t.Errorf("%s: memory capacity gone", dv.Name)
		}
	}
	a0, a1 := devs[0].Attributes, devs[1].Attributes
	if g := a0[NVLinkGroupAttribute].IntValue; g == nil || *g != 1 {
		t.Errorf("NVLink group %v, want 1", g)
	}
	if r := a0["resource.kubernetes.io/pcieRoot"].StringValue; r == nil || *r != "pci0000:3a" {
		t.Errorf("pcieRoot %v, want pci0000:3a", r)
	}
	if b := a0["resource.kubernetes.io/pciBusID"].StringValue; b == nil || *b != "0000:3b:00.0" {
		t.Errorf("pciBusID %v", b)
	}
	if _, ok := a1[NVLinkGroupAttribute]; ok {
		t.Errorf("a GPU without NVLink has a group: %+v", a1)
	}
	if _, ok := a1["resource.kubernetes.io/pcieRoot"]; ok {
		t.Errorf("a root that sysfs does not know published: %+v", a1)
	}
	if b := a1["resource.kubernetes.io/pciBusID"].StringValue; b == nil || *b != "0000:5e:00.0" {
		t.Errorf("pciBusID of the second %v", b)
	}
}

// computeClaim is claim with compute consumed (-1: none) and opaque
// configurations (class's first, then the claim's).
func computeClaim(name string, compute int64, cfgs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	c := claim(name, "uid-"+name, strings.ToLower(uuid0), "4Gi")
	if compute >= 0 {
		c.Status.Allocation.Devices.Results[0].ConsumedCapacity[ComputeCapacity] = *resource.NewQuantity(compute, resource.DecimalSI)
	}
	c.Status.Allocation.Devices.Config = cfgs
	return c
}

func opaque(params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source:   resourceapi.AllocationConfigSourceClaim,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

const hardCapOn = `{"apiVersion":"gpud.io/v1","kind":"ComputeConfig","hardCap":true}`

// Prepare records each claim's compute and hard cap in its share.
func TestPrepareRecordsComputeAndHardCap(t *testing.T) {
	state, cdi := dirs(t)
	d, _ := newDriver(t, state, cdi)
	other := opaque(`{"whatever":1}`)
	other.Opaque.Driver = "gpu.nvidia.com" // another driver's: not read
	claims := []*resourceapi.ResourceClaim{
		computeClaim("capped", 30, other, opaque(hardCapOn)),
		computeClaim("shared", 70),
		computeClaim("memonly", -1),
		computeClaim("otherreq", 20, opaque(hardCapOn, "not-gpu")),
		// The class says capped, the claim (later) says not.
		computeClaim("override", 40, opaque(hardCapOn), opaque(`{"apiVersion":"gpud.io/v1","kind":"ComputeConfig","hardCap":false}`, "gpu")),
	}
	res, err := d.PrepareResourceClaims(context.Background(), claims)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims {
		if res[c.UID].Err != nil {
			t.Fatalf("%s: %v", c.Name, res[c.UID].Err)
		}
	}
	type want struct {
		compute int
		hard    bool
	}
	wants := map[string]want{"capped": {30, true}, "shared": {70, false}, "memonly": {0, false}, "otherreq": {20, false}, "override": {40, false}}
	shares := d.cfg.Book.Shares()
	if len(shares) != len(wants) {
		t.Fatalf("%d shares", len(shares))
	}
	for _, s := range shares {
		if w := wants[s.ClaimName]; s.Compute != w.compute || s.HardCap != w.hard || s.Bytes != 4<<30 {
			t.Errorf("%s: compute %d hard %v bytes %d, want %+v", s.ClaimName, s.Compute, s.HardCap, s.Bytes, w)
		}
	}
	// A restart reads them back from the checkpoint.
	d2, _ := newDriver(t, state, cdi)
	for _, s := range d2.cfg.Book.Shares() {
		if w := wants[s.ClaimName]; s.Compute != w.compute || s.HardCap != w.hard {
			t.Errorf("after a restart, %s: compute %d hard %v, want %+v", s.ClaimName, s.Compute, s.HardCap, w)
		}
	}
}

// A configuration gpud does not understand fails the claim's preparation,
// saying why: a typo must not leave a pod silently uncapped.
func TestPrepareRefusesBadComputeConfig(t *testing.T) {
	state, cdi := dirs(t)
	d, _ := newDriver(t, state, cdi)
	cases := map[*resourceapi.ResourceClaim]string{
		computeClaim("unknownkey", 30, opaque(`{"apiVersion":"gpud.io/v1","kind":"ComputeConfig","hardcap":true}`)): `unknown field "hardcap"`,
		computeClaim("kind", 30, opaque(`{"apiVersion":"gpud.io/v1","kind":"MemoryConfig","hardCap":true}`)):        `kind "MemoryConfig"`,
		computeClaim("version", 30, opaque(`{"apiVersion":"gpud.io/v2","kind":"ComputeConfig"}`)):                   `apiVersion "gpud.io/v2"`,
		computeClaim("type", 30, opaque(`{"apiVersion":"gpud.io/v1","kind":"ComputeConfig","hardCap":"yes"}`)):      "hardCap",
		computeClaim("trailing", 30, opaque(hardCapOn+`{}`)):                                                        "after the object",
		computeClaim("nocompute", -1, opaque(hardCapOn)):                                                            "hardCap without compute",
	}
	var claims []*resourceapi.ResourceClaim
	for c := range cases {
		claims = append(claims, c)
	}
	res, err := d.PrepareResourceClaims(context.Background(), claims)
	if err != nil {
		t.Fatal(err)
	}
	for c, want := range cases {
		err := res[c.UID].Err
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ErrBadConfig saying %q", c.Name, err, want)
		}
	}
	// Compute past the GPU: refused too (no scheduler allocates it).
	over := computeClaim("over", 150)
	res, _ = d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{over})
	if err := res[over.UID].Err; err == nil || !strings.Contains(err.Error(), "want 0..100") {
		t.Errorf("compute 150: %v", err)
	}
	if s := d.cfg.Book.Shares(); len(s) != 0 {
		t.Errorf("refused claims in the book: %+v", s)
	}
}
