// Package journal is the durable record of preemptions (the journal, with
// the kills a previous gpud left pending resolved at start) and the task
// checkpoint directories it keys: the notice written into one, their
// layout, which container mounts which.
package journal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	v1 "github.com/gpud/gpud/api/v1"
	"github.com/gpud/gpud/internal/preempt"
	"github.com/gpud/gpud/internal/safefs"
)

// Journal is the durable record of preemptions: JSON lines appended to a
// file under --state-dir, fsync'ed. A record updated later (resumed) is
// appended again with the same id; the last line of an id wins.
type Journal struct {
	mu     sync.Mutex
	syncMu sync.Mutex // one fsync at a time outside mu (appendDurable)
	f      *os.File
	recent []preempt. // last keep records, oldest first
		Record
	keep   int
	seq    uint64
	byTask map[taskKey]int // (namespace, task id) → index in recent of its newest kill
	// torn is set when the file does not end in a newline (a write cut
	// short by a crash): the next record starts on a line of its own, or it
	// would be glued to the torn one and lost with it.
	torn bool
	// size is the file's length after the last whole record: a write that
	// fails (a full disk) is truncated back to it, so the file never keeps
	// half a record.
	size int64

	// Records whose write failed wait here, in order, and are written by a
	// timer (retry) until the disk takes them; later records queue behind
	// them, so an outcome never lands before its intent.
	pending  []pendingRecord
	timer    *time.Timer
	wait     time.Duration
	closed   bool
	failures uint64 // writes that failed
	lost     uint64 // records dropped from a full queue (maxPending)
	lastErr  error
	lastAt   time.Time
	flushed  func() // after a retry wrote every waiting record
}

// ErrWriteQueued: the disk did not take a record (full, say); it is kept
// in memory and written by a retry timer, in order, once it can be.
var ErrWriteQueued = errors.New("preempt: journal write failed; the record is kept and retried")

type pendingRecord struct {
	line []byte
	sync bool
}

// maxPending bounds the records kept for a retry (about 2 MiB): past it
// the oldest is dropped and counted, so a disk that never comes back
// cannot grow gpud without bound.
const maxPending = 4096

// Retry waits between tries of a failed journal write, doubling.
const (
	retryFirst = 500 * time.Millisecond
	retryMax   = 5 * time.Second
)

// OpenJournal opens (creating) the journal at path and loads its last keep
// records. Lines that cannot be parsed (a torn last write, garbage, a line
// longer than any record) are skipped and reported in skipped; they never
// stop gpud from starting.
func OpenJournal(path string, keep int) (j *Journal, skipped int, err error) {
	// In a directory only root can change, never through a symlink, only
	// a regular file root owns (safefs); root-only, as records name pods.
	dir, err := safefs.OpenDir(filepath.Dir(path), 0o755)
	if err != nil {
		return nil, 0, fmt.Errorf("preempt: journal: %w", err)
	}
	f, err := dir.OpenAppend(filepath.Base(path), 0o600)
	dir.Close()
	if err != nil {
		return nil, 0, fmt.Errorf("preempt: journal: %w", err)
	}
	if err := f.Chmod(0o600); err != nil { // one an older gpud made 0644
		f.Close()
		return nil, 0, fmt.Errorf("preempt: journal: %w", err)
	}
	keep = max(keep, 0)
	j = &Journal{f: f, keep: keep}
	order := []string{}
	byID := map[string]preempt.Record{}
	rd := bufio.NewReaderSize(f, 64*1024)
	var buf []byte
	for {
		line, tooLong, nl, err := readLine(rd, buf[:0], maxJournalLine)
		buf = line
		if (len(line) > 0 || tooLong) && !nl {
			j.torn = true // only the last line can lack its newline
		}
		if line = bytes.TrimSpace(line); len(line) > 0 || tooLong {
			var r preempt.Record
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
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, skipped, fmt.Errorf("preempt: journal: %w", err)
	}
	j.size = st.Size()
	if st.Size() > maxJournalBytes {
		// Compacted to the records kept, so the file does not grow for ever.
		// A compaction that fails (a full disk) leaves the file whole and
		// is tried again at the next start: it must not stop gpud.
		_ = j.compact(path)
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
	dir, err := safefs.OpenDir(filepath.Dir(path), 0o755)
	if err != nil {
		return fmt.Errorf("preempt: compacting journal: %w", err)
	}
	defer dir.Close()
	if err := dir.WriteFile(filepath.Base(path), buf.Bytes(), 0o600, true); err != nil {
		return fmt.Errorf("preempt: compacting journal: %w", err)
	}
	f, err := dir.OpenAppend(filepath.Base(path), 0o600)
	if err != nil {
		return fmt.Errorf("preempt: journal: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("preempt: journal: %w", err)
	}
	j.f.Close()
	j.f, j.torn, j.size = f, false, st.Size()
	return nil
}

// taskKey names a task as its checkpoint directory does (TaskDir): the
// same task id in two namespaces is two tasks; "" is a Docker container's.
type taskKey struct{ namespace, taskID string }

func (j *Journal) reindex() {
	j.byTask = map[taskKey]int{}
	for i, r := range j.recent {
		if r.Action == preempt.ActionKill && r.Victim.TaskID != "" {
			j.byTask[taskKey{r.Victim.Namespace, r.Victim.TaskID}] = i
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

// Append writes a record durably and keeps it among the recent ones.
func (j *Journal) Append(r preempt.Record) error {
	return j.appendDurable([]preempt.Record{r})
}

// syncFile is (*os.File).Sync; a variable so that a test can make it slow
// or fail.
var syncFile = (*os.File).Sync

// appendDurable writes rs (one write) under the lock and fsyncs the file
// after releasing it, and returns once they are on disk. Why not under the
// lock: an fsync takes milliseconds, tens under I/O load, and the next
// kill's intents (NoteAll, on that kill's critical path) waited for the
// previous batch's outcomes to be synced: 19 ms of a preemption's 20 ms
// with a CPU hog per core beside it (docs/benchmarks.md). An fsync
// makes every write before it durable, the intents written meanwhile too.
// Where the disk is failing (records waiting for a retry, or the write
// now fails) everything stays under the lock as before: the retry writes
// and syncs in order. A failed fsync queues rs again, durably, for the
// retry: a record's last line wins when the journal is read.
func (j *Journal) appendDurable(rs []preempt.Record) error {
	j.mu.Lock()
	if len(j.pending) > 0 || j.closed {
		defer j.mu.Unlock()
		return j.addLocked(rs, true)
	}
	if err := j.addLocked(rs, false); err != nil {
		// Queued (last) for the retry: written and synced by it.
		j.pending[len(j.pending)-1].sync = true
		j.mu.Unlock()
		return err
	}
	f := j.f
	j.mu.Unlock()
	j.syncMu.Lock()
	err := syncFile(f)
	j.syncMu.Unlock()
	if err == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return fmt.Errorf("preempt: syncing journal: %w", err)
	}
	j.failures++
	j.lastErr, j.lastAt = fmt.Errorf("syncing: %w", err), time.Now()
	if qerr := j.addLocked(rs, true); qerr != nil {
		return qerr
	}
	return nil
}

// Note writes a record without waiting for the disk: the intent written
// just before a kill, on the kill's critical path. A gpud killed right
// after still leaves it in the page cache, hence in the file.
func (j *Journal) Note(r preempt.Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.appendLocked(r, false)
}

// Resolve settles the records a previous gpud left pending (it died between
// a kill's intent and its outcome): outcome gives each one's result.
func (j *Journal) Resolve(outcome func(preempt.Record) string) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for _, r := range append([]preempt.Record(nil), j.recent...) {
		if r.Result != preempt.ResultPending {
			continue
		}
		r.Result = outcome(r)
		// Queued for a retry is not a failure here: a full disk must not
		// stop gpud from starting.
		if err := j.appendLocked(r, true); err != nil && !errors.Is(err, ErrWriteQueued) {
			return n, err
		}
		n++
	}
	return n, nil
}

func (j *Journal) appendLocked(r preempt.Record, sync bool) error {
	return j.addLocked([]preempt.Record{r}, sync)
}

// NoteAll records rs without waiting for the disk: the intents of a batch
// of kills (many victims of one decision), all before the first signal.
func (j *Journal) NoteAll(rs []preempt.Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.addLocked(rs, false)
}

// AppendAll records rs durably with one write and one fsync: the outcomes
// of a batch of kills. The fsync holds no lock the next kill's intents
// wait for (appendDurable).
func (j *Journal) AppendAll(rs []preempt.Record) error {
	return j.appendDurable(rs)
}

// addLocked keeps rs among the recent records (the state file shows them
// whether or not the disk takes them now: a failed write is retried, not
// lost) and queues them as one write, with one fsync when sync: a batch is
// on disk whole or not at all, never interleaved with other records. Then
// it writes what waits.
func (j *Journal) addLocked(rs []preempt.Record, sync bool) error {
	if len(rs) == 0 {
		return nil
	}
	var lines []byte
	for _, r := range rs {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("preempt: encoding record %s: %w", r.ID, err)
		}
		lines = append(append(lines, b...), '\n')
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
		j.recent = append([]preempt.Record(nil), j.recent[len(j.recent)-j.keep:]...)
	}
	j.reindex()
	if len(j.pending) >= maxPending {
		j.pending = j.pending[1:]
		j.lost++
	}
	j.pending = append(j.pending, pendingRecord{line: lines, sync: sync})
	if err := j.flushLocked(); err != nil {
		return fmt.Errorf("%w: %w", ErrWriteQueued, err)
	}
	return nil
}

// flushLocked writes the waiting records in order, each whole or not at
// all, and stops at the first that fails (arming the retry timer).
func (j *Journal) flushLocked() error {
	for len(j.pending) > 0 {
		p := j.pending[0]
		if err := j.writeLocked(p.line, p.sync); err != nil {
			j.failures++
			j.lastErr, j.lastAt = err, time.Now()
			j.armLocked()
			return err
		}
		j.pending[0] = pendingRecord{}
		j.pending = j.pending[1:]
	}
	j.pending = nil
	j.wait = 0
	return nil
}

// writeLocked appends one line. A write or fsync that fails is cut back to
// the last whole record (ftruncate), so what is on disk is whole lines
// only and the retry does not glue a record to a fragment.
func (j *Journal) writeLocked(line []byte, sync bool) error {
	if j.torn {
		line = append([]byte{'\n'}, line...)
	}
	n, err := j.f.Write(line)
	if err == nil && sync {
		if err = syncFile(j.f); err != nil {
			err = fmt.Errorf("syncing: %w", err)
		}
	}
	if err != nil {
		if terr := j.f.Truncate(j.size); terr != nil && n > 0 {
			// Part of the line stays: the next record starts on a line of
			// its own (torn); the fragment is skipped at the next start.
			j.torn = true
			j.size += int64(n)
		}
		return fmt.Errorf("preempt: writing journal: %w", err)
	}
	j.torn = false
	j.size += int64(n)
	return nil
}

// armLocked schedules a retry of the waiting records.
func (j *Journal) armLocked() {
	if j.timer != nil || j.closed {
		return
	}
	if j.wait == 0 {
		j.wait = retryFirst
	} else {
		j.wait = min(2*j.wait, retryMax)
	}
	j.timer = time.AfterFunc(j.wait, func() {
		j.mu.Lock()
		j.timer = nil
		done := !j.closed && j.flushLocked() == nil // a failure is counted and re-armed
		flushed := j.flushed
		j.mu.Unlock()
		if done && flushed != nil {
			flushed()
		}
	})
}

// OnFlushed sets what is called once a retry has written every waiting
// record (the state file's health section is rewritten).
func (j *Journal) OnFlushed(f func()) {
	j.mu.Lock()
	j.flushed = f
	j.mu.Unlock()
}

// JournalHealth is what failed: writes since open, records waiting for a
// retry, records dropped from a full queue, and the last error.
type JournalHealth struct {
	Failures  uint64
	Pending   int
	Lost      uint64
	LastError error
	LastAt    time.Time
}

// Health reports the journal's failed writes.
func (j *Journal) Health() JournalHealth {
	j.mu.Lock()
	defer j.mu.Unlock()
	return JournalHealth{j.failures, len(j.pending), j.lost, j.lastErr, j.lastAt}
}

// Resumed marks the newest kill record of a task as resumed, once. The
// task is its namespace ("" for a Docker container) and its id, as its
// checkpoint directory is keyed: a pod in another namespace naming the
// same task id resumes nothing of this one (a resumed record turns its
// directory's mount read-only for the task's later pods).
func (j *Journal) Resumed(namespace, taskID string, at time.Time) (preempt.Record, bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	i, ok := j.byTask[taskKey{namespace, taskID}]
	if !ok || j.recent[i].ResumedAt != nil {
		return preempt.Record{}, false, nil
	}
	r := j.recent[i]
	t := at.UTC()
	r.ResumedAt = &t
	return r, true, j.appendLocked(r, true)
}

// Recent returns the last records, oldest first.
func (j *Journal) Recent() []preempt.Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]preempt.Record(nil), j.recent...)
}

// FillHealth adds the journal's part to the state file's health section:
// its failed writes, the records waiting, and its last error when newer.
func (j *Journal) FillHealth(h *v1.Health) {
	jh := j.Health()
	h.JournalWriteFailures, h.JournalPending = jh.Failures, jh.Pending
	if jh.LastError != nil && (h.LastErrorAt == nil || jh.LastAt.After(*h.LastErrorAt)) {
		t := jh.LastAt.UTC()
		h.LastError, h.LastErrorAt = jh.LastError.Error(), &t
	}
}

// Close writes what still waits (one last try) and closes the file.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closed = true
	if j.timer != nil {
		j.timer.Stop()
		j.timer = nil
	}
	if err := j.flushLocked(); err != nil {
		j.f.Close()
		return fmt.Errorf("preempt: closing journal with %d records unwritten: %w", len(j.pending), err)
	}
	return j.f.Close()
}

// RecentRaw returns Recent as the state file carries it.
func (j *Journal) RecentRaw() []v1.RawPreemption {
	var out []v1.RawPreemption
	for _, r := range j.Recent() {
		if b, err := json.Marshal(r); err == nil {
			out = append(out, b)
		}
	}
	return out
}

// RestartOutcome is the result a restarted gpud gives a kill its
// predecessor journaled as pending (for Resolve): the victim is gone, or
// the kill's outcome is unknown.
func RestartOutcome(r preempt.Record) string {
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(r.Victim.PID))); errors.Is(err, os.ErrNotExist) {
		return "gone (gpud restarted during the kill)"
	}
	return "interrupted (gpud restarted before confirming the kill)"
}

// OpenStateJournal opens the journal in a state directory
// (preemptions.jsonl, the last 50 records kept in memory) and resolves the
// kills a previous gpud started but did not live to record.
func OpenStateJournal(stateDir string, log *slog.Logger) (*Journal, error) {
	j, skipped, err := OpenJournal(filepath.Join(stateDir, "preemptions.jsonl"), 50)
	if err != nil {
		return nil, err
	}
	if skipped > 0 {
		log.Warn("preemption journal: skipped unreadable lines", "lines", skipped)
	}
	if n, err := j.Resolve(RestartOutcome); err != nil {
		j.Close()
		return nil, fmt.Errorf("preemption journal: %w", err)
	} else if n > 0 {
		log.Warn("preemption journal: resolved kills a previous gpud left pending", "records", n)
	}
	return j, nil
}
