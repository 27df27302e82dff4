// Package control serves gpud's control API on a unix socket (root only):
// the state document, the monitoring switch and explain; api/v1.Client is
// its client and lists its calls.
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/gate"
)

// Daemon is what the API reaches of the running gpud.
type Daemon interface {
	State() v1.StateFile
	SetMonitoring(on bool) error
	// Explain fails with gate.ErrNoSuchProcess for a PID with no process.
	Explain(pid int) (*v1.Explanation, error)
}

// Server is the control socket's server.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Serve serves d's control API at path until Close; a stale socket there
// is replaced.
func Serve(path string, d Daemon, log *slog.Logger) (*Server, error) {
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
		f := d.State()
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
		if errors.Is(err, gate.ErrNoSuchProcess) {
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
	cs := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go func() {
		if err := cs.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("control socket", "error", err)
		}
	}()
	return cs, nil
}

// Close stops serving.
func (c *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.srv.Shutdown(ctx)
}
