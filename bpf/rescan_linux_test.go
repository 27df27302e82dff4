package bpf

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestHookStatusRescanAndState(t *testing.T) {
	driver := HookStatus{Mode: HooksDriver, Complete: false, Attached: []string{"release:nvidia_frontend_close"}, Missing: []string{"receive"}, PassedFDs: PassedBySweep}
	if driver.Rescan() != HolderRescan {
		t.Fatalf("driver mode rescans every %v, want %v", driver.Rescan(), HolderRescan)
	}
	if (HookStatus{Mode: HooksSyscalls, Complete: true}).Rescan() != 0 {
		t.Fatal("the syscall hooks report every change: no rescan")
	}
	st := driver.State(time.Minute)
	if st.Mode != HooksDriver || st.Complete || !slices.Equal(st.Attached, driver.Attached) || !slices.Equal(st.Missing, driver.Missing) ||
		st.PassedFDs != driver.PassedBound(time.Minute) {
		t.Fatalf("state %+v", st)
	}
}

func TestLogMkdirHook(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	(&Monitor{}).LogMkdirHook(log)
	if logs.Len() != 0 {
		t.Fatalf("attached: logs %q", logs.String())
	}
	(&Monitor{mkdirErr: errors.New("no cgroup_mkdir tracepoint")}).LogMkdirHook(log)
	if !strings.Contains(logs.String(), "cgroups are not classified as they are made") || !strings.Contains(logs.String(), "no cgroup_mkdir tracepoint") {
		t.Fatalf("not attached: logs %q", logs.String())
	}
}
