package journal

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/gpud/gpud/internal/preempt"
)

// journalModel is what OpenJournal must make of a file, worked out
// independently: lines split at '\n', blank ones ignored, a line that is
// not a record with an id skipped and counted, the last line of an id wins,
// ids in order of first appearance, the last keep of them kept.
type journalModel struct {
	order   []string
	byID    map[string]preempt.Record
	skipped int
}

func modelOf(content []byte) *journalModel {
	m := &journalModel{byID: map[string]preempt.Record{}}
	for _, line := range bytes.Split(content, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var r preempt.Record
		if json.Unmarshal(line, &r) != nil || r.ID == "" {
			m.skipped++
			continue
		}
		m.put(r)
	}
	return m
}

func (m *journalModel) put(r preempt.Record) {
	if _, ok := m.byID[r.ID]; !ok {
		m.order = append(m.order, r.ID)
	}
	m.byID[r.ID] = r
}

func (m *journalModel) recent(keep int) []preempt.Record {
	order := m.order
	if len(order) > keep {
		order = order[len(order)-keep:]
	}
	var out []preempt.Record
	for _, id := range order {
		out = append(out, m.byID[id])
	}
	return out
}

// FuzzOpenJournal: whatever the journal file holds (torn lines, garbage,
// duplicate ids, blank lines), OpenJournal never fails or panics, skips and
// counts exactly the unreadable lines, and keeps every valid record (the
// last keep ids, last line of an id winning). A record appended after
// opening such a file survives a reopen, and loses nothing read before.
func FuzzOpenJournal(f *testing.F) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	rec := func(r preempt.Record) string {
		b, err := json.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		return string(b)
	}
	a := rec(preempt.Record{ID: "a", Time: t0, GPU: 0, Action: preempt.ActionKill, Victim: preempt.Party{PID: 10, TaskID: "t"}, Result: "done"})
	b := rec(preempt.Record{ID: "b", Time: t0, GPU: 1, Action: preempt.ActionDeny, Victim: preempt.Party{PodUID: "u"}, Result: "done"})
	aResumed := rec(preempt.Record{ID: "a", Time: t0, GPU: 0, Action: preempt.ActionKill, Victim: preempt.Party{PID: 10, TaskID: "t"},
		Result: "done", ResumedAt: &t0})
	f.Add([]byte(""), uint8(50))
	f.Add([]byte(a+"\n"+b+"\n"), uint8(50))
	f.Add([]byte(a+"\n"+b+"\n"+aResumed+"\n"), uint8(1))
	f.Add([]byte(a+"\n"+b[:len(b)/2]), uint8(50))                 // torn last write
	f.Add([]byte(a[:len(a)-1]), uint8(50))                        // torn before the closing brace
	f.Add([]byte(a), uint8(50))                                   // complete record, newline lost
	f.Add([]byte("\n\n  \r\n"+a+"\r\n\t\n"), uint8(3))            // blank lines, CRLF
	f.Add([]byte(`{"id":""}`+"\n"+`{}`+"\nnull\n[]\n"), uint8(5)) // JSON, not records
	f.Add([]byte(`{"id":"x","time":"yesterday"}`+"\n"+`{"id":"y","gpu":1e400}`+"\n"), uint8(5))
	f.Add([]byte("\x00\xff\xfe garbage\n"+b+"\n"), uint8(0))
	f.Fuzz(func(t *testing.T, content []byte, keep8 uint8) {
		keep := int(keep8 % 64)
		p := filepath.Join(fastTempDir(t), "preemptions.jsonl")
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
		m := modelOf(content)
		j, skipped, err := OpenJournal(p, keep)
		if err != nil {
			t.Fatalf("OpenJournal: %v", err)
		}
		if skipped != m.skipped {
			j.Close()
			t.Fatalf("skipped %d lines, want %d", skipped, m.skipped)
		}
		if got, want := j.Recent(), m.recent(keep); !reflect.DeepEqual(got, want) {
			j.Close()
			t.Fatalf("recent =\n%+v\nwant\n%+v", got, want)
		}
		// A record appended now is durable and costs nothing already there.
		r := preempt.Record{ID: fmt.Sprintf("new-%d", len(content)), Time: t0, GPU: 3, Action: preempt.ActionKill,
			Victim: preempt.Party{TaskID: "fuzz"}, Result: "done"}
		if err := j.Append(r); err != nil {
			j.Close()
			t.Fatalf("Append: %v", err)
		}
		m.put(r)
		if got, want := j.Recent(), m.recent(keep); !reflect.DeepEqual(got, want) {
			j.Close()
			t.Fatalf("recent after Append =\n%+v\nwant\n%+v", got, want)
		}
		j.Close()
		j, skipped, err = OpenJournal(p, keep)
		if err != nil {
			t.Fatalf("reopening: %v", err)
		}
		defer j.Close()
		if skipped != m.skipped {
			t.Fatalf("reopened: skipped %d lines, want %d (the appended record was glued to a torn line?)", skipped, m.skipped)
		}
		if got, want := j.Recent(), m.recent(keep); !reflect.DeepEqual(got, want) {
			t.Fatalf("reopened: recent =\n%+v\nwant\n%+v", got, want)
		}
	})
}

// fastTempDir is a temporary directory in memory where there is one:
// Append fsyncs, and on a disk that alone would hold the fuzzer to a few
// dozen executions a second.
func fastTempDir(t *testing.T) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if dir, err := os.MkdirTemp("/dev/shm", "gpud-fuzz-journal"); err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}
