package kube

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNewClientWithoutConfigIsNil(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	c, err := NewClient("")
	if c != nil || err != nil {
		t.Errorf("NewClient with neither a kubeconfig nor a cluster = %v, %v; want nil, nil", c, err)
	}
}

func TestNewClientBadKubeconfig(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("{not: [yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing"), garbage} {
		if c, err := NewClient(path); err == nil || c != nil {
			t.Errorf("NewClient(%s) = %v, %v; want an error", filepath.Base(path), c, err)
		}
	}
}

// A client from a kubeconfig talks to the server it names, as gpud.
func TestNewClientKubeconfig(t *testing.T) {
	var mu sync.Mutex
	var agents, paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		agents = append(agents, r.UserAgent())
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}`))
	}))
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "` + srv.URL + `"}}]
users: [{name: u, user: {token: t0k3n}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(kc)
	if err != nil || c == nil {
		t.Fatalf("NewClient(kubeconfig) = %v, %v", c, err)
	}
	if _, err := c.CoreV1().Pods("ml").List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatalf("listing pods through the client: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(agents) != 1 || agents[0] != "gpud" || paths[0] != "/api/v1/namespaces/ml/pods" {
		t.Errorf("requests %v with user agents %v; want one to /api/v1/namespaces/ml/pods as gpud", paths, agents)
	}
}

// In a pod (KUBERNETES_SERVICE_HOST set) without a kubeconfig, the client
// is the in-cluster one: an error when the service account is not mounted.
func TestNewClientInCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	c, err := NewClient("")
	if _, serr := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); serr == nil {
		if err != nil || c == nil {
			t.Errorf("NewClient in a pod with a service account = %v, %v", c, err)
		}
		return
	}
	if err == nil || c != nil {
		t.Errorf("NewClient in a pod without a service account = %v, %v; want an error", c, err)
	}
}
