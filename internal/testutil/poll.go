package testutil

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MinWait is the least Poll (Eventually, WaitStateFile) waits for a
// condition before giving up, whatever timeout its caller names: a
// timeout there only bounds a wait for a condition, it is never a latency
// goal (tests that measure one time it themselves). On a loaded machine
// (CI beside other jobs, `make test HOG=1`) what a quiet one does in
// milliseconds can take seconds; a passing test never waits this long.
const MinWait = 30 * time.Second

// Wait is timeout, at least MinWait: the deadline of a test's own wait
// loop for a condition.
func Wait(timeout time.Duration) time.Duration { return max(timeout, MinWait) }

// Poll calls ok every interval (10 ms) until it is true or timeout (at
// least MinWait) has passed, and reports whether it became true. Callers
// that have more to say on failure than "never" use it; others use
// Eventually.
func Poll(timeout time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(Wait(timeout))
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// Eventually fails the test unless ok becomes true within timeout.
func Eventually(tb testing.TB, timeout time.Duration, what string, ok func() bool) {
	tb.Helper()
	if !Poll(timeout, ok) {
		tb.Fatalf("never within %s: %s", Wait(timeout), what)
	}
}

// Alive reports whether process pid runs: it exists and is not a zombie
// (dead for every purpose here; its parent reaps it later).
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

// HTTPGet fetches url (5 s timeout) and returns its status and body.
func HTTPGet(url string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Count is the positive count in the environment variable name, else def:
// a test's size that a developer may shrink on a slow machine.
func Count(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive count", name, v)
	}
	return n
}
