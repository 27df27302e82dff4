package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// EventType says what happened to a GPU file descriptor.
type EventType uint32

// Event types; they mirror enum event_type in headers/gpud.h.
const (
	EventOpen   EventType = 1 // a GPU fd appeared (open, dup, fcntl, pidfd_getfd)
	EventClose  EventType = 2 // a GPU fd is being closed
	EventFork   EventType = 3 // a holder forked: reconcile the child from /proc
	EventExec   EventType = 4 // a holder exec'd: reconcile (O_CLOEXEC fds are gone)
	EventExit   EventType = 5 // a holder's last thread exited
	EventResync EventType = 6 // fds changed in bulk: reconcile the process
)

func (t EventType) String() string {
	switch t {
	case EventOpen:
		return "open"
	case EventClose:
		return "close"
	case EventFork:
		return "fork"
	case EventExec:
		return "exec"
	case EventExit:
		return "exit"
	case EventResync:
		return "resync"
	}
	return fmt.Sprintf("EventType(%d)", uint32(t))
}

// Event is one record from the kernel, decoded.
type Event struct {
	Type     EventType
	Mono     uint64 // CLOCK_MONOTONIC ns when the kernel saw it
	CgroupID uint64 // cgroup v2 id of the task
	PID      uint32 // thread id
	TGID     uint32 // process id
	PPID     uint32 // parent's tgid (fork only)
	FD       int32  // -1 when not about one fd
	GPU      int32  // GPU index, -1 when not about one GPU
	Comm     string
}

// EventSize is the size of a raw event record.
var EventSize = binary.Size(gpudEvent{})

// ErrShortEvent and ErrBadEvent are returned by DecodeEvent for records that
// cannot have come from gpud's programs.
var (
	ErrShortEvent = errors.New("bpf: event record too short")
	ErrBadEvent   = errors.New("bpf: malformed event record")
)

// DecodeEvent decodes one raw ring-buffer record.
func DecodeEvent(raw []byte, ev *Event) error {
	if len(raw) < EventSize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrShortEvent, len(raw), EventSize)
	}
	var r gpudEvent
	if _, err := binary.Decode(raw[:EventSize], binary.NativeEndian, &r); err != nil {
		return fmt.Errorf("%w: %w", ErrBadEvent, err)
	}
	if r.Type < uint32(EventOpen) || r.Type > uint32(EventResync) {
		return fmt.Errorf("%w: unknown type %d", ErrBadEvent, r.Type)
	}
	var comm [16]byte
	for i, c := range r.Comm {
		comm[i] = byte(c)
	}
	n := bytes.IndexByte(comm[:], 0)
	if n < 0 {
		n = len(comm)
	}
	*ev = Event{
		Type: EventType(r.Type), Mono: r.Ts, CgroupID: r.CgroupId,
		PID: r.Pid, TGID: r.Tgid, PPID: r.Ppid, FD: r.Fd, GPU: r.Gpu,
		Comm: string(comm[:n]),
	}
	return nil
}
