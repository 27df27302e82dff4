package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/config"
	"github.com/gpud/gpud/internal/testutil"
)

// A settings file another user could have changed is refused at start
// (the error names the file and why) and at SIGHUP (the running settings
// stay, Reload is not called, an error is logged and counted).
func TestRunRefusesAnUnsafeConfigFile(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "gpud.yaml")
	if err := os.WriteFile(cfg, []byte("version: v1\nidle-after: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", cfg, "--dev-dir", "/tmp/dev"}
	_, s, err := loadRun(args, config.Sources{})
	if err != nil {
		t.Fatalf("root's file: %v", err)
	}
	const nobody = 65534
	unsafe := []struct {
		what, why string
		make      func()
	}{
		{"owned by uid 65534", "owned by uid 65534", func() { os.Lchown(cfg, nobody, nobody) }},
		{"mode 0666", "writable by other users", func() { os.Lchown(cfg, 0, 0); os.Chmod(cfg, 0o666) }},
		{"its directory writable by 65534", "owned by uid 65534", func() { os.Chmod(cfg, 0o644); os.Lchown(dir, nobody, nobody) }},
	}
	for _, u := range unsafe {
		u.make()
		if _, _, err := loadRun(args, config.Sources{}); err == nil || !strings.Contains(err.Error(), u.why) || !strings.Contains(err.Error(), "--config") {
			t.Errorf("start with a file %s: %v, want refused naming --config and %q", u.what, err, u.why)
		}
	}
	os.Lchown(dir, 0, 0)

	var logs bytes.Buffer
	level := new(slog.LevelVar)
	fd := &fakeDaemon{}
	r := &reloader{args: args, d: fd, log: slog.New(slog.NewJSONHandler(&logs, nil)), level: level, running: compared(s)}
	before := configRefused.Load()
	for i, u := range unsafe {
		if err := os.WriteFile(cfg, []byte("version: v1\nidle-after: 2m\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		u.make()
		logs.Reset()
		r.reload(config.Sources{})
		if len(fd.got) != 0 {
			t.Fatalf("SIGHUP with a file %s: reloaded %+v", u.what, fd.got)
		}
		if !strings.Contains(logs.String(), "the running ones stay") || !strings.Contains(logs.String(), u.why) || !strings.Contains(logs.String(), cfg) {
			t.Errorf("SIGHUP with a file %s: log %s", u.what, logs.String())
		}
		if got := configRefused.Load() - before; got != uint64(i+1) {
			t.Errorf("SIGHUP with a file %s: %d refusals counted, want %d", u.what, got, i+1)
		}
	}
	// Made safe again: the next SIGHUP applies it.
	os.Lchown(dir, 0, 0)
	r.reload(config.Sources{})
	if len(fd.got) != 1 || fd.got[0].IdleAfter != 2*time.Minute {
		t.Errorf("a safe file again: reloaded %+v", fd.got)
	}
}
