package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// watch runs `gpud status --watch 100ms` with stdout on w for about half a
// second, then interrupts it; it must exit 0.
func watch(t *testing.T, state string, w *os.File, format string) {
	t.Helper()
	cmd := exec.Command(gpudBinary(t), "status", "--state-file", state, "--watch", "100ms", "-o", format)
	var errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = w, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(800 * time.Millisecond) // about 8 frames; at least 3 asked for
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("status --watch: %v %s", err, errOut.String())
	}
}

// TestBinaryWatchPlainOffTerminal: --watch into a pipe writes frame after
// frame with no escape code (a log or `| grep` gets plain text); -o yaml
// frames are documents of one stream. On a terminal (a pty) the table is
// redrawn in place as before.
func TestBinaryWatchPlainOffTerminal(t *testing.T) {
	state := writeState(t)
	for _, format := range []string{"table", "wide", "yaml"} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		watch(t, state, w, format)
		w.Close()
		b, _ := io.ReadAll(r)
		r.Close()
		out := string(b)
		if strings.ContainsRune(out, '\x1b') {
			t.Errorf("-o %s into a pipe: escape codes in %q", format, out)
		}
		if n := strings.Count(out, "4242"); n < 3 {
			t.Errorf("-o %s into a pipe: %d frames, want at least 3:\n%s", format, n, out)
		}
		if format == "yaml" && strings.Count(out, "---\n") != strings.Count(out, "version: 1\n") {
			t.Errorf("-o yaml frames are not separate documents:\n%s", out)
		}
	}

	ptmx, pts := openPTY(t)
	watch(t, state, pts, "table")
	pts.Close()
	ptmx.SetReadDeadline(time.Now().Add(2 * time.Second))
	var screen bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		n, err := ptmx.Read(buf)
		screen.Write(buf[:n])
		if err != nil {
			break // EIO once the last writer is gone
		}
	}
	if n := strings.Count(screen.String(), "\x1b[H\x1b[2J"); n < 3 {
		t.Errorf("on a terminal: %d screen clears, want one a frame:\n%q", n, screen.String())
	}
}

// openPTY opens a pseudo-terminal pair.
func openPTY(t *testing.T) (ptmx, pts *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("no pty: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("ptsname: %v", err)
	}
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pts: %v", err)
	}
	t.Cleanup(func() { pts.Close() })
	return ptmx, pts
}
