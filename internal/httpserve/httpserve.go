// Package httpserve serves gpud's HTTP endpoints (the metrics port, the
// control socket) with bounds: any client of a port may be hostile, and a
// flood of idle connections must cost gpud neither memory nor descriptors
// without limit.
package httpserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
	"golang.org/x/sys/unix"

	"github.com/gpud/gpud/internal/safefs"
)

// Limits bound one server. Zero fields take Defaults' values.
type Limits struct {
	// MaxConns is how many connections are served at once. With every
	// slot taken an idle one is closed for a newcomer; without one, as
	// many again wait (see limitListener), and the rest are refused.
	MaxConns int
	// MaxConnsPerPeer is how many connections one peer (an IPv4 address,
	// an IPv6 /64) holds at once, waiting ones included: any pod reaches a
	// hostNetwork port, and one must not take the slots of the scraper.
	MaxConnsPerPeer int
	// ReadHeaderTimeout bounds a request's headers (slow senders); a
	// connection's first request must have sent them this long after it
	// was accepted, time spent waiting for a slot included.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds a whole request, body included.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response (slow readers).
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request for this
	// long.
	IdleTimeout time.Duration
}

// Defaults suit a Prometheus scraper (one connection per scrape target,
// reconnecting after an idle close costs it nothing) and `gpud` commands.
var Defaults = Limits{
	MaxConns:          64,
	MaxConnsPerPeer:   8, // a scraper or two, kubelet's probes, `curl`s
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       10 * time.Second,
	WriteTimeout:      30 * time.Second,
	IdleTimeout:       30 * time.Second,
}

// WithDefaults fills l's zero fields from Defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxConns <= 0 {
		l.MaxConns = Defaults.MaxConns
	}
	if l.MaxConnsPerPeer <= 0 {
		l.MaxConnsPerPeer = min(Defaults.MaxConnsPerPeer, l.MaxConns)
	}
	for _, f := range []struct{ v, def *time.Duration }{
		{&l.ReadHeaderTimeout, &Defaults.ReadHeaderTimeout}, {&l.ReadTimeout, &Defaults.ReadTimeout},
		{&l.WriteTimeout, &Defaults.WriteTimeout}, {&l.IdleTimeout, &Defaults.IdleTimeout},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return l
}

// Server is a bounded HTTP server on one listener.
type Server struct {
	srv *http.Server
	// Addr is where it listens.
	Addr net.Addr
}

// Serve serves h on ln in the background, within l (zero fields: Defaults),
// until Close. name tells log lines apart ("metrics", "control socket").
func Serve(ln net.Listener, h http.Handler, l Limits, name string, log *slog.Logger) *Server {
	return ServeWeb(ln, h, l, "", name, log)
}

// ServeWeb is Serve with TLS and basic auth as the exporter-toolkit web
// config file webConfig says ("": plain HTTP). The file (and the
// certificates it names) are read again for each new connection, so a
// renewed certificate is used without a restart.
func ServeWeb(ln net.Listener, h http.Handler, l Limits, webConfig, name string, log *slog.Logger) *Server {
	l = l.WithDefaults()
	s := &Server{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: l.ReadHeaderTimeout,
			ReadTimeout:       l.ReadTimeout,
			WriteTimeout:      l.WriteTimeout,
			IdleTimeout:       l.IdleTimeout,
			MaxHeaderBytes:    64 << 10, // gpud's requests are a line and a few headers
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		},
		Addr: ln.Addr(),
	}
	lim := newLimitListener(ln, l, name, log)
	s.srv.ConnState = lim.connState
	go func() {
		defer lim.Close() // web.Serve can fail before it serves
		var err error
		if webConfig == "" {
			err = s.srv.Serve(lim)
		} else {
			err = web.Serve(lim, s.srv, &web.FlagConfig{WebConfigFile: &webConfig}, log.With("server", name))
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "server", name, "error", err)
		}
	}()
	return s
}

// Listen binds a TCP address and serves h on it (see ServeWeb).
func Listen(addr string, h http.Handler, l Limits, webConfig, name string, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen %s: %w", name, addr, err)
	}
	return ServeWeb(ln, h, l, webConfig, name, log), nil
}

// CheckWebConfig checks a web config file before gpud serves with it: its
// directory passes safefs's rule and the file is root's and not writable
// by others (it decides who may read the metrics), and exporter-toolkit
// accepts it, certificates included. "" is plain HTTP: nothing to check.
func CheckWebConfig(path string) error {
	if path == "" {
		return nil
	}
	// A Kubernetes Secret volume holds symlinks (web.yml -> ..data/web.yml,
	// ..data -> ..2026_...): followed when root's, in a directory that
	// passed the rule, as safefs follows them on the way to a directory.
	p := filepath.Clean(path)
	for hops := 0; ; hops++ {
		d, err := safefs.OpenToRead(filepath.Dir(p))
		if err != nil {
			return err
		}
		var st unix.Stat_t
		err = unix.Fstatat(int(d.Fd()), filepath.Base(p), &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK && hops < 8 && st.Uid == 0 {
			target, lerr := os.Readlink(filepath.Join(d.Path, filepath.Base(p)))
			d.Close()
			if lerr != nil {
				return lerr
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			p = filepath.Clean(target)
			continue
		}
		_, err = d.ReadOwned(filepath.Base(p), 1<<20)
		d.Close()
		if err != nil {
			return err
		}
		break
	}
	if err := web.Validate(path); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Close stops serving: in-flight requests get two seconds, idle
// connections close at once.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return errors.Join(fmt.Errorf("httpserve: shutdown: %w", err), s.srv.Close())
	}
	return nil
}

// Run serves h on addr until ctx ends. A port that cannot be bound
// (another gpud still shutting down, a clash) is retried rather than fatal:
// the node agent's enforcement matters more than its scrape endpoint.
func Run(ctx context.Context, addr string, h http.Handler, l Limits, webConfig, name string, log *slog.Logger) {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		srv, err := Listen(addr, h, l, webConfig, name, log)
		if err == nil {
			log.Info("serving "+name, "addr", srv.Addr.String())
			<-ctx.Done()
			srv.Close()
			return
		}
		log.Error(name+" endpoint unavailable, retrying", "addr", addr, "retry_in", wait, "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
