package nri

import (
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/gpud/gpud/internal/config"
)

// gpud's --nri-socket default (written once, in config.Defaults) is where
// containerd and CRI-O listen for NRI plugins.
func TestDefaultSocketIsTheRuntimes(t *testing.T) {
	if got := config.Defaults().NRISocket; got != api.DefaultSocketPath {
		t.Errorf("config.Defaults().NRISocket = %q, the runtimes' NRI socket is %q", got, api.DefaultSocketPath)
	}
}
