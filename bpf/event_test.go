package bpf_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gpud/gpud/bpf"
)

// rawEvent is struct event of headers/gpud.h as the kernel writes it.
type rawEvent struct {
	Ts       uint64
	CgroupID uint64
	Type     uint32
	PID      uint32
	TGID     uint32
	PPID     uint32
	FD       int32
	GPU      int32
	Comm     [16]byte
}

// encode lays r out by hand: the layout is the contract with the kernel.
func encode(r rawEvent) []byte {
	b := make([]byte, 56)
	e := binary.NativeEndian
	e.PutUint64(b[0:], r.Ts)
	e.PutUint64(b[8:], r.CgroupID)
	e.PutUint32(b[16:], r.Type)
	e.PutUint32(b[20:], r.PID)
	e.PutUint32(b[24:], r.TGID)
	e.PutUint32(b[28:], r.PPID)
	e.PutUint32(b[32:], uint32(r.FD))
	e.PutUint32(b[36:], uint32(r.GPU))
	copy(b[40:], r.Comm[:])
	return b
}

func comm(s string) (c [16]byte) {
	copy(c[:], s)
	return c
}

func TestEventSize(t *testing.T) {
	if bpf.EventSize != 56 {
		t.Fatalf("EventSize = %d, want 56", bpf.EventSize)
	}
}

func TestDecodeEvent(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  rawEvent
		want bpf.Event
	}{
		{
			name: "open",
			raw: rawEvent{Ts: 0x0102030405060708, CgroupID: 0x1122334455667788, Type: 1, PID: 1001, TGID: 1000,
				FD: 17, GPU: 3, Comm: comm("python3")},
			want: bpf.Event{Type: bpf.EventOpen, Mono: 0x0102030405060708, CgroupID: 0x1122334455667788,
				PID: 1001, TGID: 1000, FD: 17, GPU: 3, Comm: "python3"},
		},
		{
			name: "fork, no fd, no GPU",
			raw:  rawEvent{Ts: 1, Type: 3, PID: 5, TGID: 5, PPID: 4, FD: -1, GPU: -1, Comm: comm("bash")},
			want: bpf.Event{Type: bpf.EventFork, Mono: 1, PID: 5, TGID: 5, PPID: 4, FD: -1, GPU: -1, Comm: "bash"},
		},
		{
			name: "comm of 16 chars, no NUL",
			raw:  rawEvent{Type: 6, FD: -1, GPU: -1, Comm: comm("0123456789abcdef")},
			want: bpf.Event{Type: bpf.EventResync, FD: -1, GPU: -1, Comm: "0123456789abcdef"},
		},
		{
			name: "comm stops at the first NUL",
			raw:  rawEvent{Type: 2, Comm: [16]byte{'a', 'b', 0, 'c', 'd'}},
			want: bpf.Event{Type: bpf.EventClose, Comm: "ab"},
		},
		{
			name: "bytes above 127 in comm",
			raw:  rawEvent{Type: 5, Comm: comm("héllo\xff")},
			want: bpf.Event{Type: bpf.EventExit, Comm: "héllo\xff"},
		},
		{
			name: "extreme values",
			raw: rawEvent{Ts: ^uint64(0), CgroupID: ^uint64(0), Type: 4, PID: ^uint32(0), TGID: ^uint32(0),
				PPID: ^uint32(0), FD: -2147483648, GPU: 2147483647},
			want: bpf.Event{Type: bpf.EventExec, Mono: ^uint64(0), CgroupID: ^uint64(0), PID: ^uint32(0),
				TGID: ^uint32(0), PPID: ^uint32(0), FD: -2147483648, GPU: 2147483647},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ev bpf.Event
			if err := bpf.DecodeEvent(encode(tc.raw), &ev); err != nil {
				t.Fatal(err)
			}
			if ev != tc.want {
				t.Errorf("DecodeEvent =\n%+v\nwant\n%+v", ev, tc.want)
			}
			// The ring buffer does not pad records: trailing bytes mean
			// another layout, refused.
			ev = bpf.Event{}
			if err := bpf.DecodeEvent(append(encode(tc.raw), 0xde, 0xad, 0xbe, 0xef), &ev); !errors.Is(err, bpf.ErrBadEvent) || ev != (bpf.Event{}) {
				t.Errorf("with trailing bytes: %+v, %v, want ErrBadEvent", ev, err)
			}
		})
	}
}

func TestDecodeEventRejects(t *testing.T) {
	good := encode(rawEvent{Type: 1, Comm: comm("x")})
	for _, tc := range []struct {
		name string
		raw  []byte
		want error
	}{
		{"empty", nil, bpf.ErrShortEvent},
		{"one byte short", good[:55], bpf.ErrShortEvent},
		{"header only", good[:16], bpf.ErrShortEvent},
		{"one byte long", append(append([]byte(nil), good...), 0), bpf.ErrBadEvent},
		{"two records", append(append([]byte(nil), good...), good...), bpf.ErrBadEvent},
		{"type 0", encode(rawEvent{Type: 0}), bpf.ErrBadEvent},
		{"type 10", encode(rawEvent{Type: 10}), bpf.ErrBadEvent},
		{"type max", encode(rawEvent{Type: ^uint32(0)}), bpf.ErrBadEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := bpf.Event{Comm: "untouched"}
			err := bpf.DecodeEvent(tc.raw, &ev)
			if !errors.Is(err, tc.want) {
				t.Errorf("DecodeEvent err = %v, want %v", err, tc.want)
			}
			other := bpf.ErrBadEvent
			if tc.want == bpf.ErrBadEvent {
				other = bpf.ErrShortEvent
			}
			if errors.Is(err, other) {
				t.Errorf("DecodeEvent err = %v is also %v", err, other)
			}
			if ev != (bpf.Event{Comm: "untouched"}) {
				t.Errorf("event written on error: %+v", ev)
			}
		})
	}
}

func TestEventTypeString(t *testing.T) {
	for typ, want := range map[bpf.EventType]string{
		bpf.EventOpen: "open", bpf.EventClose: "close", bpf.EventFork: "fork", bpf.EventExec: "exec",
		bpf.EventExit: "exit", bpf.EventResync: "resync", bpf.EventGateHigh: "gate-high", bpf.EventDeny: "deny", bpf.EventRelease: "release", 0: "EventType(0)", 10: "EventType(10)",
	} {
		if got := typ.String(); got != want {
			t.Errorf("EventType(%d).String() = %q, want %q", uint32(typ), got, want)
		}
	}
}
