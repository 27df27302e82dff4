package sources

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpud/gpud/internal/workload"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`

// TestWhichSources: the API server wins over CRI and needs the node's
// name; without it, CRI; NRI and Docker only unless "none"; pods are
// reclaimable only through the API server.
func TestWhichSources(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	build := func(cfg Config) (*Sources, error) {
		return New(cfg, &workload.Registry{}, &workload.Listings{}, log)
	}
	none := Config{DockerHost: "none", CRIEndpoint: "none", NRISocket: "none"}

	s, err := build(none)
	if err != nil || len(s.Runners) != 0 || s.Kube != nil || s.Pods != nil || s.Runtimes.Containers != nil || s.Runtimes.Pods != nil {
		t.Fatalf("nothing asked: %+v, %v", s, err)
	}
	cfg := none
	cfg.CRIEndpoint, cfg.NRISocket = "/run/x/cri.sock", "/run/x/nri.sock"
	if s, err = build(cfg); err != nil || len(s.Runners) != 2 || s.Kube != nil || s.Runtimes.Pods != nil {
		t.Fatalf("CRI and NRI: %+v, %v", s, err)
	}
	cfg.KubeConfig = kc
	if _, err = build(cfg); !errors.Is(err, ErrNoNode) {
		t.Fatalf("an API server without the node's name: %v", err)
	}
	cfg.NodeName = "n1"
	// The API server's pods and Events, NRI; not CRI.
	if s, err = build(cfg); err != nil || len(s.Runners) != 3 || s.Kube == nil || s.Pods == nil || s.Events == nil || s.Runtimes.Pods == nil {
		t.Fatalf("API server: %+v, %v", s, err)
	}
	cfg.KubeConfig = filepath.Join(t.TempDir(), "missing")
	if _, err = build(cfg); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("a missing kubeconfig: %v", err)
	}
}
