// Package control serves gpud's control API on a unix socket (root only):
// the state document, the monitoring switch and explain; api/v1.Client is
// its client and lists its calls.
package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/gate"
	"github.com/gpud/gpud/internal/httpserve"
	"github.com/gpud/gpud/internal/safefs"
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
	srv  *httpserve.Server
	path string
}

// Serve serves d's control API at path until Close; a stale socket there
// is replaced.
func Serve(path string, d Daemon, limits httpserve.Limits, log *slog.Logger) (*Server, error) {
	ln, err := listenPrivate(path)
	if err != nil {
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
	return &Server{srv: httpserve.Serve(ln, mux, limits, "control socket", log), path: path}, nil
}

// Close stops serving and removes the socket.
func (c *Server) Close() error {
	err := c.srv.Close()
	os.Remove(c.path)
	return err
}

// listenPrivate binds the root-only socket at path with no moment at which
// another user could connect: it is bound in a private (0700) directory
// beside path, made 0600, then renamed into place. path's directory must be
// one only root can change (safefs); what is at path is replaced only when
// it is a socket (a stale one from a previous run).
func listenPrivate(path string) (*net.UnixListener, error) {
	dir, err := safefs.OpenDir(filepath.Dir(path), 0o755)
	if err != nil {
		return nil, err
	}
	dir.Close()
	if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("%s exists and is not a socket (%s); gpud does not replace it", path, st.Mode().Type())
	}
	priv, err := os.MkdirTemp(dir.Path, ".gpud-sock")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(priv)
	tmp := filepath.Join(priv, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false) // it is renamed; Close removes path
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(dir.Path, filepath.Base(path))); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
