package preempt

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpud/gpud/internal/occupancy"
)

// Party is one side of a preemption.
type Party struct {
	PID         int    `json:"pid,omitempty"`
	Comm        string `json:"comm,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	PodUID      string `json:"pod_uid,omitempty"`
	TaskID      string `json:"task_id,omitempty"`
	CgroupID    uint64 `json:"cgroup_id,omitempty"`
}

// Actions recorded.
const (
	ActionKill    = "kill"    // a low-priority holder was killed
	ActionDeny    = "deny"    // a low-priority open was refused
	ActionReclaim = "reclaim" // a container was reclaimed (stopped/removed)
)

// Record is one preemption, as journaled and shown in the state file.
type Record struct {
	ID        string     `json:"id"`
	Time      time.Time  `json:"time"`
	GPU       int        `json:"gpu"`
	Action    string     `json:"action"`
	Rule      string     `json:"rule,omitempty"`
	Victim    Party      `json:"victim"`
	Preemptor Party      `json:"preemptor"`
	Signal    string     `json:"signal,omitempty"`
	LatencyMS float64    `json:"latency_ms,omitempty"` // decision → victim confirmed dead
	Result    string     `json:"result"`               // done, gone, or the error
	ResumedAt *time.Time `json:"resumed_at,omitempty"` // claim 6: the task opened a GPU again
}

// Journal is the durable record of preemptions: JSON lines appended to a
// file under --state-dir, fsync'ed. A record updated later (resumed) is
// appended again with the same id; the last line of an id wins.
type Journal struct {
	mu     sync.Mutex
	f      *os.File
	recent []Record // last keep records, oldest first
	keep   int
	seq    uint64
	byTask map[string]int // task id → index in recent of its newest kill
	// torn is set when the file does not end in a newline (a write cut
	// short by a crash): the next record starts on a line of its own, or it
	// would be glued to the torn one and lost with it.
	torn bool
}

// OpenJournal opens (creating) the journal at path and loads its last keep
// records. Lines that cannot be parsed (a torn last write, garbage, a line
// longer than any record) are skipped and reported in skipped; they never
// stop gpud from starting.
func OpenJournal(path string, keep int) (j *Journal, skipped int, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, 0, fmt.Errorf("preempt: journal dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, 0, fmt.Errorf("preempt: journal: %w", err)
	}
	keep = max(keep, 0)
	j = &Journal{f: f, keep: keep}
	order := []string{}
	byID := map[string]Record{}
	rd := bufio.NewReaderSize(f, 64*1024)
	var buf []byte
	for {
		line, tooLong, nl, err := readLine(rd, buf[:0], maxJournalLine)
		buf = line
		if (len(line) > 0 || tooLong) && !nl {
			j.torn = true // only the last line can lack its newline
		}
		if line = bytes.TrimSpace(line); len(line) > 0 || tooLong {
			var r Record
			if tooLong || json.Unmarshal(line, &r) != nil || r.ID == "" {
				skipped++
			} else {
				if _, ok := byID[r.ID]; !ok {
					order = append(order, r.ID)
				}
				byID[r.ID] = r
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			f.Close()
			return nil, skipped, fmt.Errorf("preempt: reading journal: %w", err)
		}
	}
	if len(order) > keep {
		order = order[len(order)-keep:]
	}
	for _, id := range order {
		j.recent = append(j.recent, byID[id])
	}
	j.reindex()
	if st, err := f.Stat(); err == nil && st.Size() > maxJournalBytes {
		// Compacted to the records kept, so the file does not grow for ever.
		if err := j.compact(path); err != nil {
			f.Close()
			return nil, skipped, err
		}
	}
	return j, skipped, nil
}

// maxJournalBytes is the size past which the journal is compacted at open.
const maxJournalBytes = 8 << 20

// maxJournalLine bounds a journal line kept in memory: a record is well
// under 1 KiB, so a longer line is damage, skipped without holding it.
const maxJournalLine = 1 << 20

// readLine reads the next line of rd into buf, its newline dropped. A line
// longer than limit is consumed but not kept (tooLong). nl says whether the
// line ended with a newline; err is io.EOF after the last line.
func readLine(rd *bufio.Reader, buf []byte, limit int) (line []byte, tooLong, nl bool, err error) {
	for {
		chunk, err := rd.ReadSlice('\n')
		if n := len(chunk); n > 0 && chunk[n-1] == '\n' {
			chunk, nl = chunk[:n-1], true
		}
		if !tooLong && len(buf)+len(chunk) > limit {
			tooLong, buf = true, buf[:0]
		}
		if !tooLong {
			buf = append(buf, chunk...)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return buf, tooLong, nl, err
		}
	}
}

func (j *Journal) compact(path string) error {
	var buf bytes.Buffer
	for _, r := range j.recent {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("preempt: compacting journal: %w", err)
		}
		buf.Write(append(b, '\n'))
	}
	if err := occupancy.WriteAtomic(path, buf.Bytes()); err != nil {
		return fmt.Errorf("preempt: compacting journal: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("preempt: journal: %w", err)
	}
	j.f.Close()
	j.f, j.torn = f, false
	return nil
}

func (j *Journal) reindex() {
	j.byTask = map[string]int{}
	for i, r := range j.recent {
		if r.Action == ActionKill && r.Victim.TaskID != "" {
			j.byTask[r.Victim.TaskID] = i
		}
	}
}

// NewID returns a fresh record id.
func (j *Journal) NewID(now time.Time) string {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.seq++
	return fmt.Sprintf("%d-%d-%d", now.UnixNano(), os.Getpid(), j.seq)
}

// ResultPending marks a kill record written before the kill: if gpud dies
// before the outcome is appended, the next gpud resolves it (Resolve).
const ResultPending = "pending"

// Append writes a record durably and keeps it among the recent ones.
func (j *Journal) Append(r Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.appendLocked(r, true)
}

// Note writes a record without waiting for the disk: the intent written
// just before a kill, on the kill's critical path. A gpud killed right
// after still leaves it in the page cache, hence in the file.
func (j *Journal) Note(r Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.appendLocked(r, false)
}

// Resolve settles the records a previous gpud left pending (it died between
// a kill's intent and its outcome): outcome gives each one's result.
func (j *Journal) Resolve(outcome func(Record) string) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for _, r := range append([]Record(nil), j.recent...) {
		if r.Result != ResultPending {
			continue
		}
		r.Result = outcome(r)
		if err := j.appendLocked(r, true); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func (j *Journal) appendLocked(r Record, sync bool) error {
	return j.writeLocked([]Record{r}, sync)
}

// NoteAll writes records in one write, without waiting for the disk: the
// intents of a batch of kills (many victims of one decision), all before
// the first signal.
func (j *Journal) NoteAll(rs []Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.writeLocked(rs, false)
}

// AppendAll writes records durably with one write and one fsync: the
// outcomes of a batch of kills.
func (j *Journal) AppendAll(rs []Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.writeLocked(rs, true)
}

// writeLocked appends rs as one write (so a batch is not interleaved with
// other records) and, with sync, one fsync; then keeps them among the
// recent ones.
func (j *Journal) writeLocked(rs []Record, sync bool) error {
	if len(rs) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if j.torn {
		buf.WriteByte('\n')
	}
	for _, r := range rs {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("preempt: encoding record %s: %w", r.ID, err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	if _, err := j.f.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("preempt: writing journal (%d records): %w", len(rs), err)
	}
	j.torn = false
	if sync {
		if err := j.f.Sync(); err != nil {
			return fmt.Errorf("preempt: syncing journal: %w", err)
		}
	}
	index := make(map[string]int, len(j.recent))
	for i, r := range j.recent {
		index[r.ID] = i
	}
	for _, r := range rs {
		if i, ok := index[r.ID]; ok {
			j.recent[i] = r
			continue
		}
		j.recent = append(j.recent, r)
		index[r.ID] = len(j.recent) - 1
	}
	if len(j.recent) > j.keep {
		j.recent = append([]Record(nil), j.recent[len(j.recent)-j.keep:]...)
	}
	j.reindex()
	return nil
}

// Resumed marks the newest kill record of a task as resumed (claim 6), once.
func (j *Journal) Resumed(taskID string, at time.Time) (Record, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	i, ok := j.byTask[taskID]
	if !ok || j.recent[i].ResumedAt != nil {
		return Record{}, false, nil
	}
	r := j.recent[i]
	t := at.UTC()
	r.ResumedAt = &t
	return r, true, j.appendLocked(r, true)
}

// Recent returns the last records, oldest first.
func (j *Journal) Recent() []Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]Record(nil), j.recent...)
}

// Close closes the file.
func (j *Journal) Close() error { return j.f.Close() }
