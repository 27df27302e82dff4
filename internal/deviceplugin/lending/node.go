package lending

import (
	"context"
	"log/slog"

	"github.com/gpud/gpud/internal/deviceplugin"
)

// Node is a node's lending as gpud run sets it up: the lender's Config,
// where kubelet and the runtime's CDI specs are, and GPU sharing by memory.
type Node struct {
	Config
	PodResourcesSocket string   // kubelet's PodResources socket
	KubeletDir         string   // kubelet's device-plugins directory (kubelet.sock)
	CDISpecDirs        []string // where the node's CDI specs are
	// HasShares, set on a node that shares GPUs by memory, reports whether
	// a GPU has memory shares (DRA claims); Offered, when set, whether the
	// DRA driver offers it for sharing.
	HasShares, Offered func(gpu int) bool
}

// NewNode builds a node's lender and its device plugin (endpoint gpud.sock
// in KubeletDir); RunPlugin runs the plugin. A GPU shared by memory (with
// shares, or offered for sharing) is never lent whole.
func NewNode(n Node, ledger Ledger, classes Classes, gate Gate, log *slog.Logger) (*Lender, *deviceplugin.Plugin) {
	l := New(n.Config, ledger, classes, gate, Socket(n.PodResourcesSocket))
	l.Log, l.CDI = log, &CDISpecs{Dirs: n.CDISpecDirs}
	if n.HasShares != nil {
		l.Shared = func(gpu int) bool { return n.HasShares(gpu) || (n.Offered != nil && n.Offered(gpu)) }
	}
	p := &deviceplugin.Plugin{ResourceName: n.Resource, KubeletDir: n.KubeletDir, Endpoint: "gpud.sock", Backend: l, Log: log}
	return l, p
}

// RunPlugin runs the device plugin until ctx ends; a plugin that stops
// early is logged: no GPU is lent then.
func RunPlugin(p *deviceplugin.Plugin, log *slog.Logger) func(context.Context) {
	return func(ctx context.Context) {
		if err := p.Run(ctx); err != nil {
			log.Error("device plugin stopped: no GPU is lent", "error", err)
		}
	}
}
