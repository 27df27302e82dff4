package dra

import (
	"github.com/gpud/gpud/internal/sharing"
	"github.com/prometheus/client_golang/prometheus"
)

// Node is the DRA driver as gpud run sets it up on a node: the driver's
// Config (its GPUs come from Source, its Book is made when nil) and where
// its metrics go.
type Node struct {
	Config
	Source  *GPUSource // the ledger's GPUs with NVML's facts; DriverVersion nil without NVML
	Metrics prometheus.Registerer
}

// ForNode builds the DRA driver (GPU sharing by memory), or says why none
// runs: it needs an API server (the slice, the claims: Client) and NVML
// (UUIDs, memory: Source.DriverVersion); without either it warns and
// returns nil, and gpud runs without sharing.
func ForNode(n Node) (*Driver, error) {
	if n.Client == nil {
		n.Log.Warn("DRA is on but there is no API server: no GPU is shared by memory")
		return nil, nil
	}
	if n.Source.DriverVersion == nil {
		n.Log.Warn("DRA is on but NVML is not loaded (no UUIDs, no memory): no GPU is shared by memory")
		return nil, nil
	}
	if n.Book == nil {
		n.Book = sharing.NewBook()
	}
	n.GPUs = n.Source.GPUs
	drv, err := New(n.Config)
	if err != nil {
		return nil, err
	}
	n.Source.Driver = drv
	if n.Metrics != nil {
		drv.RegisterMetrics(n.Metrics)
	}
	return drv, nil
}

// Book is the share book the driver fills.
func (d *Driver) Book() *sharing.Book { return d.cfg.Book }
