package daemon_test

import (
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

// dockerGate is a unix-socket proxy in front of the Docker engine that the
// test can cut and restore: to gpud it is dockerd going away and coming
// back (containers keep running, as with live-restore).
type dockerGate struct {
	path  string
	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn // live ones, cut with the listener (keep-alives)
}

func newDockerGate(t *testing.T) *dockerGate {
	g := &dockerGate{path: filepath.Join(t.TempDir(), "docker.sock")}
	g.up(t)
	t.Cleanup(g.down)
	return g
}

func (g *dockerGate) up(t *testing.T) {
	ln, err := net.Listen("unix", g.path)
	if err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.ln = ln
	g.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("unix", "/var/run/docker.sock")
				if err != nil {
					return
				}
				defer up.Close()
				g.mu.Lock()
				g.conns = append(g.conns, c, up)
				g.mu.Unlock()
				go io.Copy(up, c)
				io.Copy(c, up)
			}()
		}
	}()
}

func (g *dockerGate) down() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln != nil {
		g.ln.Close()
		g.ln = nil
	}
	for _, c := range g.conns {
		c.Close()
	}
	g.conns = nil
}

// dockerEvents counts the engine's events of action for a container since t0.
func dockerEvents(t *testing.T, id, action string, since time.Time) int {
	out, err := exec.Command("docker", "events", "--since", since.Format(time.RFC3339Nano), "--until", time.Now().Format(time.RFC3339Nano),
		"--filter", "container="+id, "--filter", "event="+action, "--format", "{{.Action}}").Output()
	if err != nil {
		t.Fatalf("docker events: %v", err)
	}
	return strings.Count(string(out), action)
}

// Docker unavailable during a reclaim: the low holder dies at once (a kill
// needs no engine), the container's stop is retried with backoff while the
// engine is away, done once it is back, and done once only.
func TestReclaimRetriedWhileDockerIsDown(t *testing.T) {
	e := enforcingEnv(t, preempt.ReclaimStop)
	gate := newDockerGate(t)
	e.cfg.DockerHost = "unix://" + gate.path
	e.start()
	low := e.container("dep-low", "gpud.io/priority=low")
	lowPID := low.hold(0)
	high := e.container("dep-high", "gpud.io/priority=high")

	t0 := time.Now()
	gate.down()
	if got := high.tryOpen(0); got != "opened" {
		t.Fatalf("high open: %q", got)
	}
	testutil.Eventually(t, 10*time.Second, "the low holder is dead without the engine", func() bool { return !testutil.Alive(lowPID) })
	testutil.Eventually(t, 10*time.Second, "the reclaim is failing and retried", func() bool {
		return strings.Count(e.logs.String(), "reclaim failed; retrying") >= 2
	})
	if !low.running() {
		t.Fatal("the low container stopped while the engine was away: the gate proxy leaked")
	}
	gate.up(t)
	testutil.Eventually(t, 10*time.Second, "the low container is stopped once the engine is back", func() bool { return !low.running() })
	time.Sleep(2 * time.Second) // a second stop would come now if it came
	if n := dockerEvents(t, low.id, "stop", t0); n != 1 {
		t.Errorf("the low container was stopped %d times, want once", n)
	}
	if n := len(records(e, preempt.ActionReclaim)); n != 1 {
		t.Errorf("%d reclaim records, want 1", n)
	}
	if !high.running() {
		t.Fatal("the high container was stopped")
	}
}
