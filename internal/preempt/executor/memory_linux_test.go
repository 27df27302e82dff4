package executor

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/preempt/journal"
	"github.com/gpud/gpud/internal/testutil"
)

// A freeze keeps the victims' GPU memory: frozen only when the GPU's free
// memory is at least what they hold; else CUDA-checkpointed where the API
// is loaded, else killed; the record's reason says which and why.
func TestExecutorFreezeOnlyWhenMemoryIsFree(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name       string
		free, held uint64
		cuda       bool
		action     string
		reason     string
		ckpt       bool
	}{
		{"enough free: frozen", 8000 * mib, 2000 * mib, true, preempt.ActionFreeze, "", false},
		{"short, CUDA API: checkpointed", 1000 * mib, 2000 * mib, true, preempt.ActionFreeze, "keep 2000 MiB of GPU 0's memory with 1000 MiB free: CUDA-checkpointed instead", true},
		{"short, no CUDA API: killed", 1000 * mib, 2000 * mib, false, preempt.ActionKill, "no CUDA checkpoint API: killed instead", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, _, err := journal.OpenJournal(filepath.Join(t.TempDir(), "preemptions.jsonl"), 50)
			if err != nil {
				t.Fatal(err)
			}
			fc := &fakeCUDA{}
			v, _ := counterVictim(t, preempt.ModeFreeze)
			var asked []int
			e := &Executor{ProcRoot: "/proc", Journal: j, GPUMemory: func(gpu int, pids []int) (uint64, uint64, bool) {
				asked = pids
				return tc.free, tc.held, gpu == 0
			}}
			if tc.cuda {
				e.CUDA = fc
			}
			done := make(chan struct{})
			e.Preempt(context.Background(), 0, "test rule", preempt.Party{PID: 1}, []preempt.Victim{v}, time.Now(), done)
			<-done
			e.Wait()
			t.Cleanup(func() { e.ThawAll("test end") })
			if !slices.Equal(asked, []int{v.PID}) {
				t.Fatalf("memory asked for %v, want the victim's %d", asked, v.PID)
			}
			recs := actions(j, tc.action)
			if len(recs) != 1 || recs[0].Victim.PID != v.PID {
				t.Fatalf("%s records: %+v; all: %+v", tc.action, recs, j.Recent())
			}
			r := recs[0]
			if tc.reason == "" && r.Reason != "" || !strings.Contains(r.Reason, tc.reason) {
				t.Fatalf("reason %q, want %q", r.Reason, tc.reason)
			}
			if r.Checkpointed != tc.ckpt || slices.Contains(fc.got(), "suspend") != tc.ckpt {
				t.Fatalf("checkpointed %v, CUDA calls %v; want checkpointed %v", r.Checkpointed, fc.got(), tc.ckpt)
			}
			if alive := testutil.Alive(v.PID); alive != (tc.action == preempt.ActionFreeze) {
				t.Fatalf("victim alive %v after %s", alive, tc.action)
			}
		})
	}
}
