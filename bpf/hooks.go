package bpf

import (
	"fmt"
	"regexp"
	"strings"
)

// The observation modes (Options.Hooks).
const (
	// HooksDriver: nothing on the syscall path. The gate (cgroup/dev, which
	// runs only for device-file opens) reports every GPU open, whatever
	// the route; the process lifecycle tracepoints report forks, execs and
	// exits; kprobes on the GPU driver's release and on receive_fd report
	// last closes and passed fds where the kernel allows kprobes. Without
	// them, user space re-reads the holders' fd tables periodically.
	HooksDriver = "driver"
	// HooksSyscalls: BTF tracepoints on sys_enter/sys_exit. Every syscall
	// of every thread on the node takes the kernel's slow path (the
	// syscall tax measured by BenchmarkSyscallTax).
	HooksSyscalls = "syscalls"
)

// DriverSymbols are the kernel functions the driver hooks attach to; every
// one of a list that the kernel has is hooked (an older NVIDIA driver has
// both nvidia_frontend_close and nvidia_close: a release is then reported
// twice, and user space applies it idempotently).
type DriverSymbols struct {
	// Release is the GPU device file's file_operations release:
	// (struct inode *, struct file *), run on the file's last reference.
	Release []string
	// Receive installs a file received from elsewhere (SCM_RIGHTS,
	// pidfd_getfd, seccomp addfd): (struct file *, ...).
	Receive []string
}

// DefaultDriverSymbols are NVIDIA's: nvidia_close is the release of
// /dev/nvidiaN and /dev/nvidiactl from driver 545 on; older drivers route
// through nvidia_frontend_close.
func DefaultDriverSymbols() DriverSymbols {
	return DriverSymbols{
		Release: []string{"nvidia_close", "nvidia_frontend_close"},
		Receive: []string{"receive_fd", "__receive_fd"},
	}
}

func (d DriverSymbols) orDefault() DriverSymbols {
	def := DefaultDriverSymbols()
	if len(d.Release) == 0 {
		d.Release = def.Release
	}
	if len(d.Receive) == 0 {
		d.Receive = def.Receive
	}
	return d
}

// Hook roles, as Hooks reports them.
const (
	RoleRelease = "release"
	RoleReceive = "receive"
)

// symbolName is a kernel function's name as kallsyms has it.
var symbolName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]{0,127}$`)

// ParseDriverSymbols reads --driver-symbols: "release=a,b;receive=c", each
// role optional (a role left out keeps DefaultDriverSymbols').
func ParseDriverSymbols(s string) (DriverSymbols, error) {
	d := DefaultDriverSymbols()
	if strings.TrimSpace(s) == "" {
		return d, nil
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ";") {
		role, list, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return d, fmt.Errorf("driver symbols %q: %q is not role=symbol[,symbol...]", s, part)
		}
		if seen[role] {
			return d, fmt.Errorf("driver symbols %q: role %q given twice", s, role)
		}
		seen[role] = true
		var syms []string
		for _, sym := range strings.Split(list, ",") {
			sym = strings.TrimSpace(sym)
			if !symbolName.MatchString(sym) {
				return d, fmt.Errorf("driver symbols %q: %q is not a kernel function name", s, sym)
			}
			syms = append(syms, sym)
		}
		switch role {
		case RoleRelease:
			d.Release = syms
		case RoleReceive:
			d.Receive = syms
		default:
			return d, fmt.Errorf("driver symbols %q: unknown role %q (want release or receive)", s, role)
		}
	}
	return d, nil
}

// String is the --driver-symbols form of d.
func (d DriverSymbols) String() string {
	return "release=" + strings.Join(d.Release, ",") + ";receive=" + strings.Join(d.Receive, ",")
}
