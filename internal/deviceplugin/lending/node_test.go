package lending

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
)

// A node's lending: the shared-by-memory rule (shares in the book, or
// offered by the DRA driver) and the device plugin it is served by.
func TestNewNodeNeverLendsSharedGPUsWhole(t *testing.T) {
	f := newFixture(t)
	why := func(l *Lender, gpu int) string {
		var st v1.StateFile
		for _, g := range f.ledger.Snapshot(time.Now()).GPUs {
			st.GPUs = append(st.GPUs, v1.StateGPU{Index: g.Index})
		}
		l.Decorate(&st)
		return st.GPUs[gpu].NotLendable
	}
	cfg := Config{Resource: "gpud.io/idle-gpu", OwnerResource: "nvidia.com/gpu", DevDir: t.TempDir(), LendFree: true, GPUs: f.l.cfg.GPUs}
	log := slog.New(slog.DiscardHandler)

	plain, plugin := NewNode(Node{Config: cfg, KubeletDir: "/kubelet/device-plugins"}, f.ledger, f.reg, f.gate, log)
	if plain.Shared != nil || why(plain, 1) != "" {
		t.Fatalf("without sharing: Shared set %v, GPU 1 %q", plain.Shared != nil, why(plain, 1))
	}
	if plugin.ResourceName != "gpud.io/idle-gpu" || plugin.Endpoint != "gpud.sock" || plugin.Backend != plain || plugin.KubeletDir != "/kubelet/device-plugins" {
		t.Fatalf("plugin %+v", plugin)
	}

	shares, offered := map[int]bool{}, map[int]bool{}
	l, _ := NewNode(Node{Config: cfg, HasShares: func(g int) bool { return shares[g] }, Offered: func(g int) bool { return offered[g] }},
		f.ledger, f.reg, f.gate, log)
	if why(l, 1) != "" {
		t.Fatalf("GPU 1 unshared: %q", why(l, 1))
	}
	shares[1] = true
	if !strings.Contains(why(l, 1), "shared by memory") {
		t.Fatalf("GPU 1 with shares: %q", why(l, 1))
	}
	shares[1], offered[1] = false, true
	if !strings.Contains(why(l, 1), "shared by memory") {
		t.Fatalf("GPU 1 offered for sharing: %q", why(l, 1))
	}
	// A node with a book but no DRA driver: shares alone decide.
	l, _ = NewNode(Node{Config: cfg, HasShares: func(g int) bool { return shares[g] }}, f.ledger, f.reg, f.gate, log)
	if why(l, 1) != "" {
		t.Fatalf("GPU 1 without shares, no driver: %q", why(l, 1))
	}
}

func TestRunPluginLogsAStoppedPlugin(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	// A kubelet directory that cannot be made (under a file): the plugin
	// stops at once.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, p := NewNode(Node{Config: Config{Resource: "gpud.io/idle-gpu"}, KubeletDir: filepath.Join(file, "device-plugins")}, nil, nil, nil, log)
	RunPlugin(p, log)(t.Context())
	if !strings.Contains(logs.String(), "device plugin stopped: no GPU is lent") {
		t.Fatalf("logs %q: want the stopped plugin said", logs.String())
	}
}

// No lending on the node: a nil Lender's hooks and sections do nothing.
func TestNilLender(t *testing.T) {
	var l *Lender
	l.LedgerChanged()
	f := v1.StateFile{GPUs: []v1.StateGPU{{Index: 0}}}
	l.Decorate(&f)
	if f.GPUs[0].Lendable != nil || l.Synced() != nil {
		t.Fatalf("a nil lender decorated %+v / has a synced channel", f.GPUs[0])
	}
}
