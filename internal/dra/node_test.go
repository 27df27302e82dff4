package dra

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"
)

// Without an API server or without NVML no driver runs, and gpud says why.
func TestForNodeSaysWhyNoDriver(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	withNVML := &GPUSource{Ledger: fakeLedger{}, DriverVersion: func() string { return "580.1" }}
	d, err := ForNode(Node{Source: withNVML, Config: Config{Log: log}})
	if d != nil || err != nil || !strings.Contains(logs.String(), "no API server") {
		t.Fatalf("no API server: driver %v, %v, logs %q", d, err, logs.String())
	}
	logs.Reset()
	d, err = ForNode(Node{Source: &GPUSource{Ledger: fakeLedger{}}, Config: Config{Client: fake.NewClientset(), Log: log}})
	if d != nil || err != nil || !strings.Contains(logs.String(), "NVML is not loaded") {
		t.Fatalf("no NVML: driver %v, %v, logs %q", d, err, logs.String())
	}
}

func TestForNodeBuildsTheDriver(t *testing.T) {
	state, cdi := dirs(t)
	src := &GPUSource{Ledger: fakeLedger{{GPU: occupancy.GPU{Index: 0, UUID: "GPU-a"}}}, DriverVersion: func() string { return "580.1" }}
	reg := prometheus.NewRegistry()
	d, err := ForNode(Node{Source: src, Metrics: reg, Config: Config{NodeName: "node1", Client: fake.NewClientset(),
		StateDir: state, CDIDir: cdi, Log: slog.New(slog.DiscardHandler)}})
	if err != nil || d == nil {
		t.Fatalf("driver %v, %v", d, err)
	}
	t.Cleanup(d.Close)
	if d.Book() == nil || src.Driver != d || len(d.cfg.GPUs()) != 1 {
		t.Fatalf("book %v, source's driver set %v, GPUs %v: want a new book, the source wired both ways", d.Book(), src.Driver == d, d.cfg.GPUs())
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) == 0 {
		t.Fatalf("metrics registered: %d, %v", len(mfs), err)
	}
}

// No DRA on the node: a nil Driver offers nothing and adds no section.
func TestNilDriver(t *testing.T) {
	var d *Driver
	f := v1.StateFile{}
	d.Decorate(&f)
	if d.Offers(0) || f.DRA != nil {
		t.Fatalf("a nil driver offers GPU 0 or decorated %+v", f.DRA)
	}
}
