package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"
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
	// From the gate, at decision time (before the open completes):
	EventGateHigh EventType = 7 // a high-priority open of a GPU with low holders was let through
	EventDeny     EventType = 8 // a low-priority open was refused (EPERM)
	// From the driver hooks: a GPU file's last reference went (its
	// driver's release); reconcile the GPU's holders.
	EventRelease EventType = 9

	// EventTypes is one more than the largest type (arrays indexed by type).
	EventTypes = 10
)

// FDUnknown is EventOpen's FD when the hook saw the file before it had an
// fd (the driver's open, receive_fd): the process's fd table says which
// (FD_UNKNOWN in headers/gpud.h).
const FDUnknown int32 = math.MinInt32

// OpenMarkedHigh is the PPID of an EventOpen with FDUnknown when the gate
// counted the open as high priority (it marked the GPU): user space
// confirms nothing past it until the fd is found (OPEN_MARKED_HIGH).
const OpenMarkedHigh uint32 = 1

const ()

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
	case EventGateHigh:
		return "gate-high"
	case EventDeny:
		return "deny"
	case EventRelease:
		return "release"
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
	PPID     uint32 // parent's tgid (fork); OpenMarkedHigh or 0 (EventOpen with FDUnknown)
	FD       int32  // -1 when not about one fd
	GPU      int32  // GPU index, -1 when not about one GPU
	Comm     string
}

// EventSize is the size of a raw event record (struct event in headers/gpud.h).
const EventSize = 56

// The layout decoded by hand below must stay that of the generated type.
var _ = [1]struct{}{}[unsafe.Sizeof(gpudEvent{})-EventSize]

// ErrShortEvent and ErrBadEvent are returned by DecodeEvent for records that
// cannot have come from gpud's programs: too short, or too long or of an
// unknown type.
var (
	ErrShortEvent = errors.New("bpf: event record too short")
	ErrBadEvent   = errors.New("bpf: malformed event record")
)

// DecodeEvent decodes one raw ring-buffer record.
func DecodeEvent(raw []byte, ev *Event) error {
	if len(raw) < EventSize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrShortEvent, len(raw), EventSize)
	}
	// The ring buffer hands back exactly what the program reserved (no
	// padding), and gpud's programs only reserve struct event: a longer
	// record is another layout, and decoding its first 56 bytes would be
	// silently wrong.
	if len(raw) > EventSize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrBadEvent, len(raw), EventSize)
	}
	// Decoded by hand: this runs for every event, and reflection-based
	// binary.Decode costs more than the rest of the event's handling.
	ne := binary.NativeEndian
	typ := ne.Uint32(raw[16:])
	if typ < uint32(EventOpen) || typ > uint32(EventRelease) {
		return fmt.Errorf("%w: unknown type %d", ErrBadEvent, typ)
	}
	comm := raw[40:56]
	n := bytes.IndexByte(comm, 0)
	if n < 0 {
		n = len(comm)
	}
	*ev = Event{
		Type: EventType(typ), Mono: ne.Uint64(raw[0:]), CgroupID: ne.Uint64(raw[8:]),
		PID: ne.Uint32(raw[20:]), TGID: ne.Uint32(raw[24:]), PPID: ne.Uint32(raw[28:]),
		FD: int32(ne.Uint32(raw[32:])), GPU: int32(ne.Uint32(raw[36:])),
		Comm: string(comm[:n]),
	}
	return nil
}
