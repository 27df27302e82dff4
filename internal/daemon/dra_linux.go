package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpud/gpud/internal/deviceplugin/lending"
	"github.com/gpud/gpud/internal/dra"
	"github.com/gpud/gpud/internal/sharing"
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
	d.shares = sharing.NewBook()
	drv, err := dra.New(dra.Config{
		NodeName: cfg.NodeName, Client: d.kube,
		PluginDir: cfg.DRAPluginDir, RegistryDir: cfg.DRARegistryDir, CDIDir: cfg.DRACDIDir, StateDir: cfg.StateDir,
		Reserve: cfg.DRAMemoryReserve, Min: cfg.DRAMemoryMin, Step: cfg.DRAMemoryStep, Default: cfg.DRAMemoryDefault,
		NVIDIACDI: (&lending.CDISpecs{Dirs: cfg.CDISpecDirs}).Has, NVIDIAKind: cfg.CDIKind,
		GPUs: d.draGPUs, Book: d.shares, Log: d.log,
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d.dra = drv
	d.shares.OnChange(func() {
		if d.writer != nil {
			d.writer.Kick()
		}
	})
	d.runners = append(d.runners, func(ctx context.Context) {
		defer drv.Close()
		if err := drv.Run(ctx); err != nil {
			d.log.Error("DRA driver stopped: no GPU is shared by memory", "error", err)
		}
	})
	return nil
}

// Shares is the share book; nil without DRA.
func (d *Daemon) Shares() *sharing.Book { return d.shares }

// DRA is the DRA driver; nil without it.
func (d *Daemon) DRA() *dra.Driver { return d.dra }

// shared reports whether --dra-shared-gpus names the GPU.
func (d *Daemon) shared(index int, uuid string) bool {
	list := d.cfg.DRASharedGPUs
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
			dg.Why = "not in --dra-shared-gpus"
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
