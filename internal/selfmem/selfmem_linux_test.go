package selfmem

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// rssFile is this process's RssFile in bytes.
func rssFile(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// Release drops the executable's resident read-only pages from this
// process's RSS, and the process runs on (its code faults back in).
func TestReleaseShrinksRSSAndRunsOn(t *testing.T) {
	before := rssFile(t)
	n, err := Release("/proc/self")
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	if n == 0 || after >= before {
		t.Fatalf("released %d bytes; RssFile %d → %d, want it lower", n, before, after)
	}
	// Code and read-only data used after the release still work.
	if _, err := readSmaps("/proc/self/smaps", "/nonexistent"); err != nil {
		t.Fatal(err)
	}
	t.Logf("released %d KiB; RssFile %d → %d KiB", n>>10, before>>10, after>>10)
}

func TestReadSmaps(t *testing.T) {
	const smaps = `00400000-00410000 r--p 00000000 fd:01 42 /usr/bin/gpud
Rss:                  64 kB
Anonymous:             0 kB
00410000-01f63000 r-xp 00010000 fd:01 42 /usr/bin/gpud
Size:              27980 kB
Rss:               24212 kB
Anonymous:             0 kB
01f63000-03f84000 r--p 01b63000 fd:01 42 /usr/bin/gpud
Rss:               29872 kB
Anonymous:            12 kB
03f85000-04000000 rw-p 03b84000 fd:01 42 /usr/bin/gpud
Rss:                 500 kB
Anonymous:           400 kB
7f0000000000-7f0000001000 r-xp 00000000 fd:01 43 /usr/lib/libc.so.6
Rss:                 900 kB
Anonymous:             0 kB
7f0000002000-7f0000003000 rw-p 00000000 00:00 0
Rss:                   4 kB
`
	p := filepath.Join(t.TempDir(), "smaps")
	if err := os.WriteFile(p, []byte(smaps), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readSmaps(p, "/usr/bin/gpud")
	if err != nil {
		t.Fatal(err)
	}
	want := []mapping{
		{start: 0x400000, end: 0x410000, rss: 64 << 10},
		{start: 0x410000, end: 0x1f63000, rss: 24212 << 10},
		{start: 0x1f63000, end: 0x3f84000, rss: 29872 << 10, anonymous: 12 << 10},
		{start: 0x3f85000, end: 0x4000000, writable: true, rss: 500 << 10, anonymous: 400 << 10},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d mappings, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("mapping %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for i, m := range got {
		if want := i < 2; releasable(m) != want {
			t.Errorf("mapping %d (%+v): releasable %v, want %v", i, m, !want, want)
		}
	}
}
