package testutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// SmallFS mounts a tmpfs of size bytes (e.g. 64 KiB) on a new directory,
// root's and 0755, unmounted when the test ends: a disk the test can fill.
func SmallFS(tb testing.TB, size int) string {
	tb.Helper()
	RequireRoot(tb)
	dir := filepath.Join(tb.TempDir(), "small")
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	opts := "size=" + itoa(size) + ",mode=0755"
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		Skip(tb, "mounting a tmpfs: "+err.Error())
	}
	tb.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// Fill writes a file in dir until the filesystem is full (ENOSPC), down
// to the last byte, and returns its path: removing it frees the space.
func Fill(tb testing.TB, dir string) string {
	tb.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	for _, chunk := range []int{4096, 1} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, unix.ENOSPC) {
					tb.Fatal(err)
				}
				break
			}
		}
	}
	return p
}
