package daemon_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/occupancy"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/status"
	"github.com/gpud/gpud/internal/testutil"
)

// metricValue returns a counter's or gauge's value from the registry.
func metricValue(t *testing.T, e *env, name string) float64 {
	t.Helper()
	mfs, err := e.d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// The state file and the journal on a disk that fills (a real 64 KiB
// tmpfs): while it is full a holder appears and a low-priority open of a
// high-held GPU is refused; writes fail and are counted (metrics, and the
// state file's health section that `gpud status` shows). When space
// returns, with no further event, the state file is fresh again (it shows
// the holder) and the refusal's record is in the journal. Before, the
// state file stayed stale until some later change, and the record was
// lost.
func TestFullDiskStateFileAndJournal(t *testing.T) {
	e := sourcelessEnv(t)
	mnt := testutil.SmallFS(t, 64<<10)
	e.cfg.StateFile = filepath.Join(mnt, "state.json")
	e.cfg.StateDir = mnt
	e.start()
	testutil.WaitStateFile(t, e.cfg.StateFile, 3*time.Second, func(f *v1.StateFile) bool { return len(f.GPUs) == 2 })
	hi, lo := highAndLow(t, e.d.Registry(), "full-", "full")

	filler := testutil.Fill(t, mnt)
	fd := hi.doInt("open %s", e.gpus[0].Path)
	e.settle("the high holder", holds(hi.pid(), 0, int32(fd)))
	if got := lo.do("lowrace %s 1 %s", e.gpus[0].Path, filepath.Join(e.dir, "lowrace")); got != "0 1" {
		t.Fatalf("low open of a high-held GPU: %q (opened, refused), want refused", got)
	}
	testutil.Eventually(t, 10*time.Second, "the deny record (in memory)", func() bool { return len(records(e, preempt.ActionDeny)) == 1 })
	testutil.Eventually(t, 10*time.Second, "failed writes counted", func() bool {
		return metricValue(t, e, "gpud_state_write_failures_total") > 0 &&
			metricValue(t, e, "gpud_journal_write_failures_total") > 0 &&
			metricValue(t, e, "gpud_journal_pending_records") == 1
	})
	if f, err := occupancy.ReadStateFile(e.cfg.StateFile); err != nil || len(f.GPUs[0].Holders) != 0 {
		t.Fatalf("the state file changed on a full disk? %v %+v", err, f)
	}
	if !strings.Contains(e.logs.String(), "retrying until it succeeds") {
		t.Error("the failing state file write was not logged")
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// No event from here on: only the retry timers can bring the files up to date.
	start := time.Now()
	f := waitStateFileWithin(t, e.cfg.StateFile, 10*time.Second, func(f *v1.StateFile) bool {
		return len(f.GPUs[0].Holders) == 1 && f.GPUs[0].Holders[0].PID == hi.pid() &&
			f.Health != nil && f.Health.JournalPending == 0 && len(f.Preemptions) == 1
	})
	t.Logf("state file fresh %v after space returned; health %+v", time.Since(start).Round(time.Millisecond), *f.Health)
	if f.Health.StateWriteFailures == 0 || f.Health.JournalWriteFailures == 0 || !strings.Contains(f.Health.LastError, "no space left") {
		t.Errorf("health section: %+v", *f.Health)
	}
	var out bytes.Buffer
	if err := status.Render(&out, f, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "WRITE FAILURES") || !strings.Contains(out.String(), "0 records waiting") {
		t.Errorf("gpud status does not show the failures:\n%s", out.String())
	}
	b, err := os.ReadFile(filepath.Join(mnt, "preemptions.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var r preempt.Record
	if lines := bytes.Split(bytes.TrimSpace(b), []byte("\n")); len(lines) != 1 || json.Unmarshal(lines[0], &r) != nil ||
		r.Action != preempt.ActionDeny || r.Victim.PID != lo.pid() {
		t.Fatalf("journal after space returned:\n%s", b)
	}
	if v := metricValue(t, e, "gpud_journal_pending_records"); v != 0 {
		t.Errorf("gpud_journal_pending_records = %v after the retry", v)
	}
}

func waitStateFileWithin(t *testing.T, path string, d time.Duration, ok func(*v1.StateFile) bool) *v1.StateFile {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		f, err := occupancy.ReadStateFile(path)
		if err == nil && ok(f) {
			return f
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			t.Fatalf("state file never matched within %v (last error %v):\n%s", d, err, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
