//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// gpud's kernel side: observers of GPU device file descriptors and the
// cgroup/dev program that sees every device-file open.
//
// The hot path is every open() on the node. Ordinary files never reach the
// cgroup/dev program; device files other than GPUs leave it after one hash
// lookup. Only a GPU open marks the opening task (pending map), and the
// openat-exit observer reads a single global counter before anything else, so
// for every open that is not a GPU open it costs one load and one compare.
// Close, fork, exec, exit and dup observers first look the process up in
// `holders` (processes known to hold, or to have held, a GPU fd) and return
// at once for everybody else.
//
// That is --hooks syscalls, whose sys_enter/sys_exit programs make every
// syscall on the node take the tracepoint slow path. On a kernel that
// refuses the gate (5.10) nothing marks GPU opens: user space sets
// check_opens, read only when no mark is pending, and the openat-exit
// observer then looks up every new fd itself. --hooks driver loads
// neither: the gate reports GPU opens itself (report_opens), and kprobes on
// the driver's release and on receive_fd, which run for nothing else, report
// last closes and passed fds.

#include "headers/gpud.h"

char __license[] SEC("license") = "Dual BSD/GPL";

// --- user-space controlled globals (.data / .bss, mmapped by the loader) ---

// The monitoring switch: 0 stops every observer (and the gate's
// marking) without unloading anything.
volatile __u32 monitoring = 1;
// Registration: the consumer's tgid and cgroup are exempt, and the
// heartbeat (CLOCK_MONOTONIC ns) tells the kernel side a consumer is alive.
volatile __u32 consumer_tgid = 0;
volatile __u64 consumer_cgroup = 0;
volatile __u64 heartbeat_ns = 0;

// Enforcement (the gate): off until user space turns it on; fail-open when
// the heartbeat is older than fail_open_after_ns.
volatile __u32 enforcing = 0;
volatile __u64 fail_open_after_ns = 30ULL * 1000 * 1000 * 1000;
// --hooks driver: the gate reports each GPU open it lets through (EV_OPEN,
// fd unknown: user space reads the opener's fd table) instead of marking
// the task for the openat-exit observer, which is not loaded then.
volatile __u32 report_opens = 0;
// --hooks syscalls on a kernel that refuses the gate: nothing marks GPU
// opens, so the openat-exit observer looks at every new fd itself (set by
// user space only then: kernels with the gate keep the one-compare exit).
volatile __u32 check_opens = 0;

// --- kernel-maintained counters, read by user space ---
volatile __u64 pending_marks = 0; // GPU opens marked by the gate, not yet seen at openat exit
volatile __u64 dropped = 0;       // events lost because the ring buffer was full
volatile __u64 scm_armed_until = 0; // a holder sent control data: watch recvmsg until then

// Every per-GPU map is keyed by the GPU's kernel dev_t (major << 20 |
// minor), whatever its minor number or node name: a GPU is its device
// number. The value here is the GPU's index as user space names it, for
// events only.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_GPUS);
	__type(key, __u32);   // kernel dev_t
	__type(value, __u32); // GPU index
} gpu_devs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);   // task_struct pointer of an opener
	__type(value, __u32); // MARK_* flags
} pending SEC(".maps");

#define MARK_GPU 1  // the task is opening a GPU
#define MARK_HIGH 2 // ... as a high-priority opener

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);   // tgid
	__type(value, __u32); // 1: has held a GPU fd (removed when the process exits)
} holders SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);   // cgroup v2 id (a container's, or a pod's: covers its children)
	__type(value, __u32); // enum prio
} cgroup_prio SEC(".maps");

// User space creates a GPU's entries here, in gpu_high_mark and in
// gpu_confirmed before its gpu_devs entry; a GPU tracked without them is
// one user space shows as not enforced.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_GPUS);
	__type(key, __u32); // kernel dev_t
	__type(value, struct gpu_pol);
} gpu_policy SEC(".maps");

// Classes of cgroups that do not exist yet, by leaf name (written by user
// space when a workload's class is known before its cgroup: a Docker
// container's create event, a pod the informer sees first). The
// cgroup_mkdir program copies the class into cgroup_prio the moment the
// cgroup is made, before any process runs in it, so the gate decides the
// workload's first open. A plain hash: when it is full, user space hears
// E2BIG and the after-the-fact rule covers that workload.
struct cgroup_name {
	char name[CGROUP_NAME_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct cgroup_name);
	__type(value, __u32); // enum prio
} expect_cgroup SEC(".maps");

// Written by the kernel only: when a high-priority open of the GPU was last
// let through or completed. A low open is denied while this is newer than
// what user space has confirmed in gpu_confirmed, so the GPU counts as held
// by high priority from the decision on, before user space hears of it.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_GPUS);
	__type(key, __u32); // kernel dev_t
	__type(value, __u64);
} gpu_high_mark SEC(".maps");

// Written by user space only, after gpu_policy: events up to this time
// (CLOCK_MONOTONIC) are reflected in gpu_policy.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_GPUS);
	__type(key, __u32); // kernel dev_t
	__type(value, __u64);
} gpu_confirmed SEC(".maps");

// The GPUs a pod with GPU memory shares (gpud's DRA claims) may open, by
// the pod's cgroup: a bit per GPU index. A cgroup with no fenced ancestor
// is not fenced (default-allow); share_fences is how many entries user
// space keeps here, so that the gate skips the walk while nothing is shared.
struct gpu_set {
	__u64 bits[MAX_GPUS / 64];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); // cgroup v2 id (a pod's)
	__type(value, struct gpu_set);
} share_fence SEC(".maps");

volatile __u32 share_fences = 0;

// When a refusal of (cgroup, GPU) was last reported: a process retrying a
// refused open in a loop must not flood the ring buffer and delay the
// events gpud needs (one report per workload per interval is enough for
// the earliest-request-first waiting queue).
struct deny_key {
	__u64 cgroup;
	__u32 gpu;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct deny_key);
	__type(value, __u64);
} deny_reported SEC(".maps");

#define DENY_REPORT_INTERVAL_NS (100ULL * 1000 * 1000)

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);   // pid_tgid inside recvmsg while armed
	__type(value, __u64); // user pointer to its struct user_msghdr
} recv_msgs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} events SEC(".maps");

// Force BTF for the event type so bpf2go generates a Go struct for it.
const struct event *unused_event __attribute__((unused));

static __always_inline int is_consumer(__u32 tgid)
{
	if (consumer_tgid && tgid == consumer_tgid)
		return 1;
	if (consumer_cgroup && bpf_get_current_cgroup_id() == consumer_cgroup)
		return 1;
	return 0;
}

// gpu_of_inode returns the GPU index of a character-device inode, or -1;
// *dev gets its dev_t.
static __always_inline int gpu_of_inode(struct inode *ino, __u32 *dev)
{
	if (!ino)
		return -1;
	umode_t mode = BPF_CORE_READ(ino, i_mode);
	if ((mode & S_IFMT) != S_IFCHR)
		return -1;
	__u32 rdev = BPF_CORE_READ(ino, i_rdev);
	__u32 *gpu = bpf_map_lookup_elem(&gpu_devs, &rdev);
	if (!gpu)
		return -1;
	*dev = rdev;
	return (int)*gpu;
}

// fd_gpu returns the GPU index behind fd of task t, or -1; *dev gets the
// GPU's dev_t.
static __always_inline int fd_gpu(struct task_struct *t, long fd, __u32 *dev)
{
	struct files_struct *files = BPF_CORE_READ(t, files);
	if (!files)
		return -1;
	struct fdtable *fdt = BPF_CORE_READ(files, fdt);
	if (!fdt)
		return -1;
	unsigned int max = BPF_CORE_READ(fdt, max_fds);
	if (fd < 0 || (unsigned long)fd >= max)
		return -1;
	struct file **arr = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	if (bpf_probe_read_kernel(&f, sizeof(f), &arr[fd]) || !f)
		return -1;
	return gpu_of_inode(BPF_CORE_READ(f, f_inode), dev);
}

static __always_inline void emit_cg(__u32 type, __u32 pid, __u32 tgid, __u32 ppid, __s32 fd, __s32 gpu, __u64 cgroup_id)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__sync_fetch_and_add(&dropped, 1);
		return;
	}
	e->ts = bpf_ktime_get_ns();
	e->cgroup_id = cgroup_id;
	e->type = type;
	e->pid = pid;
	e->tgid = tgid;
	e->ppid = ppid;
	e->fd = fd;
	e->gpu = gpu;
	bpf_get_current_comm(&e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

static __always_inline void emit(__u32 type, __u32 pid, __u32 tgid, __u32 ppid, __s32 fd, __s32 gpu)
{
	emit_cg(type, pid, tgid, ppid, fd, gpu, bpf_get_current_cgroup_id());
}

static __always_inline void mark_holder(__u32 tgid)
{
	__u32 one = 1;
	bpf_map_update_elem(&holders, &tgid, &one, BPF_ANY);
}

// ----------------------------------------------------------------------------
// The gate (the rule table). It runs on every device-file open in every
// cgroup, before the driver. It allows everything that is not a tracked GPU,
// every cgroup it does not know, and everything while enforcement is off or
// the consumer's heartbeat is stale. For a tracked GPU it also marks the
// opening task so that the openat-exit observer looks at the new fd.

// classify walks the opener's cgroup ancestors: the deepest classified one
// decides (its id goes to *matched); *reserved_ok tells whether `reserved`
// is among them.
static __always_inline __u32 classify(__u64 reserved, int *reserved_ok, __u64 *matched)
{
	__u32 prio = PRIO_NONE;
	*reserved_ok = 0;
	*matched = 0;
	for (int level = 1; level < MAX_CGROUP_DEPTH; level++) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(level);
		if (id == 0)
			break;
		if (reserved && id == reserved)
			*reserved_ok = 1;
		__u32 *p = bpf_map_lookup_elem(&cgroup_prio, &id);
		if (p) {
			prio = *p;
			*matched = id;
		}
	}
	return prio;
}

#define FENCE_NONE 0 // the opener's pod has no GPU memory share
#define FENCE_IN 1   // ... has a share of this GPU: the share rule judges it, not the table
#define FENCE_OUT 2  // ... has shares, none of this GPU: refused

static __always_inline int share_fence_of(__u32 gpu)
{
	if (gpu >= MAX_GPUS)
		return FENCE_NONE;
	for (int level = 1; level < MAX_CGROUP_DEPTH; level++) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(level);
		if (id == 0)
			break;
		struct gpu_set *set = bpf_map_lookup_elem(&share_fence, &id);
		if (set)
			return (set->bits[(gpu / 64) & (MAX_GPUS / 64 - 1)] & (1ULL << (gpu % 64))) ? FENCE_IN : FENCE_OUT;
	}
	return FENCE_NONE;
}

// gate_event reports a verdict with the classified cgroup that decided it
// (a pod's or a container's), which names the workload even when the
// opener exits before user space can read /proc.
static __always_inline void gate_event(__u32 type, __u32 gpu, __u64 cgroup_id)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	emit_cg(type, BPF_CORE_READ(t, pid), BPF_CORE_READ(t, tgid), 0, -1, gpu, cgroup_id);
}

SEC("cgroup/dev")
int gpud_gate(struct bpf_cgroup_dev_ctx *ctx)
{
	if (!monitoring)
		return 1;
	if ((ctx->access_type & 0xFFFF) != BPF_DEVCG_DEV_CHAR)
		return 1;
	if (!((ctx->access_type >> 16) & (BPF_DEVCG_ACC_READ | BPF_DEVCG_ACC_WRITE)))
		return 1; // mknod only
	__u32 rdev = (ctx->major << 20) | ctx->minor;
	__u32 *gpup = bpf_map_lookup_elem(&gpu_devs, &rdev);
	if (!gpup)
		return 1;
	__u32 gpu = *gpup;
	__u32 mark = MARK_GPU;

	__u64 now = bpf_ktime_get_ns();
	if (enforcing && now - heartbeat_ns < fail_open_after_ns) {
		int fence = share_fences ? share_fence_of(gpu) : FENCE_NONE;
		if (fence == FENCE_OUT)
			return 0; // EPERM: a sharing pod opens a GPU it has no share of
		struct gpu_pol *pol = bpf_map_lookup_elem(&gpu_policy, &rdev);
		__u64 *hmark = bpf_map_lookup_elem(&gpu_high_mark, &rdev);
		__u64 *conf = bpf_map_lookup_elem(&gpu_confirmed, &rdev);
		// A GPU shared by memory is no one's to hold: its pods are there
		// together whatever their class, so no open of it marks it high or
		// is refused by the table (only the fence above applies).
		if (fence == FENCE_NONE && pol && hmark && conf && !pol->shared) {
			int reserved_ok = 0;
			__u64 matched = 0;
			__u64 reserved = now < pol->reserved_until_ns ? pol->reserved_cgroup : 0;
			__u32 prio = classify(reserved, &reserved_ok, &matched);
			if (prio == PRIO_HIGH) {
				*hmark = now;
				mark |= MARK_HIGH;
				if (pol->low)
					gate_event(EV_GATE_HIGH, gpu, matched);
			} else if (prio == PRIO_LOW) {
				// User space writes the policy, then the confirmation. Read
				// them the other way round: a confirmation seen here implies
				// the policy written before it is seen too, so a cleared mark
				// is never combined with a stale count of high holders.
				__u64 confirmed = *(volatile __u64 *)conf;
				__u64 marked = *(volatile __u64 *)hmark;
				asm volatile("" ::: "memory");
				__u32 high = *(volatile __u32 *)&pol->high;
				if (high || marked > confirmed || (reserved && !reserved_ok)) {
					struct deny_key dk = {.cgroup = matched, .gpu = gpu};
					__u64 *last = bpf_map_lookup_elem(&deny_reported, &dk);
					if (!last || now - *last > DENY_REPORT_INTERVAL_NS) {
						bpf_map_update_elem(&deny_reported, &dk, &now, BPF_ANY);
						gate_event(EV_DENY, gpu, matched);
					}
					return 0; // EPERM
				}
			}
		}
	}

	if (report_opens) {
		struct task_struct *t = (struct task_struct *)bpf_get_current_task();
		__u32 tgid = BPF_CORE_READ(t, tgid);
		if (is_consumer(tgid))
			return 1;
		mark_holder(tgid);
		// ppid says whether this open marked the GPU high: only such
		// opens hold user space's confirmations back until their fd is
		// found.
		emit(EV_OPEN, BPF_CORE_READ(t, pid), tgid, (mark & MARK_HIGH) ? OPEN_MARKED_HIGH : 0, FD_UNKNOWN, gpu);
		if (mark & MARK_HIGH) {
			// Marked again after the event is queued: user space cannot
			// confirm past this mark before it has read the event (and it
			// confirms no further until it has found the new fd).
			__u64 *hmark = bpf_map_lookup_elem(&gpu_high_mark, &rdev);
			if (hmark)
				*hmark = bpf_ktime_get_ns();
		}
		return 1;
	}
	__u64 task = bpf_get_current_task();
	if (bpf_map_update_elem(&pending, &task, &mark, BPF_NOEXIST) == 0)
		__sync_fetch_and_add(&pending_marks, 1);
	else
		bpf_map_update_elem(&pending, &task, &mark, BPF_EXIST);
	return 1;
}

// consume_mark removes the current task's mark and returns it, or -1.
static __always_inline long consume_mark(__u64 task)
{
	__u32 *m = bpf_map_lookup_elem(&pending, &task);
	if (!m)
		return -1;
	long mark = *m;
	if (bpf_map_delete_elem(&pending, &task) == 0)
		__sync_fetch_and_sub(&pending_marks, 1);
	return mark;
}

static __always_inline int on_new_fd(long ret, int holders_only);

static __always_inline int on_open_exit(long ret)
{
	if (pending_marks == 0)
		return check_opens ? on_new_fd(ret, 0) : 0;
	__u64 task = bpf_get_current_task();
	long mark = consume_mark(task);
	if (mark < 0)
		return 0;
	if (ret < 0 || !monitoring)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (is_consumer(tgid))
		return 0;
	__u32 dev = 0;
	int gpu = fd_gpu((struct task_struct *)task, ret, &dev);
	if (gpu < 0)
		return 0;
	mark_holder(tgid);
	emit(EV_OPEN, (__u32)id, tgid, 0, ret, gpu);
	if (mark & MARK_HIGH) {
		// Marked again after the event is queued: user space cannot confirm
		// past this mark before it has read the event.
		__u64 *hmark = bpf_map_lookup_elem(&gpu_high_mark, &dev);
		if (hmark)
			*hmark = bpf_ktime_get_ns();
	}
	return 0;
}

// A new fd that may alias a GPU fd: dup, fcntl(F_DUPFD*), pidfd_getfd. The
// return value is the new fd (for fcntl's other commands it is not an fd, and
// checking it as one can only find a GPU fd that really is open).
static __always_inline int on_new_fd(long ret, int holders_only)
{
	if (!monitoring || ret < 0)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (holders_only && !bpf_map_lookup_elem(&holders, &tgid))
		return 0;
	if (is_consumer(tgid))
		return 0;
	__u32 dev = 0;
	int gpu = fd_gpu((struct task_struct *)bpf_get_current_task(), ret, &dev);
	if (gpu < 0)
		return 0;
	mark_holder(tgid);
	emit(EV_OPEN, (__u32)id, tgid, 0, ret, gpu);
	return 0;
}

// dup2/dup3/close_range can replace or close several fds at once: ask user
// space to reconcile the process from /proc/<pid>/fd.
static __always_inline int resync_holder(long ret)
{
	if (!monitoring || ret < 0)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!bpf_map_lookup_elem(&holders, &tgid) || is_consumer(tgid))
		return 0;
	emit(EV_RESYNC, (__u32)id, tgid, 0, -1, -1);
	return 0;
}

static __always_inline int enter_close(unsigned long fd_arg)
{
	if (!monitoring)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!bpf_map_lookup_elem(&holders, &tgid))
		return 0;
	long fd = (long)(int)fd_arg;
	__u32 dev = 0;
	int gpu = fd_gpu((struct task_struct *)bpf_get_current_task(), fd, &dev);
	if (gpu < 0 || is_consumer(tgid))
		return 0;
	emit(EV_CLOSE, (__u32)id, tgid, 0, fd, gpu);
	return 0;
}

// fds passed over unix sockets (SCM_RIGHTS): a holder sending control data
// arms a window during which any recvmsg that receives control data asks for a
// reconciliation of the receiver.
static __always_inline int enter_sendmsg(void *msgp)
{
	if (!monitoring)
		return 0;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!bpf_map_lookup_elem(&holders, &tgid))
		return 0;
	__u64 controllen = 0;
	if (bpf_probe_read_user(&controllen, sizeof(controllen), msgp + USER_MSGHDR_CONTROLLEN_OFF))
		return 0;
	if (controllen == 0)
		return 0;
	scm_armed_until = bpf_ktime_get_ns() + SCM_WINDOW_NS;
	return 0;
}

static __always_inline int enter_recvmsg(void *msgp)
{
	if (scm_armed_until == 0 || bpf_ktime_get_ns() > scm_armed_until)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u64 msg = (__u64)msgp;
	bpf_map_update_elem(&recv_msgs, &id, &msg, BPF_ANY);
	return 0;
}

static __always_inline int exit_recvmsg(long ret)
{
	// A recvmsg that started inside the window may end well after it.
	if (scm_armed_until == 0 || bpf_ktime_get_ns() > scm_armed_until + SCM_WINDOW_NS * 6)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u64 *msg = bpf_map_lookup_elem(&recv_msgs, &id);
	if (!msg)
		return 0;
	__u64 ptr = *msg;
	bpf_map_delete_elem(&recv_msgs, &id);
	if (ret < 0 || !monitoring)
		return 0;
	__u64 controllen = 0;
	if (bpf_probe_read_user(&controllen, sizeof(controllen), (void *)ptr + USER_MSGHDR_CONTROLLEN_OFF))
		return 0;
	__u32 tgid = id >> 32;
	if (controllen == 0 || is_consumer(tgid))
		return 0;
	mark_holder(tgid);
	emit(EV_RESYNC, (__u32)id, tgid, 0, -1, -1);
	return 0;
}

// ----------------------------------------------------------------------------
// The syscall observers: two BTF raw tracepoints for every syscall, which
// return after reading the syscall number unless it is one of ours. Classic
// per-syscall tracepoints would cost a perf buffer and an argument copy on
// every open and close of every file; this costs a compare.

SEC("tp_btf/sys_enter")
int BPF_PROG(on_sys_enter, struct pt_regs *regs, long id)
{
	switch (id) {
	case NR_close:
		return enter_close(SYSCALL_ARG1(regs));
	case NR_sendmsg:
		return enter_sendmsg((void *)SYSCALL_ARG2(regs));
	case NR_recvmsg:
		return enter_recvmsg((void *)SYSCALL_ARG2(regs));
	}
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_sys_exit, struct pt_regs *regs, long ret)
{
	switch (SYSCALL_NR(regs)) {
	case NR_openat:
	case NR_openat2:
#ifdef NR_open
	case NR_open:
#endif
		return on_open_exit(ret);
	case NR_dup:
	case NR_fcntl:
		return on_new_fd(ret, 1);
	case NR_pidfd_getfd:
		return on_new_fd(ret, 0);
#ifdef NR_dup2
	case NR_dup2:
#endif
	case NR_dup3:
	case NR_close_range:
		return resync_holder(ret);
	case NR_recvmsg:
		return exit_recvmsg(ret);
	}
	return 0;
}

// ----------------------------------------------------------------------------
// The driver observers (--hooks driver): kprobes on the GPU driver's own
// release (nvidia_close, file_operations of every /dev/nvidia* node) and on
// receive_fd (SCM_RIGHTS, pidfd_getfd, seccomp addfd), where the kernel
// allows kprobes. Opens are reported by the gate (report_opens), which sees
// every route to a GPU file (open, openat, openat2, the 32-bit ABI,
// io_uring, open_by_handle_at, a /proc/PID/fd reopen). None of these runs on
// a syscall that does not open, release or receive a device file, so the
// node's other syscalls pay nothing. The release runs on the file's last
// reference: every last close (close, dup2 over it, close_range, exit,
// io_uring unregistration) ends there. Arguments are taken from the entry
// (the driver may finish its work later on its own kernel thread).

// A GPU file's last reference is gone (whichever process dropped it, or a
// kernel thread): user space re-reads the fd tables of that GPU's holders.
SEC("kprobe/driver_release")
int on_driver_release(struct pt_regs *ctx)
{
	struct inode *ino = (struct inode *)KPROBE_ARG1(ctx);
	if (!monitoring)
		return 0;
	__u32 dev = 0;
	int gpu = gpu_of_inode(ino, &dev);
	if (gpu < 0)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	emit(EV_RELEASE, (__u32)id, id >> 32, 0, -1, gpu);
	return 0;
}

// A file is being installed in the current process from elsewhere
// (SCM_RIGHTS, pidfd_getfd, seccomp addfd): when it is a GPU's, the receiver
// becomes a holder (its fd is known after the install: user space reads it).
SEC("kprobe/receive_fd")
int on_receive_fd(struct pt_regs *ctx)
{
	struct file *f = (struct file *)KPROBE_ARG1(ctx);
	if (!monitoring || !f)
		return 0;
	__u32 dev = 0;
	int gpu = gpu_of_inode(BPF_CORE_READ(f, f_inode), &dev);
	if (gpu < 0)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (is_consumer(tgid))
		return 0;
	mark_holder(tgid);
	emit(EV_OPEN, (__u32)id, tgid, 0, FD_UNKNOWN, gpu);
	return 0;
}

// ----------------------------------------------------------------------------
// Process lifecycle.

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	if (!monitoring)
		return 0;
	__u32 ptgid = BPF_CORE_READ(parent, tgid);
	__u32 ctgid = BPF_CORE_READ(child, tgid);
	if (ptgid == ctgid) // a new thread shares the process's fd table
		return 0;
	if (!bpf_map_lookup_elem(&holders, &ptgid))
		return 0;
	// The child inherited the parent's fds; user space reads which from /proc.
	mark_holder(ctgid);
	emit(EV_FORK, BPF_CORE_READ(child, pid), ctgid, ptgid, -1, -1);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p)
{
	if (!monitoring)
		return 0;
	__u32 tgid = BPF_CORE_READ(p, tgid);
	if (!bpf_map_lookup_elem(&holders, &tgid))
		return 0;
	// O_CLOEXEC fds are already closed here.
	emit(EV_EXEC, BPF_CORE_READ(p, pid), tgid, 0, -1, -1);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	if (pending_marks)
		consume_mark((__u64)p);
	__u32 tgid = BPF_CORE_READ(p, tgid);
	if (!bpf_map_lookup_elem(&holders, &tgid))
		return 0;
	// Only the last thread of the process closes its files.
	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return 0;
	bpf_map_delete_elem(&holders, &tgid);
	if (!monitoring)
		return 0;
	emit(EV_EXIT, BPF_CORE_READ(p, pid), tgid, 0, -1, -1);
	return 0;
}

// ----------------------------------------------------------------------------
// Classification at cgroup creation. Loaded and attached on their own (a
// kernel without these tracepoints still runs everything above).

// cgroup_v2_leaf reads a cgroup v2 cgroup's leaf name into key; 0 when the
// cgroup is in a v1 hierarchy (hybrid hosts make one per controller), or
// its name does not fit (it cannot be one user space expects).
static __always_inline int cgroup_v2_leaf(struct cgroup *cgrp, struct cgroup_name *key)
{
	if (BPF_CORE_READ(cgrp, root, hierarchy_id) != 0) // cgrp_dfl_root is hierarchy 0
		return 0;
	const char *name = BPF_CORE_READ(cgrp, kn, name);
	if (!name)
		return 0;
	long n = bpf_probe_read_kernel_str(key->name, sizeof(key->name), name);
	return n > 0 && n < (long)sizeof(key->name);
}

SEC("tp_btf/cgroup_mkdir")
int BPF_PROG(on_cgroup_mkdir, struct cgroup *cgrp, const char *path)
{
	struct cgroup_name key;
	__builtin_memset(&key, 0, sizeof(key));
	if (!cgroup_v2_leaf(cgrp, &key))
		return 0;
	__u32 *prio = bpf_map_lookup_elem(&expect_cgroup, &key);
	if (!prio)
		return 0;
	// The id the gate's ancestor walk reads (kernfs node id).
	__u64 id = BPF_CORE_READ(cgrp, kn, id);
	__u32 p = *prio;
	bpf_map_update_elem(&cgroup_prio, &id, &p, BPF_ANY);
	return 0;
}

// A removed cgroup's class goes with it: ids are never reused, and a class
// set here for a workload user space never saw start would otherwise stay.
SEC("tp_btf/cgroup_rmdir")
int BPF_PROG(on_cgroup_rmdir, struct cgroup *cgrp, const char *path)
{
	if (BPF_CORE_READ(cgrp, root, hierarchy_id) != 0)
		return 0;
	__u64 id = BPF_CORE_READ(cgrp, kn, id);
	bpf_map_delete_elem(&cgroup_prio, &id);
	return 0;
}
