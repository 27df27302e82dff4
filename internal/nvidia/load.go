package nvidia

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/gpud/gpud/internal/safefs"
	"golang.org/x/sys/unix"
)

// Load says which libnvidia-ml gpud loads.
type Load struct {
	// Library is the library's path under DriverRoot; "" searches
	// LibraryDirs under a DriverRoot other than /, and lets the dynamic
	// loader search for libnvidia-ml.so.1 on / (a host install).
	Library string
	// DriverRoot is where the driver's files are: "/" on a host install, the
	// host's driver root mounted into gpud's pod (the GPU Operator's
	// /run/nvidia/driver, or the host's /) otherwise.
	DriverRoot string
}

// LibraryDirs are where distributions and NVIDIA's installers put
// libnvidia-ml.so.1, searched in this order under a driver root.
var LibraryDirs = []string{
	"/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
	"/lib64", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib",
}

// FindLibrary opens libnvidia-ml.so.1 in the first of LibraryDirs under
// root that has it, with OpenLibrary's checks; an error names every
// directory tried.
func FindLibrary(root string) (*os.File, error) { return findLibrary(root, "libnvidia-ml.so.1") }

func findLibrary(root, name string) (*os.File, error) {
	for _, dir := range LibraryDirs {
		f, err := OpenLibrary(root, filepath.Join(dir, name))
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOENT) {
			return nil, err // there, but refused: never fall through to another copy
		}
	}
	return nil, fmt.Errorf("%w: no %s under %s in %v", ErrLibrary, name, root, LibraryDirs)
}

// ErrLibrary marks a library file gpud refuses to load.
var ErrLibrary = errors.New("nvidia: nvml library")

// maxLibLinks bounds the symlinks followed to the library file
// (libnvidia-ml.so.1 → libnvidia-ml.so.570.86.15 is one).
const maxLibLinks = 8

// OpenLibrary opens the library file at path under root, held open so that
// what is loaded (through /proc/self/fd/N) is what was checked: every
// directory on the way and the file itself root's and writable by no one
// else (gpud runs as root: a library another user could change would run
// that user's code as root). Symlinks are followed only when root's, and
// absolute ones resolve under root.
func OpenLibrary(root, path string) (*os.File, error) {
	if root == "" {
		root = "/"
	}
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%w: %q is not an absolute path", ErrLibrary, path)
	}
	for links := 0; ; links++ {
		if links > maxLibLinks {
			return nil, fmt.Errorf("%w: %s: too many symlinks", ErrLibrary, path)
		}
		dirPath, name := filepath.Split(filepath.Clean(path))
		dir, err := safefs.OpenExisting(root, dirPath)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrLibrary, err)
		}
		fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ELOOP) {
			target, lerr := readLink(int(dir.Fd()), name)
			dir.Close()
			if lerr != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrLibrary, path, lerr)
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(dirPath, target)
			}
			path = target
			continue
		}
		dir.Close()
		if err != nil {
			return nil, fmt.Errorf("%w: opening %s under %s: %w", ErrLibrary, path, root, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("%w: %s: %w", ErrLibrary, path, err)
		}
		switch {
		case st.Mode&unix.S_IFMT != unix.S_IFREG:
			err = fmt.Errorf("%w: %s is not a regular file", ErrLibrary, path)
		case st.Uid != 0 && int(st.Uid) != os.Geteuid():
			err = fmt.Errorf("%w: %w: %s is owned by uid %d (want root)", ErrLibrary, safefs.ErrUnsafe, path, st.Uid)
		case st.Mode&0o022 != 0:
			err = fmt.Errorf("%w: %w: %s is writable by other users (mode %04o)", ErrLibrary, safefs.ErrUnsafe, path, st.Mode&0o7777)
		}
		if err != nil {
			unix.Close(fd)
			return nil, err
		}
		return os.NewFile(uintptr(fd), filepath.Join(root, path)), nil
	}
}

// readLink reads the symlink name in dirfd, refusing one not root's.
func readLink(dirfd int, name string) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return "", err
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return "", fmt.Errorf("%w: symlink %s is owned by uid %d (want root)", safefs.ErrUnsafe, name, st.Uid)
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// LoadCUDACheckpoint loads libcuda's checkpoint API as NVML is loaded: the
// file load names under its driver root (or found there), checked and
// held open, and loaded through its descriptor; on / with no path, the
// dynamic loader's libcuda.so.1.
func LoadCUDACheckpoint(load Load) (*CUDACheckpoint, error) {
	root := load.DriverRoot
	if load.Library == "" && (root == "" || root == "/") {
		return OpenCUDACheckpoint("")
	}
	var f *os.File
	var err error
	if load.Library == "" {
		f, err = findLibrary(root, "libcuda.so.1")
	} else {
		f, err = OpenLibrary(root, load.Library)
	}
	if err != nil {
		return nil, err
	}
	holdLoaded(f)
	c, err := OpenCUDACheckpoint(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name(), err)
	}
	return c, nil
}

// loadedFiles are the library files loaded through /proc/self/fd/N and
// never unloaded (libcuda: dlopen'd once, its handle kept; a failed open
// leaves it loaded too), held open for the process's life. The dynamic
// loader knows a library by the name it was loaded under, so with N
// closed and reused, a later dlopen("/proc/self/fd/N") of another file
// would get this library again (the daemon tests' second CUDA double got
// the first one, whose directory was gone: "no checkpoint API").
var loadedFiles struct {
	sync.Mutex
	files []*os.File
}

func holdLoaded(f *os.File) {
	loadedFiles.Lock()
	defer loadedFiles.Unlock()
	loadedFiles.files = append(loadedFiles.files, f)
}
