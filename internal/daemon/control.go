package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gpud/gpud/internal/httpserve"
	"github.com/gpud/gpud/internal/occupancy"
)

// The control socket is a small HTTP API on a unix socket (root only):
//
//	GET  /v1/state             the state document, as in the state file
//	POST /v1/monitoring?on=B   the switch of patent claim 2
//	GET  /v1/explain?pid=N     which rule applies to process N now (status.Explanation)
type controlServer struct {
	srv *httpserve.Server
}

func (d *Daemon) serveControl(path string) (*controlServer, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	_ = os.Remove(path) // a stale socket from a previous run
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/state", func(w http.ResponseWriter, r *http.Request) {
		f := occupancy.Render(d.ledger.Snapshot(time.Now()), d.cfg.NodeName, d.monitoring.Load())
		occupancy.MarkEnforced(&f, d.enforced)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(&f)
	})
	mux.HandleFunc("POST /v1/monitoring", func(w http.ResponseWriter, r *http.Request) {
		var on bool
		switch r.URL.Query().Get("on") {
		case "true":
			on = true
		case "false":
		default:
			http.Error(w, "on must be true or false", http.StatusBadRequest)
			return
		}
		if err := d.SetMonitoring(on); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "monitoring %v\n", on)
	})
	mux.HandleFunc("GET /v1/explain", func(w http.ResponseWriter, r *http.Request) {
		pid, err := strconv.Atoi(r.URL.Query().Get("pid"))
		if err != nil || pid <= 0 {
			http.Error(w, "pid must be a positive number", http.StatusBadRequest)
			return
		}
		e, err := d.Explain(pid)
		if errors.Is(err, ErrNoSuchProcess) {
			http.Error(w, fmt.Sprintf("no process %d (on this node, in gpud's PID namespace)", pid), http.StatusNotFound)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(e)
	})
	return &controlServer{srv: httpserve.Serve(ln, mux, d.cfg.HTTPLimits, "control socket", d.log)}, nil
}

func (c *controlServer) Close() error { return c.srv.Close() }

// ControlClient talks to a running gpud over its control socket.
func ControlClient(socket string) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}
}
