package bpf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"
)

func TestSymbolModules(t *testing.T) {
	ks := filepath.Join(t.TempDir(), "kallsyms")
	os.WriteFile(ks, []byte(strings.Join([]string{
		"ffffffff81000000 T _stext",
		"ffffffff81234560 T receive_fd",
		"ffffffffc0a01230 t nvidia_close\t[nvidia]",
		"ffffffffc0b01230 t nvidia_close\t[other]", // the kernel takes the first
		"ffffffffc0c00000 t fuse_dev_release\t[fuse]",
		"short line",
		"",
	}, "\n")), 0o644)
	got := symbolModules(ks, []string{"release:nvidia_close", "receive:receive_fd", "release:fuse_dev_release", "release:absent"})
	want := map[string]string{"release:nvidia_close": "nvidia", "release:fuse_dev_release": "fuse"}
	if len(got) != len(want) {
		t.Fatalf("symbolModules = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: module %q, want %q", k, got[k], v)
		}
	}
	if got := symbolModules(filepath.Join(t.TempDir(), "none"), []string{"release:x"}); len(got) != 0 {
		t.Errorf("no kallsyms: %v, want nothing", got)
	}
}

// A module is one load: its sysfs directory made anew is another module;
// a built-in one (no initstate), a symlink or a file is none.
func TestModuleNow(t *testing.T) {
	root := t.TempDir()
	load := func(name string) {
		os.MkdirAll(filepath.Join(root, name), 0o755)
		os.WriteFile(filepath.Join(root, name, "initstate"), []byte("live\n"), 0o644)
	}
	load("nvidia")
	first, err := moduleNow(root, "nvidia")
	if err != nil {
		t.Fatal(err)
	}
	// Moved away, not removed: the reload's directory cannot reuse a live
	// inode (sysfs never reuses one soon; the test's file system might).
	os.Rename(filepath.Join(root, "nvidia"), filepath.Join(root, "old"))
	if _, err := moduleNow(root, "nvidia"); err == nil {
		t.Fatal("an unloaded module is loaded")
	}
	load("nvidia")
	second, err := moduleNow(root, "nvidia")
	if err != nil {
		t.Fatal(err)
	}
	if first == second {
		t.Fatalf("a reload is the same load: %+v", first)
	}
	os.MkdirAll(filepath.Join(root, "builtin"), 0o755)
	os.Symlink(filepath.Join(root, "nvidia"), filepath.Join(root, "link"))
	os.WriteFile(filepath.Join(root, "file"), nil, 0o644)
	for _, name := range []string{"builtin", "link", "file"} {
		if m, err := moduleNow(root, name); err == nil {
			t.Errorf("%s: %+v, want no module", name, m)
		}
	}
}

// A kprobe whose module went away is dropped, Hooks says why, and the
// module's return is a change.
func TestDropUnloaded(t *testing.T) {
	root := t.TempDir()
	old := sysModulePath
	sysModulePath = root
	t.Cleanup(func() { sysModulePath = old })
	os.MkdirAll(filepath.Join(root, "nvidia"), 0o755)
	os.WriteFile(filepath.Join(root, "nvidia", "initstate"), []byte("live\n"), 0o644)
	mod, err := moduleNow(root, "nvidia")
	if err != nil {
		t.Fatal(err)
	}
	m := &Monitor{hooks: HooksDriver, symbols: DefaultDriverSymbols(),
		probes:   map[string]link.Link{"release:nvidia_close": nil},
		probeMod: map[string]module{"release:nvidia_close": mod}, probeGone: map[string]string{}, probeErr: map[string]error{}}
	if m.DriverModulesChanged() {
		t.Fatal("changed while loaded")
	}
	if m.dropUnloadedLocked() {
		t.Fatal("dropped while loaded")
	}
	os.RemoveAll(filepath.Join(root, "nvidia"))
	if !m.DriverModulesChanged() {
		t.Fatal("unloaded, not changed")
	}
	if !m.dropUnloadedLocked() {
		t.Fatal("unloaded, not dropped")
	}
	if _, ok := m.probes["release:nvidia_close"]; ok || len(m.probeMod) != 0 {
		t.Fatalf("still hooked: %v %v", m.probes, m.probeMod)
	}
	if err := m.probeErr["release:nvidia_close"]; !errors.Is(err, ErrModuleUnloaded) {
		t.Fatalf("probeErr = %v, want ErrModuleUnloaded", err)
	}
	if m.DriverModulesChanged() {
		t.Fatal("changed while the module is still away")
	}
	// Back (a new load): a change, for AttachDriver to hook it again.
	os.MkdirAll(filepath.Join(root, "nvidia"), 0o755)
	os.WriteFile(filepath.Join(root, "nvidia", "initstate"), []byte("live\n"), 0o644)
	if !m.DriverModulesChanged() {
		t.Fatal("the module is back, not changed")
	}
}
