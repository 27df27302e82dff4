package bpf

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrModuleUnloaded: the module a driver kprobe was attached in was
// unloaded since (Hooks' missing says which; the kprobe is attached again
// when the module is back).
var ErrModuleUnloaded = errors.New("its module was unloaded")

// Where the kernel lists its symbols and its modules; variables for tests.
var (
	kallsymsPath  = "/proc/kallsyms"
	sysModulePath = "/sys/module"
)

// module is one load of a kernel module: sysfs makes its directory anew
// on each load, with a new inode number.
type module struct {
	name string
	dev  uint64
	ino  uint64
}

// moduleNow is the module name as loaded now; an error when it is not
// loaded.
func moduleNow(root, name string) (module, error) {
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, name), &st); err != nil {
		return module{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return module{}, errors.New(name + ": not a module directory")
	}
	// A module built into the kernel has a directory too (for its
	// parameters) but no initstate: it is never unloaded.
	if _, err := os.Lstat(filepath.Join(root, name, "initstate")); err != nil {
		return module{}, errors.New(name + ": built in")
	}
	return module{name: name, dev: st.Dev, ino: st.Ino}, nil
}

// stillLoaded says whether mod is still the module's current load.
func (mod module) stillLoaded() bool {
	now, err := moduleNow(sysModulePath, mod.name)
	return err == nil && now == mod
}

// symbolModules finds, for each "role:symbol" key, the module its symbol
// is in ("ffffffffc0a01230 t nvidia_close\t[nvidia]"); a symbol of the
// kernel proper, or not found, has no entry. The first line naming a
// symbol is taken, as the kernel's lookup by name does.
func symbolModules(kallsyms string, keys []string) map[string]string {
	want := map[string][]string{} // symbol → keys
	for _, k := range keys {
		_, sym, _ := strings.Cut(k, ":")
		want[sym] = append(want[sym], k)
	}
	out := map[string]string{}
	f, err := os.Open(kallsyms)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() && len(want) > 0 {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 {
			continue
		}
		ks, ok := want[fields[2]]
		if !ok {
			continue
		}
		delete(want, fields[2])
		if len(fields) < 4 || !strings.HasPrefix(fields[3], "[") || !strings.HasSuffix(fields[3], "]") {
			continue // the kernel proper
		}
		for _, k := range ks {
			out[k] = strings.Trim(fields[3], "[]")
		}
	}
	return out
}
