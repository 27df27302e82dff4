package bpf

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// ErrClosed is returned by ReadEvent after Close.
var ErrClosed = errors.New("bpf: monitor closed")

// Options configure Load.
type Options struct {
	// CgroupRoot is the cgroup v2 mount point the gate is attached to.
	CgroupRoot string
	// RingBytes overrides the ring buffer size (a power of two multiple of
	// the page size); 0 keeps the compiled-in 4 MiB.
	RingBytes uint32
	// PinDir, on a bpffs, keeps the gate's cgroup link pinned so that it
	// outlives this process: the gate keeps enforcing while gpud restarts
	// (until its heartbeat is older than the fail-open delay). A later Load
	// with the same PinDir finds the link and, at TakeOver, replaces the
	// program on it: never a second program stacked on the cgroup. "" pins
	// nothing (the gate goes with the process).
	PinDir string
	// Hooks picks how GPU file descriptors are observed: HooksSyscalls (""
	// is the same) or HooksDriver.
	Hooks string
	// Driver names the kernel functions HooksDriver puts kprobes on; empty
	// lists take DefaultDriverSymbols' (NVIDIA's).
	Driver DriverSymbols
}

// GatePin is the pinned cgroup link's name under Options.PinDir.
const GatePin = "gate"

// ErrNotBPFFS is returned when a pin directory is not on a bpf filesystem.
var ErrNotBPFFS = errors.New("bpf: pin directory is not on a bpf filesystem")

// coreObjects are every map and global variable, created once in one
// collection (with no program): each program is loaded apart on them
// (MapReplacements), so that a kernel refusing one program still runs the
// others. Without the maps gpud cannot run at all.
type coreObjects struct {
	gpudMaps
	gpudVariables
}

func (o *coreObjects) Close() error { return o.gpudMaps.Close() }

// ErrNoMkdirHook is returned by ExpectCgroup when the cgroup-creation
// programs are not running (MkdirHook says why).
var ErrNoMkdirHook = errors.New("bpf: cgroup creation is not observed")

// lifecycle are the process lifecycle tracepoints by program name, each
// loaded and attached on its own. Without one, what it reports is found at
// the next /proc reconciliation (Hooks says which is missing).
var lifecycle = []struct{ prog, tp string }{
	{"on_fork", "tp_btf/sched_process_fork"},
	{"on_exec", "tp_btf/sched_process_exec"},
	{"on_exit", "tp_btf/sched_process_exit"},
}

// Monitor is the set of loaded and attached programs.
type Monitor struct {
	objs coreObjects
	// maps are every map of the core by name (the global variables'
	// .data/.bss included), for the programs loaded apart.
	maps map[string]*ebpf.Map
	// sections holds the core's maps not assigned to objs (.data, .bss).
	sections *ebpf.Collection
	// progs are the programs loaded, by name.
	progs map[string]*ebpf.Program

	// gateErr is why the gate is not loaded (nil when it is): gpud then
	// runs observe-only, the rules applied after the fact.
	gateErr error
	// lifeErr is why a lifecycle tracepoint is not attached, by program.
	lifeErr map[string]error

	hooks   string
	symbols DriverSymbols
	hmu     sync.Mutex
	probes  map[string]link.Link // kprobe links by role:symbol
	// probeMod is the module each kprobe's symbol was in when attached
	// (absent for a symbol of the kernel proper): a kprobe on a module's
	// function stops firing for good when the module is unloaded, and a
	// reloaded module needs a new one.
	probeMod map[string]module
	// probeGone is the module of each kprobe dropped with its module, until
	// that module is loaded again and the kprobe tried once more.
	probeGone map[string]string
	// probeErr is why a role:symbol is not attached (its last try).
	probeErr map[string]error
	drvErr   error // why the driver programs are not loaded
	// mkdirErr is why the cgroup-creation programs are not attached (nil
	// when they are).
	mkdirErr error
	// sockHooks are the sock tracepoints attached to report fds passed by
	// SCM_RIGHTS (none where the receive_fd kprobe does it); sockErr is
	// why they are not, where they were wanted.
	sockHooks []string
	sockErr   error
	links     []link.Link // observers
	rd        *ringbuf.Reader

	gate     link.Link // the cgroup/dev link (pinned under pinDir when set)
	pinDir   string
	adopted  bool // gate is a previous gpud's pinned link, still running its program
	keepGate bool // Close leaves the pinned gate attached

	gmu       sync.Mutex
	devOf     map[uint32]uint32 // GPU index → kernel dev_t
	slotOf    map[uint32]uint32 // GPU index → its slot in the per-GPU arrays
	tracked   map[uint32]bool   // GPU index → tracked with all its entries
	protected map[uint32]bool   // ... and its last policy update went through
}

// refuseGate, when set (by tests), is taken for the kernel's refusal of
// the gate: the gate-less path runs on a kernel that has everything.
var refuseGate error

// refuseSock, when set (by tests), is taken for a kernel without the sock
// tracepoints (before 6.3): the fallbacks run on a kernel that has them.
var refuseSock error

// Load loads gpud's programs into the kernel and attaches them: the
// cgroup/dev gate at opts.CgroupRoot, the fork/exec/exit tracepoints and,
// by opts.Hooks, the sys_enter/sys_exit observers (HooksSyscalls) or the
// driver kprobes (HooksDriver: each attached where its symbol exists).
// Every program is loaded apart on the core's maps. Only the maps, the
// ring buffer and HooksSyscalls' pair are needed: a gate the kernel
// refuses leaves gpud observe-only (GateErr), and a missing lifecycle,
// cgroup_mkdir or driver hook is reported by Hooks and MkdirHook, never
// an error.
// Nothing is reported until SetGPUs names the GPU device numbers.
func Load(opts Options) (*Monitor, error) {
	if opts.CgroupRoot == "" {
		return nil, errors.New("bpf: no cgroup v2 root given")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("bpf: removing memlock limit: %w", err)
	}
	spec, err := loadGpud()
	if err != nil {
		return nil, fmt.Errorf("bpf: reading compiled programs: %w", err)
	}
	if opts.RingBytes != 0 {
		spec.Maps["events"].MaxEntries = opts.RingBytes
	}
	m := &Monitor{hooks: opts.Hooks, symbols: opts.Driver.orDefault(), probes: map[string]link.Link{}, probeMod: map[string]module{}, probeGone: map[string]string{}, probeErr: map[string]error{},
		progs: map[string]*ebpf.Program{}, lifeErr: map[string]error{}}
	switch m.hooks {
	case "":
		m.hooks = HooksSyscalls
	case HooksDriver, HooksSyscalls:
	default:
		return nil, fmt.Errorf("bpf: unknown hooks %q: want %s or %s", opts.Hooks, HooksDriver, HooksSyscalls)
	}
	if err := m.loadCore(spec); err != nil {
		m.Close()
		return nil, err
	}
	m.pinDir = opts.PinDir
	if err := m.attach(spec, opts.CgroupRoot); err != nil {
		m.Close()
		return nil, err
	}
	m.rd, err = ringbuf.NewReader(m.objs.Events)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("bpf: opening ring buffer: %w", err)
	}
	m.mkdirErr = m.attachMkdir(spec)
	if m.hooks == HooksDriver {
		if err := m.objs.ReportOpens.Set(uint32(1)); err != nil {
			m.Close()
			return nil, fmt.Errorf("bpf: turning on the gate's open reports: %w", err)
		}
		m.drvErr = m.loadDriver(spec)
		m.AttachDriver()
	}
	// Passed fds: the receive_fd kprobe sees every route (SCM_RIGHTS,
	// pidfd_getfd, seccomp addfd); without it, the sock tracepoints see
	// SCM_RIGHTS, io_uring's receives included, at no cost to other
	// syscalls (sys_exit sees recvmsg and recvmmsg, but not io_uring).
	if !m.receiveHooked() {
		m.sockErr = m.attachSock(spec)
	}
	return m, nil
}

// sockSenders are the tracepoints that see a holder queue fds on a unix
// socket, best first: sk_data_ready runs before the receiver is
// woken; sock_send_length (6.3+) after the send, for connected sockets.
var sockSenders = []struct{ prog, tp string }{
	{"on_sk_data_ready", "tp_btf/sk_data_ready"},
	{"on_sock_send", "tp_btf/sock_send_length"},
}

// attachSock loads and attaches the sock tracepoints that report fds
// passed by SCM_RIGHTS: a sender and the receive. Each is loaded apart, and
// a kernel without them (before 6.3) keeps everything else.
func (m *Monitor) attachSock(spec *ebpf.CollectionSpec) error {
	if refuseSock != nil {
		return fmt.Errorf("bpf: the sock tracepoints: %w", refuseSock)
	}
	var errs []error
	var sender link.Link
	var senderTP string
	for _, s := range sockSenders {
		l, err := m.attachTracing(spec, s.prog)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sender, senderTP = l, s.tp
		break
	}
	if sender == nil {
		return fmt.Errorf("bpf: the sock tracepoints: %w", errors.Join(errs...))
	}
	recv, err := m.attachTracing(spec, "on_sock_recv")
	if err != nil {
		sender.Close()
		return fmt.Errorf("bpf: the sock tracepoints: %w", err)
	}
	// sys_exit (--hooks syscalls) leaves received fds to them from now on.
	if err := m.objs.SockHooks.Set(uint32(1)); err != nil {
		sender.Close()
		recv.Close()
		return fmt.Errorf("bpf: turning the sock tracepoints on: %w", err)
	}
	m.links = append(m.links, sender, recv)
	m.sockHooks = []string{senderTP, "tp_btf/sock_recv_length"}
	return nil
}

// attachTracing loads the tp_btf program prog apart and attaches it.
func (m *Monitor) attachTracing(spec *ebpf.CollectionSpec, prog string) (link.Link, error) {
	if err := m.loadApart(spec, prog); err != nil {
		return nil, err
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: m.progs[prog]})
	if err != nil {
		return nil, fmt.Errorf("attaching %s: %w", prog, err)
	}
	return l, nil
}

// receiveHooked reports whether a receive_fd kprobe is attached.
func (m *Monitor) receiveHooked() bool {
	m.hmu.Lock()
	defer m.hmu.Unlock()
	for _, sym := range m.symbols.Receive {
		if m.probes[RoleReceive+":"+sym] != nil {
			return true
		}
	}
	return false
}

// loadCore creates the maps and the global variables.
func (m *Monitor) loadCore(spec *ebpf.CollectionSpec) error {
	cs := spec.Copy()
	cs.Programs = map[string]*ebpf.ProgramSpec{}
	coll, err := ebpf.NewCollection(cs)
	if err != nil {
		return fmt.Errorf("bpf: creating the maps: %w", err)
	}
	m.sections = coll
	m.maps = maps.Clone(coll.Maps)
	if err := coll.Assign(&m.objs); err != nil {
		return fmt.Errorf("bpf: creating the maps: %w", err)
	}
	return nil
}

// loadApart loads the named programs on the core's maps (in one verifier
// pass: all or none). They are m's from then on (Close closes them).
func (m *Monitor) loadApart(spec *ebpf.CollectionSpec, names ...string) error {
	cs := spec.Copy()
	for name := range cs.Programs {
		if !slices.Contains(names, name) {
			delete(cs.Programs, name)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(cs, ebpf.CollectionOptions{MapReplacements: m.maps})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			// The verifier's whole log is for a human reading a bug report;
			// its last line (the reason) is in the error's message.
			return fmt.Errorf("loading %s: %w", strings.Join(names, ", "), ve)
		}
		return fmt.Errorf("loading %s: %w", strings.Join(names, ", "), err)
	}
	defer coll.Close()
	for _, name := range names {
		m.progs[name] = coll.DetachProgram(name)
	}
	return nil
}

// loadDriver loads the driver kprobes on the core's maps (attached by
// AttachDriver).
func (m *Monitor) loadDriver(spec *ebpf.CollectionSpec) error {
	if err := m.loadApart(spec, "on_driver_release", "on_receive_fd"); err != nil {
		return fmt.Errorf("bpf: the driver hooks: %w", err)
	}
	return nil
}

// AttachDriver attaches the driver kprobes to every configured symbol the
// kernel has now and that is not hooked yet (the driver module may load
// after gpud: call it again later). A kprobe whose module was unloaded
// since it was attached is dropped first, and attached again if the module
// is back (a driver upgrade reloads nvidia.ko). It reports whether
// anything was attached or dropped.
func (m *Monitor) AttachDriver() bool {
	if m.hooks != HooksDriver || m.drvErr != nil {
		return false
	}
	m.hmu.Lock()
	defer m.hmu.Unlock()
	changed := m.dropUnloadedLocked()
	// Without the kprobe PMU (CONFIG_KPROBES off) every try would fail the
	// same way, after a detour through tracefs.
	_, pmuErr := os.Stat("/sys/bus/event_source/devices/kprobe/type")
	var attached []string
	for _, r := range []struct {
		role string
		syms []string
		prog *ebpf.Program
	}{
		{RoleRelease, m.symbols.Release, m.progs["on_driver_release"]},
		{RoleReceive, m.symbols.Receive, m.progs["on_receive_fd"]},
	} {
		for _, sym := range r.syms {
			key := r.role + ":" + sym
			if m.probes[key] != nil {
				continue
			}
			if pmuErr != nil {
				m.probeErr[key] = ErrNoKprobes
				continue
			}
			l, err := link.Kprobe(sym, r.prog, nil)
			if err != nil {
				if prev := m.probeErr[key]; prev == nil || !errors.Is(prev, ErrModuleUnloaded) {
					m.probeErr[key] = err // not in this kernel (yet): Hooks says so
				}
				continue
			}
			delete(m.probeErr, key)
			m.probes[key] = l
			attached = append(attached, key)
		}
	}
	// A module that came back has had its try: from now on its symbols
	// wait for the periodic retry like any other missing one.
	for key, name := range m.probeGone {
		if _, err := moduleNow(sysModulePath, name); err == nil {
			delete(m.probeGone, key)
		}
	}
	if len(attached) > 0 {
		mods := symbolModules(kallsymsPath, attached)
		for _, key := range attached {
			if name, ok := mods[key]; ok {
				if mod, err := moduleNow(sysModulePath, name); err == nil {
					m.probeMod[key] = mod
				}
			}
		}
	}
	return changed || len(attached) > 0
}

// DriverModulesChanged reports whether a module that a driver kprobe was
// attached in has been unloaded (or unloaded and loaded again) since, or
// whether such a module, unloaded, is back: one lstat per such module,
// cheap enough for every tick. AttachDriver then drops the dead kprobes
// and attaches them again where the module is back.
func (m *Monitor) DriverModulesChanged() bool {
	m.hmu.Lock()
	defer m.hmu.Unlock()
	for _, mod := range m.probeMod {
		if !mod.stillLoaded() {
			return true
		}
	}
	for _, name := range m.probeGone {
		if _, err := moduleNow(sysModulePath, name); err == nil {
			return true
		}
	}
	return false
}

// dropUnloadedLocked closes the kprobes whose module is gone or is
// another load of it now (their kprobe is gone from the kernel).
func (m *Monitor) dropUnloadedLocked() bool {
	dropped := false
	for key, mod := range m.probeMod {
		if mod.stillLoaded() {
			continue
		}
		if l := m.probes[key]; l != nil {
			l.Close()
		}
		delete(m.probes, key)
		delete(m.probeMod, key)
		m.probeGone[key] = mod.name
		m.probeErr[key] = fmt.Errorf("%w: %s", ErrModuleUnloaded, mod.name)
		dropped = true
	}
	return dropped
}

// ErrNoKprobes: the kernel offers no kprobes (no kprobe PMU: CONFIG_KPROBES
// off), so the driver's release and receive_fd cannot be hooked.
var ErrNoKprobes = errors.New("the kernel has no kprobes (no kprobe PMU in /sys/bus/event_source/devices)")

// How soon a GPU fd passed into a process by SCM_RIGHTS is seen
// (HookStatus.PassedFDs): at receipt, by which hook, or only at gpud's
// periodic /proc sweep (the daemon says its interval).
const (
	PassedByKprobe   = "receive_fd kprobe: at receipt"
	PassedBySock     = "sock tracepoints: at receipt"
	PassedBySyscalls = "syscall tracepoints: at receipt (recvmsg, recvmmsg; io_uring's receives at the sweep)"
	PassedBySweep    = "sweep only"
)

// HookStatus says how GPU file descriptors are observed.
type HookStatus struct {
	// PassedFDs is the bound that holds for a GPU fd passed by
	// SCM_RIGHTS: one of the Passed* constants.
	PassedFDs string
	// Mode is HooksDriver or HooksSyscalls.
	Mode string
	// Attached are the hooks running, as "role:symbol" for kprobes
	// (driver) and program names otherwise.
	Attached []string
	// Missing says what is not running and why: each driver role with
	// none of its symbols hooked (which were looked for), each lifecycle
	// tracepoint not attached, and, on a kernel that refuses the gate,
	// "gate (observe-only: ...)" in either mode and, in HooksDriver,
	// "opens (...)" (the gate is what reports them there).
	Missing []string
	// Complete: every change of a GPU fd is reported by an event. In
	// HooksDriver, the gate and the release and receive roles must be
	// there for that; without them, opens, last closes and passed fds are
	// found by re-reading the holders' fd tables (Options' caller does it
	// periodically) and by the full reconciliation.
	Complete bool
	// Err is why the driver programs could not be loaded at all.
	Err error
	// Gate is why the gate is not loaded (GateErr): nil when it is.
	Gate error
}

// Hooks reports the observation mode and what is attached.
func (m *Monitor) Hooks() (st HookStatus) {
	st = HookStatus{Mode: m.hooks, Err: m.drvErr, Gate: m.gateErr, Complete: true}
	switch {
	case m.hooks == HooksDriver && m.receiveHooked():
		st.PassedFDs = PassedByKprobe
	case len(m.sockHooks) > 0:
		st.PassedFDs = PassedBySock
	case m.hooks == HooksSyscalls:
		st.PassedFDs = PassedBySyscalls
	default:
		st.PassedFDs = PassedBySweep
	}
	st.Attached = append(st.Attached, m.sockHooks...)
	if m.sockErr != nil {
		st.Missing = append(st.Missing, "passed fds ("+m.sockErr.Error()+")")
	}
	var life []string
	for _, l := range lifecycle {
		if err := m.lifeErr[l.prog]; err != nil {
			life = append(life, l.tp+" ("+err.Error()+")")
			st.Complete = false
			continue
		}
		st.Attached = append(st.Attached, l.tp)
	}
	defer func() {
		if m.gateErr != nil {
			st.Missing = append(st.Missing, "gate (observe-only: "+m.gateErr.Error()+")")
		}
		st.Missing = append(st.Missing, life...)
	}()
	if m.hooks == HooksSyscalls {
		// sys_exit checks every new fd itself where the gate is refused
		// (check_opens): opens are still reported as they happen.
		st.Attached = append(st.Attached, "tp_btf/sys_enter", "tp_btf/sys_exit")
		return st
	}
	m.hmu.Lock()
	defer m.hmu.Unlock()
	st.Complete = st.Complete && m.drvErr == nil
	for _, r := range []struct {
		role string
		syms []string
	}{{RoleRelease, m.symbols.Release}, {RoleReceive, m.symbols.Receive}} {
		found := false
		for _, sym := range r.syms {
			if m.probes[r.role+":"+sym] != nil {
				st.Attached = append(st.Attached, "kprobe/"+r.role+":"+sym)
				found = true
			}
		}
		if !found {
			var why []string
			for _, sym := range r.syms {
				if err := m.probeErr[r.role+":"+sym]; err != nil {
					why = append(why, sym+": "+err.Error())
				} else {
					why = append(why, sym)
				}
			}
			st.Missing = append(st.Missing, r.role+" ("+strings.Join(why, "; ")+")")
			st.Complete = false
		}
	}
	if m.gateErr != nil {
		// In driver mode the gate is what reports opens: without it they
		// are found only by gpud's /proc rescans.
		st.Missing = append(st.Missing, "opens ("+m.gateErr.Error()+"; found by re-reading /proc: --hooks syscalls sees them as they happen)")
		st.Complete = false
	}
	return st
}

// GateErr is why the gate is not loaded: nil when it is. Without it gpud
// runs observe-only (no open is refused; Protected is false for every
// GPU), and the rules are applied after the fact.
func (m *Monitor) GateErr() error { return m.gateErr }

// attachMkdir loads and attaches the cgroup-creation programs on the maps
// already loaded. Its error is kept, not returned: without them, a class
// learnt before its cgroup exists is applied when user space finds the
// cgroup, and the after-the-fact rule judges any open before that.
func (m *Monitor) attachMkdir(spec *ebpf.CollectionSpec) error {
	if err := m.loadApart(spec, "on_cgroup_mkdir", "on_cgroup_rmdir"); err != nil {
		return fmt.Errorf("bpf: the cgroup_mkdir programs: %w", err)
	}
	for _, name := range []string{"on_cgroup_mkdir", "on_cgroup_rmdir"} {
		l, err := link.AttachTracing(link.TracingOptions{Program: m.progs[name]})
		if err != nil {
			return fmt.Errorf("bpf: attaching %s: %w", name, err)
		}
		m.links = append(m.links, l)
	}
	return nil
}

// MkdirHook reports whether cgroups are classified as they are created:
// nil when they are, else why not.
func (m *Monitor) MkdirHook() error { return m.mkdirErr }

// attach loads and attaches the observers and the gate, each apart. The
// gate's refusal is kept (GateErr), as is a lifecycle tracepoint's; the
// syscall observers of HooksSyscalls are the mode itself: their failure is
// Load's.
func (m *Monitor) attach(spec *ebpf.CollectionSpec, cgroupRoot string) error {
	switch {
	case refuseGate != nil:
		m.gateErr = fmt.Errorf("the kernel refuses the gate: %w", refuseGate)
	default:
		if err := m.loadApart(spec, "gpud_gate"); err != nil {
			m.gateErr = fmt.Errorf("the kernel refuses the gate: %w", err)
		}
	}
	if m.hooks == HooksSyscalls {
		if m.gateErr != nil {
			// Nothing marks GPU opens for sys_exit: it checks each new fd
			// (set before it attaches, so no open goes unseen).
			if err := m.objs.CheckOpens.Set(uint32(1)); err != nil {
				return fmt.Errorf("bpf: turning on the open checks at sys_exit: %w", err)
			}
		}
		if err := m.loadApart(spec, "on_sys_enter", "on_sys_exit"); err != nil {
			return fmt.Errorf("bpf: the syscall observers: %w", err)
		}
		for _, name := range []string{"on_sys_enter", "on_sys_exit"} {
			l, err := link.AttachTracing(link.TracingOptions{Program: m.progs[name]})
			if err != nil {
				return fmt.Errorf("bpf: attaching %s: %w", name, err)
			}
			m.links = append(m.links, l)
		}
	}
	for _, l := range lifecycle {
		if err := m.loadApart(spec, l.prog); err != nil {
			m.lifeErr[l.prog] = err
			continue
		}
		lk, err := link.AttachTracing(link.TracingOptions{Program: m.progs[l.prog]})
		if err != nil {
			m.lifeErr[l.prog] = fmt.Errorf("attaching %s: %w", l.prog, err)
			continue
		}
		m.links = append(m.links, lk)
	}
	if m.gateErr != nil {
		return nil
	}
	if m.pinDir != "" {
		if err := ensureBPFFS(m.pinDir); err != nil {
			return err
		}
		path := filepath.Join(m.pinDir, GatePin)
		old, err := link.LoadPinnedLink(path, nil)
		switch {
		case err == nil && isDeviceCgroupLink(old):
			// A previous gpud's gate: it goes on enforcing with its own
			// maps until TakeOver puts this program on the same link.
			m.gate, m.adopted = old, true
			return nil
		case err == nil:
			old.Close()
			fallthrough
		case !errors.Is(err, os.ErrNotExist):
			// Not a gate link (or unreadable): not ours to keep.
			if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				return fmt.Errorf("bpf: removing unusable pin %s: %w", path, rerr)
			}
		}
	}
	l, err := link.AttachCgroup(link.CgroupOptions{
		Path: cgroupRoot, Attach: ebpf.AttachCGroupDevice, Program: m.progs["gpud_gate"],
	})
	if err != nil {
		return fmt.Errorf("bpf: attaching the device gate at %s: %w", cgroupRoot, err)
	}
	m.gate = l
	if m.pinDir != "" {
		if err := l.Pin(filepath.Join(m.pinDir, GatePin)); err != nil {
			return fmt.Errorf("bpf: pinning the device gate: %w", err)
		}
	}
	return nil
}

func isDeviceCgroupLink(l link.Link) bool {
	info, err := l.Info()
	if err != nil || info.Type != link.CgroupType {
		return false
	}
	c := info.Cgroup()
	return c != nil && ebpf.AttachType(c.AttachType) == ebpf.AttachCGroupDevice
}

// ensureBPFFS makes dir, on a bpf filesystem: /sys/fs/bpf is mounted when
// it is not (as systemd does at boot).
func ensureBPFFS(dir string) error {
	const bpfFSMagic = 0xcafe4a11
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(dir), &st); err != nil || st.Type != bpfFSMagic {
		root := "/sys/fs/bpf"
		if !strings.HasPrefix(filepath.Clean(dir), root+"/") {
			return fmt.Errorf("%w: %s", ErrNotBPFFS, dir)
		}
		if err := unix.Statfs(root, &st); err != nil || st.Type != bpfFSMagic {
			if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
				return fmt.Errorf("bpf: mounting a bpf filesystem at %s: %w", root, err)
			}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bpf: pin directory: %w", err)
	}
	if err := unix.Statfs(dir, &st); err != nil || st.Type != bpfFSMagic {
		return fmt.Errorf("%w: %s", ErrNotBPFFS, dir)
	}
	return nil
}

// Adopted reports whether the gate running now is a previous gpud's,
// waiting for TakeOver.
func (m *Monitor) Adopted() bool { return m.adopted }

// TakeOver puts this Monitor's gate program on the link (a previous gpud's
// pinned one), atomically: no moment without a gate, never two. Call it
// once the maps are filled in (GPUs, classes, policies). A no-op when the
// gate is already this Monitor's.
func (m *Monitor) TakeOver() error {
	if !m.adopted {
		return nil
	}
	if err := m.gate.Update(m.progs["gpud_gate"]); err != nil {
		return fmt.Errorf("bpf: replacing the previous gate program: %w", err)
	}
	m.adopted = false
	return nil
}

// KeepGate makes Close leave the pinned gate attached (its program keeps
// the last decisions until the heartbeat is older than the fail-open delay,
// then allows everything); false (the default) unpins and detaches it.
func (m *Monitor) KeepGate(keep bool) { m.keepGate = keep }

// Uninstall removes what a pinned gpud left behind: the gate's link (its
// program is detached) and the pin directory.
func Uninstall(pinDir string) error {
	path := filepath.Join(pinDir, GatePin)
	l, err := link.LoadPinnedLink(path, nil)
	switch {
	case err == nil:
		uerr := l.Unpin()
		cerr := l.Close()
		if err := errors.Join(uerr, cerr); err != nil {
			return fmt.Errorf("bpf: removing the pinned gate: %w", err)
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("bpf: removing %s: %w", path, errors.Join(err, rerr))
		}
	}
	if err := os.Remove(pinDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("bpf: removing %s: %w", pinDir, err)
	}
	return nil
}

// KernelDev encodes a device number as the kernel's dev_t (12-bit major,
// 20-bit minor); false for numbers no Linux kernel gives a device node.
func KernelDev(major, minor uint32) (uint32, bool) {
	if major > 0xfff || minor > 0xfffff {
		return 0, false
	}
	return major<<20 | minor, true
}

// MaxGPUs is how many GPU devices the gate's maps hold (MAX_GPUS in
// headers/gpud.h).
const MaxGPUs = 256

// ErrUnprotected marks GPUs the gate cannot protect: their opens are not
// judged (and, when not even tracked, not observed).
var ErrUnprotected = errors.New("bpf: GPU not protected by the gate")

// SetGPUs replaces the set of tracked GPU devices: kernel dev_t (see
// KernelDev) to GPU index. The gate knows a GPU by its dev_t alone,
// whatever its minor number or index; gpu_devs gives it the GPU's slot in
// the per-GPU arrays. A new GPU's slot is cleared before the GPU is
// tracked, so the gate never meets a tracked GPU with another's values; a
// GPU that cannot be tracked is reported in an
// error wrapping ErrUnprotected (the others are set) and Protected says
// false for it.
func (m *Monitor) SetGPUs(devs map[uint32]uint32) error {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	// What the kernel tracks now. A GPU that stays keeps its entry and its
	// slot (its policy, marks and confirmation) untouched: a replaced
	// gpu_devs element may be reused under a reader (gpud.bpf.c).
	cur := map[uint32]gpudGpuDev{}
	var k uint32
	var v gpudGpuDev
	it := m.objs.GpuDevs.Iterate()
	for it.Next(&k, &v) {
		cur[k] = v
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("bpf: reading GPU devices: %w", err)
	}
	used := map[uint32]bool{}
	for dev, cv := range cur {
		if _, ok := devs[dev]; ok {
			used[cv.Slot] = true
			continue
		}
		if err := m.objs.GpuDevs.Delete(dev); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("bpf: removing GPU device %#x: %w", dev, err)
		}
	}
	m.devOf, m.slotOf = map[uint32]uint32{}, map[uint32]uint32{}
	m.tracked, m.protected = map[uint32]bool{}, map[uint32]bool{}
	// New GPUs take the free slots in their index order: the same GPUs get
	// the same slots whatever the map's order.
	order := make([]uint32, 0, len(devs))
	for dev := range devs {
		order = append(order, dev)
	}
	slices.SortFunc(order, func(a, b uint32) int { return cmp.Compare(devs[a], devs[b]) })
	var errs []error
	free := uint32(0)
	for _, dev := range order {
		idx := devs[dev]
		m.devOf[idx] = dev
		cv, ok := cur[dev]
		switch {
		case ok && cv.Gpu == idx:
			// Kept as it is.
		case ok:
			// Renamed: the same device, its slot and state kept.
			cv.Gpu = idx
			if err := m.objs.GpuDevs.Update(dev, cv, ebpf.UpdateExist); err != nil {
				errs = append(errs, fmt.Errorf("GPU %d (device %d:%d): renaming: %w", idx, dev>>20, dev&0xfffff, err))
				continue
			}
		default:
			for free < MaxGPUs && used[free] {
				free++
			}
			if free >= MaxGPUs {
				errs = append(errs, fmt.Errorf("GPU %d (device %d:%d): %w", idx, dev>>20, dev&0xfffff, errNoSlot))
				continue
			}
			cv = gpudGpuDev{Gpu: idx, Slot: free}
			used[free] = true
			if err := m.addGPU(dev, cv); err != nil {
				errs = append(errs, fmt.Errorf("GPU %d (device %d:%d): %w", idx, dev>>20, dev&0xfffff, err))
				continue
			}
		}
		m.slotOf[idx] = cv.Slot
		m.tracked[idx], m.protected[idx] = true, true
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrUnprotected, errors.Join(errs...))
	}
	return nil
}

// errNoSlot: every slot of the per-GPU arrays is taken.
var errNoSlot = fmt.Errorf("more than %d GPUs", MaxGPUs)

// addGPU clears a new GPU's slot in the per-GPU arrays (a slot freed by a
// GPU gone keeps its values), then tracks the GPU in it.
func (m *Monitor) addGPU(dev uint32, gd gpudGpuDev) error {
	var zero gpudGpuPol
	for _, e := range []struct {
		mp  *ebpf.Map
		val any
	}{{m.objs.GpuPolicy, zero}, {m.objs.GpuHighMark, uint64(0)}, {m.objs.GpuConfirmed, uint64(0)}} {
		if err := e.mp.Update(gd.Slot, e.val, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("gate map %s: %w", e.mp, err)
		}
	}
	if err := m.objs.GpuDevs.Update(dev, gd, ebpf.UpdateNoExist); err != nil {
		return fmt.Errorf("tracking the device: %w", err)
	}
	return nil
}

// Protected reports whether the gate judges opens of GPU index gpu: the
// gate is loaded, the GPU's device is tracked with all its policy entries,
// and its last policy update went through.
func (m *Monitor) Protected(gpu uint32) bool {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	return m.gateErr == nil && m.protected[gpu]
}

// SetMonitoring flips the kernel monitoring switch.
func (m *Monitor) SetMonitoring(on bool) error {
	var v uint32
	if on {
		v = 1
	}
	if err := m.objs.Monitoring.Set(v); err != nil {
		return fmt.Errorf("bpf: setting monitoring switch: %w", err)
	}
	return nil
}

// Monitoring reports the kernel switch.
func (m *Monitor) Monitoring() (bool, error) {
	var v uint32
	if err := m.objs.Monitoring.Get(&v); err != nil {
		return false, fmt.Errorf("bpf: reading monitoring switch: %w", err)
	}
	return v != 0, nil
}

// Register tells the kernel side who its consumer is: that
// process (and its cgroup, unless it is 0) is exempt from observation, and
// the heartbeat starts.
func (m *Monitor) Register(tgid uint32, cgroupID uint64) error {
	if err := m.objs.ConsumerTgid.Set(tgid); err != nil {
		return fmt.Errorf("bpf: registering consumer: %w", err)
	}
	if err := m.objs.ConsumerCgroup.Set(cgroupID); err != nil {
		return fmt.Errorf("bpf: registering consumer cgroup: %w", err)
	}
	return m.Heartbeat()
}

// Heartbeat records that the consumer is alive now.
func (m *Monitor) Heartbeat() error {
	if err := m.objs.HeartbeatNs.Set(MonotonicNow()); err != nil {
		return fmt.Errorf("bpf: heartbeat: %w", err)
	}
	return nil
}

// WatchProcess makes the kernel side follow a process found by reading
// /proc rather than by an event (its closes, forks, execs and exit are
// filtered by this map). The entry goes when the process exits.
func (m *Monitor) WatchProcess(tgid uint32) error {
	mem, err := m.holderMemory()
	if err != nil {
		return fmt.Errorf("bpf: watching process %d: %w", tgid, err)
	}
	// The process's own byte: a plain store, as the kernel's (the map
	// covers every tgid, so this fails only past PID_MAX_LIMIT).
	if _, err := mem.WriteAt([]byte{1}, int64(tgid)); err != nil {
		return fmt.Errorf("bpf: watching process %d: %w", tgid, err)
	}
	return nil
}

// Priority classes as the gate knows them (enum prio in headers/gpud.h).
const (
	PrioHigh uint32 = 1
	PrioLow  uint32 = 2
	// PrioWorkload: a workload of no enforced class (unmanaged or
	// unclassified). The rule table ignores it; a shared GPU refuses it
	// unless its share fence lets it in.
	PrioWorkload uint32 = 3
)

// putChanged puts v at k in a hash map unless the map has that value
// already: replacing a hash map's value retires its element to the next
// update on this CPU (another key's), while the gate may still be reading
// it (gpud.bpf.c, gpu_devs), and gpud repeats a workload's class, fence and
// expectation at each of its updates (a pod's status).
func putChanged[K any, V comparable](mp *ebpf.Map, k K, v V) error {
	var cur V
	if err := mp.Lookup(k, &cur); err == nil && cur == v {
		return nil
	}
	return mp.Put(k, v)
}

// SetCgroupPriority classifies a cgroup v2 id (a container's, or a pod's:
// the gate walks ancestors) as PrioHigh, PrioLow or PrioWorkload; a class
// the kernel has already is not written again (putChanged).
func (m *Monitor) SetCgroupPriority(cgroupID uint64, prio uint32) error {
	if err := putChanged(m.objs.CgroupPrio, cgroupID, prio); err != nil {
		return fmt.Errorf("bpf: classifying cgroup %d: %w", cgroupID, err)
	}
	return nil
}

// CgroupPriority returns the class the kernel has for a cgroup v2 id
// (PrioHigh, PrioLow, PrioWorkload); false when it has none (for that id
// itself: the gate also walks its ancestors).
func (m *Monitor) CgroupPriority(cgroupID uint64) (uint32, bool, error) {
	var prio uint32
	err := m.objs.CgroupPrio.Lookup(cgroupID, &prio)
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("bpf: reading cgroup %d's class: %w", cgroupID, err)
	}
	return prio, true, nil
}

// ForgetCgroup removes a cgroup's class: it becomes unmanaged.
func (m *Monitor) ForgetCgroup(cgroupID uint64) error {
	if err := m.objs.CgroupPrio.Delete(cgroupID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpf: forgetting cgroup %d: %w", cgroupID, err)
	}
	return nil
}

// GPUSet is a set of GPU indexes (N of /dev/nvidiaN, below MaxGPUs), as
// the gate's share fence keeps it: a bit per GPU.
type GPUSet [maxGPUs / 64]uint64

// maxGPUs is MAX_GPUS of gpud.h: the GPU indexes a GPUSet holds.
const maxGPUs = 256

// Add puts gpu in the set; an index past the set's size is left out (and
// the gate never fences a GPU it cannot name).
func (s *GPUSet) Add(gpu int) {
	if gpu >= 0 && gpu < maxGPUs {
		s[gpu/64] |= 1 << (gpu % 64)
	}
}

// FenceCgroup lets the processes of cgroupID (a pod's: the gate walks
// ancestors) open only the GPUs in gpus while the gate enforces; fenced is
// how many cgroups are fenced after this one (the gate skips its walk at 0).
// A fence the kernel has already is not written again (putChanged).
func (m *Monitor) FenceCgroup(cgroupID uint64, gpus GPUSet, fenced int) error {
	if err := putChanged(m.objs.ShareFence, cgroupID, gpus); err != nil {
		return fmt.Errorf("bpf: fencing cgroup %d to its shared GPUs: %w", cgroupID, err)
	}
	return m.setShareFences(fenced)
}

// UnfenceCgroup lifts cgroupID's fence; fenced is how many are left.
func (m *Monitor) UnfenceCgroup(cgroupID uint64, fenced int) error {
	if err := m.objs.ShareFence.Delete(cgroupID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpf: lifting cgroup %d's share fence: %w", cgroupID, err)
	}
	return m.setShareFences(fenced)
}

func (m *Monitor) setShareFences(n int) error {
	if err := m.objs.ShareFences.Set(uint32(max(n, 0))); err != nil {
		return fmt.Errorf("bpf: counting share fences: %w", err)
	}
	return nil
}

// CgroupNameMax is the longest cgroup leaf name ExpectCgroup takes (the
// kernel map's key is CGROUP_NAME_LEN bytes, NUL included, and a name
// filling it could be a longer one cut short).
const CgroupNameMax = len(gpudCgroupName{}.Name) - 2

func cgroupKey(name string) (gpudCgroupName, error) {
	var k gpudCgroupName
	switch {
	case name == "" || strings.ContainsAny(name, "/\x00"):
		return k, fmt.Errorf("bpf: cgroup name %q: want one non-empty path element", name)
	case len(name) > CgroupNameMax:
		return k, fmt.Errorf("bpf: cgroup name %.40q...: %d bytes, at most %d", name, len(name), CgroupNameMax)
	}
	for i := 0; i < len(name); i++ {
		k.Name[i] = int8(name[i])
	}
	return k, nil
}

// ExpectParents is how many parents ExpectCgroup takes for one name.
const ExpectParents = len(gpudCgroupExpect{}.Parents)

// ExpectCgroup gives the cgroup v2 cgroups that will be created with this
// leaf name the class prio (PrioHigh, PrioLow or PrioWorkload) the moment they are made,
// before a process runs in them: the gate then decides their first open.
// Only a cgroup made by root directly in one of parents (cgroup ids: the
// runtime's parent cgroups, 1 to ExpectParents of them) is classified: the
// name made anywhere else, or by another user, is a look-alike.
// It stays until UnexpectCgroup (a container's cgroup is made again at each
// start). ErrNoMkdirHook when cgroup creation is not observed.
func (m *Monitor) ExpectCgroup(name string, prio uint32, parents []uint64) error {
	if m.mkdirErr != nil {
		return fmt.Errorf("%w: %w", ErrNoMkdirHook, m.mkdirErr)
	}
	if prio != PrioHigh && prio != PrioLow && prio != PrioWorkload {
		return fmt.Errorf("bpf: expecting cgroup %q: class %d is not high, low or workload", name, prio)
	}
	k, err := cgroupKey(name)
	if err != nil {
		return err
	}
	v := gpudCgroupExpect{Prio: prio}
	if len(parents) == 0 || len(parents) > len(v.Parents) || slices.Contains(parents, 0) {
		return fmt.Errorf("bpf: expecting cgroup %q: parents %v, want 1 to %d non-zero ids", name, parents, len(v.Parents))
	}
	copy(v.Parents[:], parents)
	// Not written again when the kernel has it (putChanged).
	if err := putChanged(m.objs.ExpectCgroup, k, v); err != nil {
		return fmt.Errorf("bpf: expecting cgroup %q: %w", name, err)
	}
	return nil
}

// UnexpectCgroup forgets a name ExpectCgroup was given (cgroups made
// already keep their class until they are removed or forgotten).
func (m *Monitor) UnexpectCgroup(name string) error {
	k, err := cgroupKey(name)
	if err != nil {
		return err
	}
	if err := m.objs.ExpectCgroup.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpf: forgetting expected cgroup %q: %w", name, err)
	}
	return nil
}

// GPUPolicy is what the gate is told about one GPU.
type GPUPolicy struct {
	High, Low      uint32 // holders by class
	ReservedCgroup uint64 // while reserved, only this cgroup may open low
	ReservedUntil  uint64 // CLOCK_MONOTONIC ns
	// Shared: the GPU is shared by memory (DRA); the gate applies no
	// rule of the table to its opens (the share fence still applies).
	Shared bool
}

// SetGPUPolicy updates one GPU's policy and then confirms that events up to
// confirmedMono are reflected in it (in that order: the gate must never see
// the confirmation without the counts).
func (m *Monitor) SetGPUPolicy(gpu uint32, p GPUPolicy, confirmedMono uint64) error {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	if _, ok := m.devOf[gpu]; !ok {
		return fmt.Errorf("%w: GPU %d is not tracked", ErrUnprotected, gpu)
	}
	if !m.tracked[gpu] {
		// SetGPUs could not give it entries: it reported that once, and
		// Protected shows it. Failing here on every sync would only repeat
		// it in the log.
		return nil
	}
	v := gpudGpuPol{High: p.High, Low: p.Low, ReservedCgroup: p.ReservedCgroup, ReservedUntilNs: p.ReservedUntil}
	if p.Shared {
		v.Shared = 1
	}
	// In place (arrays): the gate reading this GPU's policy meanwhile sees
	// this GPU's old or new values, never another's.
	slot := m.slotOf[gpu]
	if err := m.objs.GpuPolicy.Update(slot, v, ebpf.UpdateExist); err != nil {
		m.protected[gpu] = false
		return fmt.Errorf("%w: GPU %d policy: %w", ErrUnprotected, gpu, err)
	}
	if err := m.objs.GpuConfirmed.Update(slot, confirmedMono, ebpf.UpdateExist); err != nil {
		m.protected[gpu] = false
		return fmt.Errorf("%w: GPU %d confirmation: %w", ErrUnprotected, gpu, err)
	}
	m.protected[gpu] = m.tracked[gpu]
	return nil
}

// SetEnforcing turns the gate's verdicts on or off. failOpenAfter is how
// long the gate keeps enforcing without a heartbeat.
func (m *Monitor) SetEnforcing(on bool, failOpenAfter time.Duration) error {
	var v uint32
	if on {
		v = 1
	}
	if err := m.objs.FailOpenAfterNs.Set(uint64(failOpenAfter.Nanoseconds())); err != nil {
		return fmt.Errorf("bpf: setting fail-open delay: %w", err)
	}
	if err := m.objs.Enforcing.Set(v); err != nil {
		return fmt.Errorf("bpf: setting enforcement: %w", err)
	}
	return nil
}

// Dropped returns how many events the kernel could not queue so far.
func (m *Monitor) Dropped() (uint64, error) {
	var v uint64
	if err := m.objs.Dropped.Get(&v); err != nil {
		return 0, fmt.Errorf("bpf: reading drop counter: %w", err)
	}
	return v, nil
}

// PendingMarks returns how many GPU opens the gate marked that no openat exit
// has consumed yet (stale marks are consumed at the task's exit).
func (m *Monitor) PendingMarks() (uint64, error) {
	var v uint64
	if err := m.objs.PendingMarks.Get(&v); err != nil {
		return 0, fmt.Errorf("bpf: reading pending marks: %w", err)
	}
	return v, nil
}

// ReadEvent blocks until an event is available, or until the deadline set
// by SetDeadline passes (os.ErrDeadlineExceeded), or Close (ErrClosed).
func (m *Monitor) ReadEvent(rec *ringbuf.Record, ev *Event) error {
	if err := m.rd.ReadInto(rec); err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			return ErrClosed
		}
		return err
	}
	return DecodeEvent(rec.RawSample, ev)
}

// SetDeadline bounds the next ReadEvent calls; the zero time removes it.
func (m *Monitor) SetDeadline(t time.Time) { m.rd.SetDeadline(t) }

// Pending returns the number of unread bytes in the ring buffer.
func (m *Monitor) Pending() int { return m.rd.AvailableBytes() }

// Close detaches and unloads everything.
func (m *Monitor) Close() error {
	var errs []error
	if m.rd != nil {
		errs = append(errs, m.rd.Close())
	}
	for _, l := range m.links {
		errs = append(errs, l.Close())
	}
	m.links = nil
	m.hmu.Lock()
	for _, l := range m.probes {
		errs = append(errs, l.Close())
	}
	m.probes, m.probeMod, m.probeGone = nil, nil, nil
	m.hmu.Unlock()
	if m.gate != nil {
		if m.pinDir != "" && !m.keepGate {
			errs = append(errs, m.gate.Unpin())
			_ = os.Remove(m.pinDir)
		}
		errs = append(errs, m.gate.Close())
		m.gate = nil
	}
	for _, p := range m.progs {
		errs = append(errs, p.Close())
	}
	m.progs = nil
	errs = append(errs, m.objs.Close())
	if m.sections != nil {
		m.sections.Close()
		m.sections = nil
	}
	return errors.Join(errs...)
}

// MonotonicNow returns CLOCK_MONOTONIC in ns, the clock of Event.Mono,
// never ahead of it (by well under a microsecond behind): a time gpud
// confirms to the gate ("events up to here are applied") must not be
// later than the truth.
//
// It is the Go runtime's monotonic clock (CLOCK_MONOTONIC read through
// the vDSO) since a base read once with the clock_gettime syscall:
// x/sys/unix has no vDSO path, and that syscall on every event was a
// quarter of gpud's CPU under a churn of GPU opens.
func MonotonicNow() uint64 {
	b := monoBase()
	return b.mono + uint64(time.Since(b.at))
}

type monoPair struct {
	mono uint64    // CLOCK_MONOTONIC, read just before at
	at   time.Time // with the runtime's monotonic reading
}

// monoBase pairs a clock_gettime reading with time.Now taken right after
// it: the base is behind at's true CLOCK_MONOTONIC by the time between the
// two, the least of a few tries.
var monoBase = sync.OnceValue(func() monoPair {
	var best monoPair
	spread := uint64(1<<64 - 1)
	for i := 0; i < 5; i++ {
		before := syscallMonotonic()
		at := time.Now()
		after := syscallMonotonic()
		if after-before < spread {
			spread, best = after-before, monoPair{mono: before, at: at}
		}
	}
	return best
})

func syscallMonotonic() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
