package lending

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"
)

// CDISpecs tells whether the node's CDI specs define a device. A
// CDI-enabled runtime refuses to create a container that names a device no
// spec defines, so a lent GPU is named by CDI only where one does: a
// default --cdi-kind never breaks a borrower on a node without NVIDIA's
// specs (a containerd 2 node with the toolkit in legacy mode, say).
type CDISpecs struct {
	Dirs []string // the runtime's spec directories (containerd's and CRI-O's default: /etc/cdi, /var/run/cdi)

	mu     sync.Mutex
	readAt time.Time
	known  map[string]bool // "kind=name"
}

// Bounds on what is read: spec directories are root's, but a full one must
// not cost gpud a scan without end.
const (
	cdiMaxFiles    = 256
	cdiMaxFileSize = 1 << 20
	cdiReread      = 5 * time.Second
)

// Has reports whether a spec of kind defines a device name; the
// directories are read again at most every few seconds (NVIDIA's toolkit
// writes its spec when the driver is ready).
func (c *CDISpecs) Has(kind, name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known == nil || time.Since(c.readAt) >= cdiReread {
		c.known, c.readAt = readCDISpecs(c.Dirs), time.Now()
	}
	return c.known[kind+"="+name]
}

// cdiSpec is the part of a CDI spec that names devices.
type cdiSpec struct {
	Kind    string `yaml:"kind"`
	Devices []struct {
		Name string `yaml:"name"`
	} `yaml:"devices"`
}

// readCDISpecs lists kind=name of every device of the specs in dirs
// (*.yaml, *.yml, *.json: JSON is YAML). A file that is not a regular file
// (a symlink is not followed), too big, or not a spec is skipped.
func readCDISpecs(dirs []string) map[string]bool {
	known := map[string]bool{}
	files := 0
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			ext := filepath.Ext(e.Name())
			if ext != ".yaml" && ext != ".yml" && ext != ".json" || !e.Type().IsRegular() {
				continue
			}
			if files++; files > cdiMaxFiles {
				return known
			}
			b, ok := readSmall(filepath.Join(dir, e.Name()))
			if !ok {
				continue
			}
			var s cdiSpec
			if yaml.Unmarshal(b, &s) != nil || !strings.Contains(s.Kind, "/") {
				continue
			}
			for _, d := range s.Devices {
				known[s.Kind+"="+d.Name] = true
			}
		}
	}
	return known
}

// readSmall reads a regular file of at most cdiMaxFileSize bytes, never
// through a symlink.
func readSmall(path string) ([]byte, bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, false
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Size() > cdiMaxFileSize {
		return nil, false
	}
	b := make([]byte, st.Size()+1)
	n, _ := f.Read(b)
	if n > int(st.Size()) {
		return nil, false // grew while read
	}
	return b[:n], true
}
