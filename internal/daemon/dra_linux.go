package daemon

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/deviceplugin/lending"
	"github.com/gpud/gpud/internal/dra"
	"github.com/gpud/gpud/internal/metrics"
	"github.com/gpud/gpud/internal/sharing"
	"github.com/prometheus/client_golang/prometheus"
)

// setupDRA builds the DRA driver: GPU sharing by memory. It needs an API
// server (the slice, the claims) and NVML (UUIDs, memory); without them
// gpud says why and runs without sharing.
func (d *Daemon) setupDRA() error {
	cfg := d.cfg
	if d.kube == nil {
		d.log.Warn("DRA is on but there is no API server: no GPU is shared by memory")
		return nil
	}
	if d.nvml == nil {
		d.log.Warn("DRA is on but NVML is not loaded (no UUIDs, no memory): no GPU is shared by memory")
		return nil
	}
	if d.cfg.Shares == nil {
		d.cfg.Shares = sharing.NewBook()
	}
	drv, err := dra.New(dra.Config{
		NodeName: cfg.NodeName, Client: d.kube,
		PluginDir: cfg.DRAPluginDir, RegistryDir: cfg.DRARegistryDir, CDIDir: cfg.DRACDIDir, StateDir: cfg.StateDir,
		Reserve: cfg.DRAMemoryReserve, Min: cfg.DRAMemoryMin, Step: cfg.DRAMemoryStep, Default: cfg.DRAMemoryDefault,
		NVIDIACDI: (&lending.CDISpecs{Dirs: cfg.CDISpecDirs}).Has, NVIDIAKind: cfg.CDIKind,
		GPUs: d.draGPUs, Book: d.cfg.Shares, Log: d.log,
		Published: func() {
			if d.writer != nil {
				d.writer.Kick() // what is offered, and why not, in the state file
			}
		},
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d.dra = drv
	d.draMetrics(drv)
	d.runners = append(d.runners, func(ctx context.Context) {
		defer drv.Close()
		if err := drv.Run(ctx); err != nil {
			d.log.Error("DRA driver stopped: no GPU is shared by memory", "error", err)
		}
	})
	return nil
}

// Shares is the share book; nil without DRA.
func (d *Daemon) Shares() *sharing.Book { return d.cfg.Shares }

// DRA is the DRA driver; nil without it.
func (d *Daemon) DRA() *dra.Driver { return d.dra }

// shared reports whether --dra-shared-gpus, or the node's
// gpud.io/shared-gpus label, names the GPU.
func (d *Daemon) shared(index int, uuid string) bool {
	list := d.cfg.DRASharedGPUs
	if l := d.dra.NodeShared(); l != nil {
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

// draGPUs is what the DRA driver publishes: the managed GPUs (a MIG GPU
// is left alone, never here) with NVML's facts, offered when shared,
// healthy and with their memory known.
func (d *Daemon) draGPUs() []dra.GPU {
	snap := d.ledger.Snapshot(time.Now())
	info := d.nvml.Info()
	var out []dra.GPU
	for _, g := range snap.GPUs {
		dg := dra.GPU{Index: g.Index, Minor: int(g.Minor), UUID: g.UUID, Product: g.Product, DriverVersion: info.DriverVersion,
			HostDevice: d.hostDevice(g.Device)}
		if g.NVMLIndex != nil {
			dg.NVMLIndex = *g.NVMLIndex
		}
		if g.Memory != nil {
			dg.MemoryTotal = g.Memory.Total
		}
		switch {
		case !d.shared(g.Index, g.UUID):
			dg.Why = "not in --dra-shared-gpus or the node's " + dra.SharedLabel + " label"
		case g.UUID == "":
			dg.Why = "no UUID from NVML"
		case g.Health.Unhealthy:
			dg.Why = "unhealthy: " + g.Health.Reason
		case g.Memory == nil:
			dg.Why = "memory not known yet"
		default:
			dg.Offered = true
		}
		out = append(out, dg)
	}
	return out
}

// hostDevice is a device node's path as the host sees it (gpud in a pod
// sees the host's /dev under --dev-dir).
func (d *Daemon) hostDevice(p string) string {
	rel, err := filepath.Rel(d.cfg.DevDir, p)
	if d.cfg.HostDevDir == "" || err != nil || strings.HasPrefix(rel, "..") {
		return p
	}
	return filepath.Join(d.cfg.HostDevDir, rel)
}

// draMetrics registers the DRA driver's counters, read at each scrape.
func (d *Daemon) draMetrics(drv *dra.Driver) {
	reg := d.metrics.Registry()
	stat := func(f func(dra.Stats) float64) func() float64 { return func() float64 { return f(drv.Stats()) } }
	name := func(n string) string { return metrics.Namespace + "_dra_" + n }
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name("claims_prepared"), Help: "Claims gpud's DRA driver has prepared on this node (its checkpoint)."},
			stat(func(s dra.Stats) float64 { return float64(s.Claims) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name("devices_offered"), Help: "GPUs in this node's ResourceSlice of driver gpud.io (shared, healthy, memory known)."},
			stat(func(s dra.Stats) float64 { return float64(s.Offered) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name("slice_publishes_total"), Help: "ResourceSlice contents handed to the API server (each change of the shared GPUs)."},
			stat(func(s dra.Stats) float64 { return float64(s.Published) })),
	)
	for result, f := range map[string]func(dra.Stats) uint64{
		"prepared": func(s dra.Stats) uint64 { return s.Prepared },
		"already":  func(s dra.Stats) uint64 { return s.AlreadyPrepared },
		"failed":   func(s dra.Stats) uint64 { return s.PrepareFailed },
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: name("prepares_total"), ConstLabels: prometheus.Labels{"result": result},
			Help: "Claim preparations asked by kubelet, by result: prepared (new), already (prepared before: kubelet or gpud restarted), failed.",
		}, stat(func(s dra.Stats) float64 { return float64(f(s)) })))
	}
	for by, f := range map[string]func(dra.Stats) uint64{
		"kubelet":   func(s dra.Stats) uint64 { return s.Unprepared - s.Collected },
		"collected": func(s dra.Stats) uint64 { return s.Collected },
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: name("unprepares_total"), ConstLabels: prometheus.Labels{"by": by},
			Help: "Claims unprepared, by who asked: kubelet, or gpud's collection of claims deleted while it was down.",
		}, stat(func(s dra.Stats) float64 { return float64(f(s)) })))
	}
}

// decorateDRA adds the DRA driver's section to the state document.
func (d *Daemon) decorateDRA(f *v1.StateFile) {
	st := d.dra.Stats()
	s := &v1.StateDRA{Driver: dra.DriverName, Offered: st.Offered, Claims: st.Claims}
	uuids := map[int]string{}
	for _, g := range f.GPUs {
		uuids[g.Index] = g.UUID
	}
	why := d.dra.NotOffered()
	for _, idx := range slices.Sorted(maps.Keys(why)) {
		s.NotOffered = append(s.NotOffered, v1.StateNotOffered{Index: idx, UUID: uuids[idx], Reason: why[idx]})
	}
	f.DRA = s
}
