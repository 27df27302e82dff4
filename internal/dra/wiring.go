package dra

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/metrics"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/prometheus/client_golang/prometheus"
)

// Ledger is where the managed GPUs are known, with their health and
// memory: occupancy.Ledger.
type Ledger interface {
	Snapshot(now time.Time) occupancy.Snapshot
}

// GPUSource is what the driver publishes (its Config.GPUs): the ledger's
// GPUs (a MIG GPU is left alone, never there) with NVML's facts, offered
// when shared, healthy and with their memory known.
type GPUSource struct {
	Ledger        Ledger
	DriverVersion func() string // NVML's
	// Shared is --dra-shared-gpus: GPU indexes or UUIDs, "all" or "none";
	// the node's SharedLabel, when the Driver read one, wins.
	Shared []string
	// DevDir is where gpud sees the device nodes (--dev-dir), HostDevDir
	// where the host has them (--host-dev-dir; "" when the same).
	DevDir, HostDevDir string
	// Driver is the driver publishing them (its node label); set once it
	// is built, before it runs.
	Driver *Driver
}

// GPUs lists the GPUs to publish now, each offered or with why not; a
// shared GPU found unhealthy with its device taint.
func (s *GPUSource) GPUs() []GPU {
	snap := s.Ledger.Snapshot(time.Now())
	version := s.DriverVersion()
	var out []GPU
	for _, g := range snap.GPUs {
		dg := GPU{Index: g.Index, Minor: int(g.Minor), UUID: g.UUID, Product: g.Product, DriverVersion: version,
			HostDevice: s.hostDevice(g.Device)}
		if g.NVMLIndex != nil {
			dg.NVMLIndex = *g.NVMLIndex
		}
		dg.PCIBusID, dg.NVLinkGroup = g.PCIBusID, g.NVLinkGroup
		if g.Memory != nil {
			dg.MemoryTotal = g.Memory.Total
		}
		switch {
		case !s.shared(g.Index, g.UUID):
			dg.Why = "not in --dra-shared-gpus or the node's " + SharedLabel + " label"
		case g.UUID == "":
			dg.Why = "no UUID from NVML"
		case g.Health.Unhealthy:
			dg.Why = "unhealthy: " + g.Health.Reason
			dg.Taint = healthTaint(g.Health)
		case g.Memory == nil:
			dg.Why = "memory not known yet"
		default:
			dg.Offered = true
		}
		out = append(out, dg)
	}
	return out
}

// shared reports whether --dra-shared-gpus, or the node's
// gpud.io/shared-gpus label, names the GPU.
func (s *GPUSource) shared(index int, uuid string) bool {
	list := s.Shared
	if l := s.Driver.NodeShared(); l != nil {
		list = l
	}
	switch {
	case slices.Contains(list, "none"):
		return false
	case slices.Contains(list, "all"):
		return true
	}
	return slices.Contains(list, uuid) || slices.Contains(list, strconv.Itoa(index))
}

// hostDevice is a device node's path as the host sees it (gpud in a pod
// sees the host's /dev under --dev-dir).
func (s *GPUSource) hostDevice(p string) string {
	rel, err := filepath.Rel(s.DevDir, p)
	if s.HostDevDir == "" || err != nil || strings.HasPrefix(rel, "..") {
		return p
	}
	return filepath.Join(s.HostDevDir, rel)
}

// Serve runs the driver until ctx ends, then closes it; a driver that
// stops early is logged: nothing is shared by memory from then on.
func (d *Driver) Serve(ctx context.Context) {
	defer d.Close()
	if err := d.Run(ctx); err != nil {
		d.cfg.Log.Error("DRA driver stopped: no GPU is shared by memory", "error", err)
	}
}

// RegisterMetrics registers the driver's counters, read at each scrape.
func (d *Driver) RegisterMetrics(reg prometheus.Registerer) {
	stat := func(f func(Stats) float64) func() float64 { return func() float64 { return f(d.Stats()) } }
	name := func(n string) string { return metrics.Namespace + "_dra_" + n }
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name("claims_prepared"), Help: "Claims gpud's DRA driver has prepared on this node (its checkpoint)."},
			stat(func(s Stats) float64 { return float64(s.Claims) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name("devices_offered"), Help: "GPUs in this node's ResourceSlice of driver gpud.io (shared, healthy, memory known)."},
			stat(func(s Stats) float64 { return float64(s.Offered) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name("devices_tainted"), Help: "GPUs in this node's ResourceSlice with a gpud.io/unhealthy device taint (shared, found unhealthy)."},
			stat(func(s Stats) float64 { return float64(s.Tainted) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name("slice_publishes_total"), Help: "ResourceSlice contents handed to the API server (each change of the shared GPUs)."},
			stat(func(s Stats) float64 { return float64(s.Published) })),
	)
	for result, f := range map[string]func(Stats) uint64{
		"prepared": func(s Stats) uint64 { return s.Prepared },
		"already":  func(s Stats) uint64 { return s.AlreadyPrepared },
		"failed":   func(s Stats) uint64 { return s.PrepareFailed },
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: name("prepares_total"), ConstLabels: prometheus.Labels{"result": result},
			Help: "Claim preparations asked by kubelet, by result: prepared (new), already (prepared before: kubelet or gpud restarted), failed.",
		}, stat(func(s Stats) float64 { return float64(f(s)) })))
	}
	for by, f := range map[string]func(Stats) uint64{
		"kubelet":   func(s Stats) uint64 { return s.Unprepared - s.Collected },
		"collected": func(s Stats) uint64 { return s.Collected },
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: name("unprepares_total"), ConstLabels: prometheus.Labels{"by": by},
			Help: "Claims unprepared, by who asked: kubelet, or gpud's collection of claims deleted while it was down.",
		}, stat(func(s Stats) float64 { return float64(f(s)) })))
	}
}

// Decorate adds the driver's section to the state document; a nil Driver
// (no DRA) adds none.
func (d *Driver) Decorate(f *v1.StateFile) {
	if d == nil {
		return
	}
	st := d.Stats()
	s := &v1.StateDRA{Driver: DriverName, Offered: st.Offered, Claims: st.Claims}
	uuids := map[int]string{}
	for _, g := range f.GPUs {
		uuids[g.Index] = g.UUID
	}
	why := d.NotOffered()
	for _, idx := range slices.Sorted(maps.Keys(why)) {
		s.NotOffered = append(s.NotOffered, v1.StateNotOffered{Index: idx, UUID: uuids[idx], Reason: why[idx]})
	}
	f.DRA = s
}
