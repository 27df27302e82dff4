package testutil

import (
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// UnloadModule unloads the kernel module name, waiting up to 5 s while it
// is busy (an earlier test's process on its way out with one of its
// files), and returns a function that loads it again from the file ko.
// The test's cleanup loads it if the test did not. busy, when set, says
// who holds it, for the failure message.
func UnloadModule(tb testing.TB, name, ko string, busy func() string) (load func()) {
	tb.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err = unix.DeleteModule(name, unix.O_NONBLOCK); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		refs, _ := os.ReadFile("/sys/module/" + name + "/refcnt")
		who := ""
		if busy != nil {
			who = busy()
		}
		tb.Fatalf("unloading %s: %v (refcnt %s) %s", name, err, strings.TrimSpace(string(refs)), who)
	}
	loaded := false
	load = func() {
		tb.Helper()
		f, err := os.Open(ko)
		if err != nil {
			tb.Fatal(err)
		}
		defer f.Close()
		if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil {
			tb.Fatalf("loading %s: %v", ko, err)
		}
		loaded = true
	}
	tb.Cleanup(func() {
		if !loaded {
			load()
		}
	})
	return load
}
