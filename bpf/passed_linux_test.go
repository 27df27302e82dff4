package bpf_test

import (
	"errors"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/gpud/gpud/bpf"
	"github.com/gpud/gpud/internal/cgroups"
	"github.com/gpud/gpud/internal/testutil"
	"golang.org/x/sys/unix"
)

// recvmmsgFD receives one message with recvmmsg(2) (x/sys/unix has no
// wrapper) and returns the first fd it carried.
func recvmmsgFD(sock int) (int, error) {
	buf := make([]byte, 16)
	oob := make([]byte, unix.CmsgSpace(4*4))
	iov := unix.Iovec{Base: &buf[0]}
	iov.SetLen(len(buf))
	var m unix.Mmsghdr
	m.Hdr.Iov = &iov
	m.Hdr.SetIovlen(1)
	m.Hdr.Control = &oob[0]
	m.Hdr.SetControllen(len(oob))
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(sock), uintptr(unsafe.Pointer(&m)), 1, 0, 0, 0)
	if errno != 0 {
		return -1, errno
	}
	if n != 1 {
		return -1, errors.New("recvmmsg: no message")
	}
	return firstRight(oob[:m.Hdr.Controllen])
}

func recvmsgFD(sock int) (int, error) {
	buf := make([]byte, 16)
	oob := make([]byte, unix.CmsgSpace(4*4))
	_, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, 0)
	if err != nil {
		return -1, err
	}
	return firstRight(oob[:oobn])
}

func firstRight(oob []byte) (int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1, err
	}
	for _, msg := range msgs {
		if fds, err := unix.ParseUnixRights(&msg); err == nil && len(fds) > 0 {
			return fds[0], nil
		}
	}
	return -1, errors.New("no SCM_RIGHTS")
}

// nextResync waits for an EV_RESYNC of this process, skipping its other
// events (the GPU open's).
func nextResync(t *testing.T, m *bpf.Monitor, within time.Duration) (bpf.Event, bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ev, ok := nextEvent(t, m, time.Until(deadline))
		if !ok || ev.Type == bpf.EventResync {
			return ev, ok
		}
	}
}

// A GPU fd passed by SCM_RIGHTS is reported at its receipt (EV_RESYNC of
// the receiver), with recvmsg and recvmmsg alike, by a receiver that was
// already waiting when the fd was sent: by the sock tracepoints (driver
// mode without the receive_fd kprobe, and syscalls mode where the kernel
// has them) or by sys_exit (syscalls mode without them). A holder's message
// without fds is not reported. Where nothing can report it (driver mode
// on a kernel without kprobes and without the sock tracepoints), the
// hooks say the sweep is the bound.
func TestPassedFDsReported(t *testing.T) {
	testutil.RequireRoot(t)
	root, _, err := cgroups.V2Root()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		opts   bpf.Options
		noSock bool
	}{
		{"driver", bpf.Options{Hooks: bpf.HooksDriver, Driver: bpf.DriverSymbols{Receive: []string{"gpud_no_such_receive"}}}, false},
		{"syscalls", bpf.Options{Hooks: bpf.HooksSyscalls}, false},
		{"syscalls without sock tracepoints", bpf.Options{Hooks: bpf.HooksSyscalls}, true},
		{"driver without sock tracepoints", bpf.Options{Hooks: bpf.HooksDriver, Driver: bpf.DriverSymbols{Receive: []string{"gpud_no_such_receive"}}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.noSock {
				bpf.RefuseSock(t, errors.New("pretended by the test"))
			}
			_, gpus := testutil.MakeFakeGPUs(t, 1)
			opts := c.opts
			opts.CgroupRoot = root
			m, err := bpf.Load(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			dev, _ := bpf.KernelDev(gpus[0].Major, gpus[0].Minor)
			if err := m.SetGPUs(map[uint32]uint32{dev: 0}); err != nil {
				t.Fatal(err)
			}
			st := m.Hooks()
			t.Logf("passed fds: %s; attached %v; missing %v", st.PassedFDs, st.Attached, st.Missing)
			if st.PassedFDs == bpf.PassedBySweep {
				if opts.Hooks != bpf.HooksDriver || !missingHas(st, "passed fds (") {
					t.Fatalf("hooks = %+v: the sweep as the bound, without saying why", st)
				}
				return // nothing to report them: the daemon's sweep does
			}
			want := bpf.PassedBySock
			if opts.Hooks == bpf.HooksSyscalls && c.noSock {
				want = bpf.PassedBySyscalls
			}
			if st.PassedFDs != want {
				if want == bpf.PassedBySock && missingHas(st, "passed fds (") {
					// A kernel before 6.3 (the kernel matrix's 5.10, 6.1).
					t.Logf("no sock tracepoints on this kernel: %v", st.Missing)
					return
				}
				t.Fatalf("passed fds = %q, want %q", st.PassedFDs, want)
			}

			gpu, err := os.OpenFile(gpus[0].Path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer gpu.Close()
			// This process holds a GPU (whatever reported its open).
			if err := m.WatchProcess(uint32(os.Getpid())); err != nil {
				t.Fatal(err)
			}
			drain(m)

			for _, recv := range []struct {
				name string
				f    func(int) (int, error)
			}{{"recvmsg", recvmsgFD}, {"recvmmsg", recvmmsgFD}} {
				pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				got := make(chan error, 1)
				go func() {
					fd, err := recv.f(pair[1])
					if err == nil {
						unix.Close(fd)
					}
					got <- err
				}()
				time.Sleep(100 * time.Millisecond) // the receiver waits inside the syscall

				// A message without fds first: nothing to report.
				if err := unix.Sendmsg(pair[0], []byte{'x'}, nil, nil, 0); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
				if ev, ok := nextResync(t, m, 200*time.Millisecond); ok {
					t.Errorf("%s: a message without fds reported: %+v", recv.name, ev)
				}
				go func() {
					// The next receive, again waiting before the send.
					fd, err := recv.f(pair[1])
					if err == nil {
						unix.Close(fd)
					}
					got <- err
				}()
				if err := <-got; err == nil {
					t.Fatalf("%s: fds in a message that had none", recv.name)
				}
				time.Sleep(100 * time.Millisecond)
				sent := time.Now()
				if err := unix.Sendmsg(pair[0], []byte{'y'}, unix.UnixRights(int(gpu.Fd())), nil, 0); err != nil {
					t.Fatal(err)
				}
				ev, ok := nextResync(t, m, 2*time.Second)
				if !ok {
					t.Fatalf("%s: no event for the received GPU fd", recv.name)
				}
				if err := <-got; err != nil {
					t.Fatalf("%s: %v", recv.name, err)
				}
				t.Logf("%s: EV_RESYNC of the receiver %v after the send", recv.name, time.Since(sent))
				if ev.TGID != uint32(os.Getpid()) {
					t.Errorf("%s: event %+v, want the receiver %d", recv.name, ev, os.Getpid())
				}
				unix.Close(pair[0])
				unix.Close(pair[1])
			}
		})
	}
}

// drain reads what is queued.
func drain(m *bpf.Monitor) {
	var rec ringbuf.Record
	var ev bpf.Event
	m.SetDeadline(time.Now().Add(50 * time.Millisecond))
	for m.ReadEvent(&rec, &ev) == nil {
	}
}
