package deviceplugin

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeRegistration is kubelet's Registration service: it accepts every
// plugin.
type fakeRegistration struct {
	pluginapi.UnimplementedRegistrationServer
}

func (fakeRegistration) Register(context.Context, *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	return &pluginapi.Empty{}, nil
}

func TestRegistrationsCounted(t *testing.T) {
	var none *Plugin // no device plugin on the node
	if none.IsRegistered() || none.Registrations() != 0 {
		t.Fatal("a nil plugin is registered")
	}
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, kubeletSocket))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, fakeRegistration{})
	go srv.Serve(ln)
	defer srv.Stop()

	p := &Plugin{ResourceName: "gpud.io/test", KubeletDir: dir, Endpoint: "test.sock",
		Backend: &Static{Nodes: map[string]string{"gpu-0": "/dev/nvidia0"}}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if p.Registrations() != 0 {
		t.Fatal("registrations before Run")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); !p.IsRegistered() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if !p.IsRegistered() || p.Registrations() != 1 {
		t.Fatalf("registered %v, registrations %d: want one", p.IsRegistered(), p.Registrations())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
