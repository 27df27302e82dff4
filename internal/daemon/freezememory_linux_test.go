//go:build cgo

package daemon_test

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/testutil"
)

// --preempt-mode freeze with NVML (the double: 16 GiB GPUs): a low holder
// using 2 GiB is frozen when a high open comes (14 GiB free: the
// preemptor can have what the kill would free); one using 12 GiB (4 GiB
// free) is killed instead, no CUDA checkpoint API being loaded, and the
// kill record's reason says why.
func TestFreezeOnlyWhenTheMemoryIsFree(t *testing.T) {
	for _, tc := range []struct {
		name   string
		used   uint64
		action string
		reason string
	}{
		{"2 GiB of 16: frozen", 2 << 30, preempt.ActionFreeze, ""},
		{"12 GiB of 16: killed", 12 << 30, preempt.ActionKill, "keep 12288 MiB of GPU 0's memory with 4096 MiB free, and there is no CUDA checkpoint API: killed instead"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			double := withNVMLDouble(e)
			e.cfg.Enforce, e.cfg.FailOpenAfter, e.cfg.DockerHost, e.cfg.Reclaim = true, 30*time.Second, "none", "none"
			e.cfg.ReservationTTL = 30 * time.Second
			e.cfg.PreemptMode, e.cfg.MaxFrozen = string(preempt.ModeFreeze), time.Hour
			e.start()
			pid, _ := lowCounter(t, e, 0, false)
			double.SetProcesses(t, testutil.NVMLProcess{GPU: nvmlIndex[0], PID: pid, Memory: tc.used})
			testutil.WaitStateFile(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
				g := f.GPUs[0]
				return g.Memory != nil && g.Memory.UsedBytes == tc.used && len(g.Holders) == 1 && g.Holders[0].MemoryBytes != nil
			})
			high, _ := classified(t, e.d.Registry(), "high", occupancy.High, "high")
			high.do("open %s", e.gpus[0].Path)
			var got preempt.Record
			testutil.Eventually(t, 5*time.Second, "a "+tc.action+" record of the low counter", func() bool {
				for _, r := range records(e, tc.action) {
					if r.Victim.PID == pid {
						got = r
						return true
					}
				}
				return false
			})
			if tc.reason == "" && got.Reason != "" || !strings.Contains(got.Reason, tc.reason) {
				t.Fatalf("reason %q, want %q", got.Reason, tc.reason)
			}
			if alive := testutil.Alive(pid); alive != (tc.action == preempt.ActionFreeze) {
				t.Fatalf("the low counter alive: %v after %s", alive, tc.action)
			}
		})
	}
}
