package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/daemon"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

const nobody = 65534 // a local unprivileged user

// gpud refuses to start, with an error naming the setting, when one of its
// directories is one another user can write in: the README's old example
// (a state file directly in /tmp), a sticky world-writable state dir where
// a local user planted a symlink at the journal's path, another user's
// control-socket directory, a group-writable checkpoint root. Before, it
// started, and appended its journal records to the symlink's target.
func TestStartRefusesDirsOthersCanWrite(t *testing.T) {
	for _, tc := range []struct {
		setting string
		set     func(e *env) (check func(t *testing.T))
	}{
		{"state-file", func(e *env) func(*testing.T) {
			e.cfg.StateFile = fmt.Sprintf("/tmp/gpud-test-state-%d.json", os.Getpid())
			return func(t *testing.T) { os.Remove(e.cfg.StateFile) }
		}},
		{"state-dir", func(e *env) func(*testing.T) {
			shared := testutil.MkdirOwned(t, filepath.Join(e.dir, "shared"), 0o777|os.ModeSticky, 0)
			target := filepath.Join(e.dir, "root-only-file")
			if err := os.WriteFile(target, []byte("root's\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(shared, "preemptions.jsonl")
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			os.Lchown(link, nobody, nobody) // planted by the local user
			e.cfg.StateDir = shared
			return func(t *testing.T) {
				if b, _ := os.ReadFile(target); string(b) != "root's\n" {
					t.Errorf("the symlink's target was written: %q", b)
				}
			}
		}},
		{"control-socket", func(e *env) func(*testing.T) {
			e.cfg.ControlSocket = filepath.Join(testutil.MkdirOwned(t, filepath.Join(e.dir, "theirs"), 0o755, nobody), "gpud.sock")
			return nil
		}},
		{"checkpoint-root", func(e *env) func(*testing.T) {
			e.cfg.CheckpointRoot = testutil.MkdirOwned(t, filepath.Join(e.dir, "ckpt"), 0o775, 0)
			return nil
		}},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			e := newEnv(t)
			e.cfg.DockerHost = "none"
			e.cfg.CRIEndpoint = "none"
			check := tc.set(e)
			d, err := daemon.New(e.cfg, slog.New(slog.NewTextHandler(e.logs, nil)))
			if err == nil {
				// Run it briefly, as gpud would, with one preemption record:
				// what it writes is what a local user got it to write.
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- d.Run(ctx) }()
				d.Journal().Append(preempt.Record{ID: "planted-test", Action: preempt.ActionDeny, Result: "EPERM"})
				time.Sleep(200 * time.Millisecond)
				cancel()
				<-done
				t.Errorf("gpud started with --%s in a directory others can write", tc.setting)
			} else if !errors.Is(err, daemon.ErrConfig) || !strings.Contains(err.Error(), "--"+tc.setting) ||
				!strings.Contains(err.Error(), "only root can write") {
				t.Errorf("error = %v; want a config error naming --%s and what to use", err, tc.setting)
			} else {
				t.Logf("refused: %v", err)
			}
			if check != nil {
				check(t)
			}
		})
	}
}

// A state file gpud did not write, saying monitoring is off, is not
// believed: a local user's file (owned by them) or a symlink to a root file
// that says so. gpud starts with monitoring on, the gate refuses a
// low-priority open of a high-held GPU, and the file is replaced by
// gpud's own. Before, the planted switch was believed and the low open
// succeeded.
func TestPlantedStateFileNotBelieved(t *testing.T) {
	off := fmt.Sprintf(`{"version":%d,"node":"x","monitoring":false,"gpus":[],"preemptions":[]}`, v1.StateVersion)
	for _, shape := range []string{"their-file", "symlink"} {
		t.Run(shape, func(t *testing.T) {
			e := sourcelessEnv(t)
			switch shape {
			case "their-file":
				if err := os.WriteFile(e.cfg.StateFile, []byte(off), 0o644); err != nil {
					t.Fatal(err)
				}
				os.Chown(e.cfg.StateFile, nobody, nobody)
			case "symlink":
				old := filepath.Join(t.TempDir(), "old-state.json")
				if err := os.WriteFile(old, []byte(off), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(old, e.cfg.StateFile); err != nil {
					t.Fatal(err)
				}
			}
			e.start()
			if !e.d.Monitoring() {
				t.Fatal("monitoring off: the planted state file was believed")
			}
			hi, lo := highAndLow(t, e.d.Registry(), shape+"-", "planted")
			fd := hi.doInt("open %s", e.gpus[0].Path)
			e.settle("the high holder", holds(hi.pid(), 0, int32(fd)))
			if got := lo.do("lowrace %s 1 %s", e.gpus[0].Path, filepath.Join(e.dir, "lowrace")); got != "0 1" {
				t.Fatalf("low open of a high-held GPU: %q (opened, refused), want refused", got)
			}
			f := testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return f.Monitoring })
			fi, err := os.Lstat(e.cfg.StateFile)
			if err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("state file after start: %v %v", fi, err)
			}
			if f.Node != "test-node" {
				t.Errorf("state file not gpud's: node %q", f.Node)
			}
			if !strings.Contains(e.logs.String(), "state file not written by gpud") {
				t.Error("the ignored file was not logged")
			}
		})
	}
}
