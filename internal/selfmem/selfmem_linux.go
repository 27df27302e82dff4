// Package selfmem trims gpud's own resident memory once it runs.
package selfmem

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// After is how long after start-up Release runs (ReleaseAfter): the
// start-up's code (setup, the first /proc resync) has run by then.
const After = 10 * time.Second

// ReleaseAfter calls Release once, after, unless ctx ends first, and logs
// what it released.
func ReleaseAfter(ctx context.Context, after time.Duration, log *slog.Logger) {
	t := time.NewTimer(after)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	n, err := Release("/proc/self")
	if err != nil {
		log.Warn("releasing the executable's start-up pages", "error", err)
		return
	}
	log.Debug("released the executable's start-up pages", "bytes", n)
}

// Release unmaps (MADV_DONTNEED) the pages of the process's executable
// that are mapped read-only and were never written, and returns how many
// bytes of such mappings were resident before.
//
// Why: package initialisation (the Kubernetes API scheme's registration
// above all) touches code and read-only data across the whole binary, and
// the kernel maps up to 64 KiB around each such fault from the page cache
// (fault-around), so gpud's RSS held about 45 MiB of its executable that
// nothing runs again (issue 31: measured by paging it out, the idle
// working set of those mappings is a few MiB). The pages stay in the page
// cache: what runs later faults them back in without I/O while they are
// cached (a minor fault).
//
// A mapping holding any page written since it was mapped (Anonymous above
// 0 in smaps: relocated read-only data of a position-independent binary,
// made read-only after the dynamic loader wrote it) is left alone, since
// MADV_DONTNEED would throw its private copy away; so are writable ones.
// proc is /proc/self (a directory of that form, for tests).
func Release(proc string) (uint64, error) {
	exe, err := os.Readlink(proc + "/exe")
	if err != nil {
		return 0, fmt.Errorf("selfmem: the executable: %w", err)
	}
	maps, err := readSmaps(proc+"/smaps", exe)
	if err != nil {
		return 0, err
	}
	var released uint64
	for _, m := range maps {
		if !releasable(m) {
			continue
		}
		// By address: the range is not Go memory, so no slice is made of it.
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, unix.MADV_DONTNEED); e != 0 {
			return released, fmt.Errorf("selfmem: madvise %#x-%#x: %w", m.start, m.end, e)
		}
		released += m.rss
	}
	return released, nil
}

// releasable: read-only, resident, and no page of it written (private).
func releasable(m mapping) bool { return !m.writable && m.anonymous == 0 && m.rss != 0 }

// mapping is one of smaps' entries for the executable.
type mapping struct {
	start, end     uintptr
	writable       bool
	rss, anonymous uint64 // bytes
}

// readSmaps returns the mappings of path in an smaps file.
func readSmaps(file, path string) ([]mapping, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("selfmem: %w", err)
	}
	var out []mapping
	var cur *mapping
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Bytes()
		f := bytes.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !bytes.HasSuffix(f[0], []byte(":")) { // a mapping's header: range perms offset dev inode [path]
			cur = nil
			if len(f) < 6 || string(bytes.Join(f[5:], []byte(" "))) != path {
				continue
			}
			lo, hi, ok := bytes.Cut(f[0], []byte("-"))
			start, err1 := strconv.ParseUint(string(lo), 16, 64)
			end, err2 := strconv.ParseUint(string(hi), 16, 64)
			if !ok || err1 != nil || err2 != nil || end <= start || len(f[1]) < 2 {
				return nil, fmt.Errorf("selfmem: %s: bad mapping %q", file, line)
			}
			out = append(out, mapping{start: uintptr(start), end: uintptr(end), writable: f[1][1] == 'w'})
			cur = &out[len(out)-1]
			continue
		}
		if cur == nil || len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil {
			continue
		}
		switch string(f[0]) {
		case "Rss:":
			cur.rss = kb << 10
		case "Anonymous:":
			cur.anonymous = kb << 10
		}
	}
	return out, sc.Err()
}
