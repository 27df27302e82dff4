package bpf_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gpud/gpud/bpf"
)

// FuzzDecodeEvent: any byte string either decodes to an event whose every
// field lies in its domain and re-encodes to the same 56 bytes, or is
// refused with ErrShortEvent (under 56 bytes) or ErrBadEvent (over 56, or
// an unknown type), leaving the event untouched. Never a panic.
func FuzzDecodeEvent(f *testing.F) {
	// Valid records, one of each type, with edge values.
	f.Add(encode(rawEvent{Ts: 1, CgroupID: 2, Type: 1, PID: 3, TGID: 3, FD: 4, GPU: 0, Comm: comm("python3")}))
	f.Add(encode(rawEvent{Ts: 9, Type: 2, PID: 7, TGID: 7, FD: 3, GPU: 7, Comm: comm("nvidia-smi")}))
	f.Add(encode(rawEvent{Type: 3, PID: 5, TGID: 5, PPID: 4, FD: -1, GPU: -1, Comm: comm("bash")}))
	f.Add(encode(rawEvent{Type: 4, FD: -1, GPU: -1, Comm: comm("exec'd")}))
	f.Add(encode(rawEvent{Type: 5, PID: ^uint32(0), TGID: ^uint32(0), FD: -1, GPU: -1}))
	f.Add(encode(rawEvent{Type: 6, FD: -1, GPU: -1, Comm: comm("0123456789abcdef")}))
	f.Add(encode(rawEvent{Type: 7, CgroupID: ^uint64(0), FD: -1, GPU: 2147483647, Comm: comm("trainer")}))
	f.Add(encode(rawEvent{Type: 8, FD: -2147483648, GPU: 0, Comm: [16]byte{'a', 0, 'b'}}))
	// Near misses: unknown types, one byte short or long, empty, two records.
	f.Add(encode(rawEvent{Type: 0}))
	f.Add(encode(rawEvent{Type: 9}))
	f.Add(encode(rawEvent{Type: ^uint32(0)}))
	good := encode(rawEvent{Type: 1, Comm: comm("x")})
	f.Add(good[:55])
	f.Add(append(append([]byte(nil), good...), 0))
	f.Add(append(append([]byte(nil), good...), good...))
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, raw []byte) {
		orig := append([]byte(nil), raw...)
		ev := bpf.Event{Comm: "untouched"}
		err := bpf.DecodeEvent(raw, &ev)
		if !bytes.Equal(raw, orig) {
			t.Fatal("DecodeEvent modified its input")
		}
		if err != nil {
			short, bad := errors.Is(err, bpf.ErrShortEvent), errors.Is(err, bpf.ErrBadEvent)
			if short == bad {
				t.Fatalf("error %v: want exactly one of ErrShortEvent, ErrBadEvent", err)
			}
			if short != (len(raw) < bpf.EventSize) {
				t.Fatalf("%d bytes: err %v", len(raw), err)
			}
			if ev != (bpf.Event{Comm: "untouched"}) {
				t.Fatalf("event written on error: %+v", ev)
			}
			if len(raw) == bpf.EventSize {
				typ := bpf.EventType(binary.NativeEndian.Uint32(raw[16:]))
				if typ >= bpf.EventOpen && typ <= bpf.EventRelease {
					t.Fatalf("a 56-byte record of known type %v refused: %v", typ, err)
				}
			}
			return
		}
		if len(raw) != bpf.EventSize {
			t.Fatalf("decoded a %d-byte record", len(raw))
		}
		if ev.Type < bpf.EventOpen || ev.Type > bpf.EventRelease {
			t.Fatalf("decoded type %d", ev.Type)
		}
		if s := ev.Type.String(); s == "" || s[0] == 'E' {
			t.Fatalf("type %d has no name: %q", ev.Type, s)
		}
		if len(ev.Comm) > 16 || bytes.IndexByte([]byte(ev.Comm), 0) >= 0 {
			t.Fatalf("comm %q", ev.Comm)
		}
		if len(ev.Comm) < 16 && raw[40+len(ev.Comm)] != 0 {
			t.Fatalf("comm %q does not end at a NUL", ev.Comm)
		}
		// Re-encoding gives the same record, up to the comm's NUL.
		r := rawEvent{Ts: ev.Mono, CgroupID: ev.CgroupID, Type: uint32(ev.Type), PID: ev.PID, TGID: ev.TGID,
			PPID: ev.PPID, FD: ev.FD, GPU: ev.GPU, Comm: comm(ev.Comm)}
		got := encode(r)
		if !bytes.Equal(got[:40], raw[:40]) || !bytes.Equal(got[40:40+len(ev.Comm)], raw[40:40+len(ev.Comm)]) {
			t.Fatalf("re-encoded\n%x\nfrom\n%x", got, raw)
		}
		// And decoding the re-encoded record gives the same event.
		var again bpf.Event
		if err := bpf.DecodeEvent(got, &again); err != nil || again != ev {
			t.Fatalf("re-decoded %+v, %v; want %+v", again, err, ev)
		}
	})
}
