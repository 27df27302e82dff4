package occupancy

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

// The holders' re-read (--hooks driver) reads a holder's fd table and
// identity only when one of its known GPU fds no longer names the GPU: an
// unchanged holder costs a statx per fd (issue 31). A close is still
// found, and a dup that keeps the GPU open is found when the known fd goes.
func TestRescanRereadsOnlyChangedHolders(t *testing.T) {
	tr, p := fakeTracker(t)
	p.process(124, "other", 6666, "0::/user.slice\n")
	p.link(124, "5", "/dev/null")
	if err := tr.Resync(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tr.rescanHolders(now) // the first: each read whole once, its fd count noted
	base := tr.Rereads.Load()
	tr.rescanHolders(now)
	if n := tr.Rereads.Load() - base; n != 0 {
		t.Fatalf("unchanged holders: %d re-read, want 0", n)
	}
	// 123 closes 3, holding through 4 (a dup): re-read, holding through 4.
	p.link(123, "4", "/dev/null")
	rm(t, filepath.Join(p.root, "123", "fd", "3"))
	tr.rescanHolders(now)
	if n := tr.Rereads.Load() - base; n != 1 {
		t.Fatalf("after a close: %d re-read, want 1", n)
	}
	if fds := tr.Ledger.FDs(123, 0); !slices.Equal(fds, []int32{4}) {
		t.Fatalf("123 holds GPU 0 through %v, want [4]", fds)
	}
	// 124's fd 5 now names a regular file (closed, the number reused):
	// re-read and dropped.
	rm(t, filepath.Join(p.root, "124", "fd", "5"))
	p.link(124, "5", filepath.Join(p.root, "124", "stat"))
	tr.rescanHolders(now)
	if _, ok := tr.Ledger.Has(124); ok {
		t.Fatal("124 closed its GPU fd and still holds")
	}
	if n := tr.Rereads.Load() - base; n != 2 {
		t.Fatalf("%d re-read, want 2", n)
	}
}

// A holder found unchanged is checked less often, up to RescanBackoff
// times the re-read's period apart: its close is found late, but within that bound however
// long it held (issue 31: 512 holders each checked every 2 s were most of
// gpud's idle CPU).
func TestRescanBacksOffUnchangedHolders(t *testing.T) {
	tr, p := fakeTracker(t)
	tr.RescanHolders = 2 * time.Second
	if err := tr.Resync(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	tr.rescanHolders(at(0)) // read whole once
	// Unchanged for ten minutes, re-read every 2 s as the tracker does.
	s := 0
	for s = 2; s <= 600; s += 2 {
		tr.rescanHolders(at(s))
	}
	if got := tr.checks[123].every; got != RescanBackoff*tr.RescanHolders {
		t.Fatalf("after ten unchanged minutes 123 is checked every %v, want %v", got, RescanBackoff*tr.RescanHolders)
	}
	// It closes its GPU fd (the number reused for a regular file): found
	// within RescanBackoff re-reads, not at the next one.
	rm(t, filepath.Join(p.root, "123", "fd", "3"))
	p.link(123, "3", filepath.Join(p.root, "123", "stat"))
	closed := s
	for ; s <= closed+2*RescanBackoff; s += 2 {
		tr.rescanHolders(at(s))
		if _, ok := tr.Ledger.Has(123); !ok {
			break
		}
	}
	late := s - closed
	if late > 2*RescanBackoff {
		t.Fatalf("123 closed its GPU fd and still holds %d s later", late)
	}
	if late <= 2 {
		t.Fatalf("found %d s after the close: an unchanged holder is still checked at every re-read", late)
	}
}

// A dup changes the fd table's size (/proc/PID/fd's, Linux 6.2 and
// later): the holder is read whole and the dup is in the ledger at once,
// as when every holder was read whole.
func TestRescanFindsADup(t *testing.T) {
	if (&ProcFS{Root: "/proc"}).FDCount(os.Getpid()) == 0 {
		testutil.Skip(t, "this kernel's /proc/PID/fd has no size (before Linux 6.2)")
	}
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pid, fd := os.Getpid(), int32(f.Fd())
	tr := &Tracker{Ledger: NewLedger(nullGPU(), time.Minute), Proc: &ProcFS{Root: "/proc", Devs: Devs(nullGPU())}}
	now := time.Now()
	tr.reconcile(pid, now)
	tr.rescanHolders(now) // notes the fd count
	base := tr.Rereads.Load()
	dup, err := unix.Dup(int(fd))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dup)
	tr.rescanHolders(now)
	if n := tr.Rereads.Load() - base; n != 1 {
		t.Fatalf("after a dup: %d re-read, want 1", n)
	}
	if fds := tr.Ledger.FDs(pid, 0); !slices.Contains(fds, fd) || !slices.Contains(fds, int32(dup)) {
		t.Fatalf("holds /dev/null through %v, want %d and its dup %d", fds, fd, dup)
	}
}

func TestKnownFDsHold(t *testing.T) {
	p := newFakeProc(t)
	p.process(50, "x", 1, "0::/\n")
	p.link(50, "3", "/dev/null") // GPU 0
	p.link(50, "4", "/dev/zero") // GPU 1
	p.link(50, "5", filepath.Join(p.root, "50", "stat"))
	fs := &ProcFS{Root: p.root, Devs: fakeDevs}
	for _, tc := range []struct {
		name string
		pid  int
		fds  map[int][]int32
		want bool
	}{
		{"both GPUs", 50, map[int][]int32{0: {3}, 1: {4}}, true},
		{"none known", 50, map[int][]int32{}, true},
		{"fd now names the other GPU", 50, map[int][]int32{0: {4}}, false},
		{"fd names a regular file", 50, map[int][]int32{0: {5}}, false},
		{"fd closed", 50, map[int][]int32{0: {3, 9}}, false},
		{"io_uring slot: only the full read sees it", 50, map[int][]int32{0: {3, -1}}, false},
		{"no such process", 51, map[int][]int32{0: {3}}, false},
	} {
		if got := fs.KnownFDsHold(tc.pid, tc.fds); got != tc.want {
			t.Errorf("%s: KnownFDsHold(%d, %v) = %v, want %v", tc.name, tc.pid, tc.fds, got, tc.want)
		}
	}
	// The real /proc: this process's own fd on /dev/null.
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	real := &ProcFS{Root: "/proc", Devs: fakeDevs}
	fd := map[int][]int32{0: {int32(f.Fd())}}
	if !real.KnownFDsHold(os.Getpid(), fd) {
		t.Error("an open /dev/null fd in /proc: not held")
	}
	f.Close()
	if real.KnownFDsHold(os.Getpid(), fd) {
		t.Error("a closed fd in /proc: still held")
	}
}

// A holder's name is read at every call for a while after it was read
// whole (an exec, a new holder: when processes rename themselves), and
// otherwise once in commEvery calls, in turn.
func TestRefreshCommsEstablishedHoldersInTurn(t *testing.T) {
	tr, p := fakeTracker(t)
	if err := tr.Resync(); err != nil {
		t.Fatal(err)
	}
	comm := func() string { i, _ := tr.Ledger.Has(123); return i.Comm }
	p.write("123/comm", "renamed\n")
	now := time.Now()
	tr.RefreshComms(now)
	if c := comm(); c != "train" {
		t.Fatalf("an established holder's name read at the first call (%q): want one call in %d", c, commEvery)
	}
	calls := 1
	for ; calls < commEvery && comm() != "renamed"; calls++ {
		tr.RefreshComms(now)
	}
	if c := comm(); c != "renamed" {
		t.Fatalf("after %d calls the name is %q, want renamed", calls, c)
	}
	// Read whole now (an exec): its name is read at every call.
	tr.reconcile(123, now)
	for i := range 3 {
		name := "again" + strconv.Itoa(i)
		p.write("123/comm", name+"\n")
		tr.RefreshComms(now)
		if c := comm(); c != name {
			t.Fatalf("a holder read just now: name %q after a call, want %q", c, name)
		}
	}
	// Its exit forgets it.
	tr.forget(123)
	if tr.isRecent(123) {
		t.Error("an exited process is still read at every call")
	}
}

func rm(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}
