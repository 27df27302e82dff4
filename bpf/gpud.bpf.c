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
// `holder_tgids` (processes known to hold, or to have held, a GPU fd) and return
// at once for everybody else.
//
// That is --hooks syscalls, whose sys_enter/sys_exit programs make every
// syscall on the node take the tracepoint slow path. On a kernel that
// refuses the gate (5.10) nothing marks GPU opens: user space sets
// check_opens, read only when no mark is pending, and the openat-exit
// observer then looks up every new fd itself. --hooks driver loads
// neither: the gate reports GPU opens itself (report_opens), and kprobes on
// the driver's release and on receive_fd, which run for nothing else, report
// last closes and passed fds; without kprobes, the sock tracepoints (AF_UNIX
// sends and receives only) report fds passed by SCM_RIGHTS.

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
// Set by user space once the sock tracepoints run: sys_exit then leaves
// received fds to them.
volatile __u32 sock_hooks = 0;
// Set by the kernel once a socket was marked in scm_socks: receives look
// the map up only from then on.
volatile __u32 scm_socks_used = 0;
volatile __u64 pending_full = 0;    // GPU opens the gate reported itself: pending was full

// A GPU is its kernel dev_t (major << 20 | minor), whatever its minor
// number or node name: gpu_devs maps it to the GPU's index as user space
// names it (for events) and to its slot in the per-GPU arrays (gpu_policy,
// gpu_high_mark, gpu_confirmed).
//
// Why arrays: a hash map's element is not its key's for as long as a
// program holds a pointer to it. Replacing a value in a preallocated hash
// swaps in a spare element and keeps the old one as the updating CPU's
// next spare, so the very next update on that CPU (another GPU's policy)
// writes into the element a concurrent gate still reads: it read another
// GPU's holder count, 0, and let a low open of a high-held GPU through
// (seen under a CPU hog in a VM, whose vCPU stalls stretch the window). An
// array's element is its slot's for good and is updated in place.
//
// Map bounds (#32): no unprivileged action may fill a map the protection
// depends on. Each map says who adds its entries, its bound, and what
// happens when it is full; user space reports each one's use
// (Monitor.MapUsage: gpud_kernel_map_entries / _capacity, gpud status).
//
// gpu_devs: user space only, one per GPU (MAX_GPUS); a GPU that does not
// fit is shown as not protected (SetGPUs). An entry is written when its
// GPU is added and replaced only if user space renames the GPU (a
// replaced hash element may be reused under a reader).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_GPUS);
	__type(key, __u32); // kernel dev_t
	__type(value, struct gpu_dev);
} gpu_devs SEC(".maps");

// pending: the gate, for any task that opens (or access()es) a GPU node,
// often world-readable: one entry per task, gone at its openat exit or its
// exit, so a user with many threads can fill it. Full is safe: the gate then
// reports the open itself, as under --hooks driver (EV_OPEN, fd unknown:
// user space reads the opener's fd table), and counts it in pending_full.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);   // task_struct pointer of an opener
	__type(value, __u32); // MARK_* flags
} pending SEC(".maps");

#define MARK_GPU 1  // the task is opening a GPU
#define MARK_HIGH 2 // ... as a high-priority opener

// holder_tgids: every process that holds or has held a GPU fd, one byte
// per tgid (1; cleared at its exit), set by the kernel for any opener of a
// GPU node and for a holder's children, and by user space (WatchProcess).
// It spans every tgid the kernel can give (PID_MAX_LIMIT, 2^22: 4 MiB, less
// than the 65536-entry hash it replaces), so no number of processes fills
// it: a holder is always followed.
#define HOLDER_SLOT 4096
#define PID_MAX_LIMIT (4 * 1024 * 1024)

struct holder_slot {
	__u8 tgid[HOLDER_SLOT];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PID_MAX_LIMIT / HOLDER_SLOT);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32); // tgid / HOLDER_SLOT
	__type(value, struct holder_slot);
} holder_tgids SEC(".maps");

// cgroup_prio: user space for workloads it classified, and the kernel's
// cgroup_mkdir program for a cgroup whose leaf name user space expects
// (only one root made under the runtime's expected parent: #32 class 1),
// removed at rmdir. Bounded by the node's workloads, not by its users.
// Full: a new workload is not classified in the kernel: the gate
// default-allows its opens and user space's after-the-fact rule
// (gate.Controller.Opened) judges them; gpud reports the map from 80 %.

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);   // cgroup v2 id (a container's, or a pod's: covers its children)
	__type(value, __u32); // enum prio
} cgroup_prio SEC(".maps");

// User space clears a GPU's slot here, in gpu_high_mark and in
// gpu_confirmed before its gpu_devs entry names the slot.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_GPUS);
	__type(key, __u32); // slot (gpu_devs)
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

// What a name is expected as: its class, and the cgroups it may be made
// in (the runtime's parents: /docker, /system.slice, kubelet's kubepods
// cgroups, by their ids; 0 is none). The same name made anywhere else, or
// by a user other than root (the owner of a delegated subtree makes any
// name in it), is a look-alike and stays unclassified.
#define EXPECT_PARENTS 4
struct cgroup_expect {
	__u32 prio; // enum prio
	__u32 pad;
	__u64 parents[EXPECT_PARENTS];
};

// expect_cgroup: user space only, one per container or pod it was told
// is coming (Docker's create event, the informer, NRI), gone with it:
// bounded by the node's workloads. Full: ExpectCgroup fails (logged), the
// workload is classified when user space sees it start and its first opens
// are judged after the fact; gpud reports the map from 80 %.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct cgroup_name);
	__type(value, struct cgroup_expect);
} expect_cgroup SEC(".maps");

// Written by the kernel only: when a high-priority open of the GPU was last
// let through or completed. A low open is denied while this is newer than
// what user space has confirmed in gpu_confirmed, so the GPU counts as held
// by high priority from the decision on, before user space hears of it.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_GPUS);
	__type(key, __u32); // slot (gpu_devs)
	__type(value, __u64);
} gpu_high_mark SEC(".maps");

// Written by user space only, after gpu_policy: events up to this time
// (CLOCK_MONOTONIC) are reflected in gpu_policy.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_GPUS);
	__type(key, __u32); // slot (gpu_devs)
	__type(value, __u64);
} gpu_confirmed SEC(".maps");

// The GPUs a pod with GPU memory shares (gpud's DRA claims) may open, by
// the pod's cgroup: a bit per GPU index. A cgroup with no fenced ancestor
// is not fenced (default-allow); share_fences is how many entries user
// space keeps here, so that the gate skips the walk while nothing is shared.
struct gpu_set {
	__u64 bits[MAX_GPUS / 64];
};

// share_fence: user space only, one per pod holding a DRA share on this
// node (bounded by the node's pods). Full: FenceCgroup fails (logged) and
// that pod is judged by the share rule after the fact; reported from 80 %.
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

// deny_reported: the gate, per refused (cgroup, GPU). An LRU: forgetting
// an entry only reports a refusal again (a rate limit, no protection).
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct deny_key);
	__type(value, __u64);
} deny_reported SEC(".maps");

#define DENY_REPORT_INTERVAL_NS (100ULL * 1000 * 1000)

// scm_socks: AF_UNIX sockets on which a holder queued fds (SCM_RIGHTS),
// marked by the sending side of the sock tracepoints and dropped by the
// receive that leaves none queued. Anyone holding a GPU fd can add entries
// (one per socket with fds in flight), so it is an LRU: a stale entry (a
// socket closed with fds unread) goes first; a mark evicted by 16384 newer
// ones loses that receive's report, and the receiver is found by the next
// /proc reconciliation.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);   // struct sock pointer of the receiving socket
	__type(value, __u64); // when it was marked (CLOCK_MONOTONIC)
} scm_socks SEC(".maps");

// events: full drops an event (counted in dropped), and user space
// answers every drop with a full /proc reconciliation.
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
// *slot gets its slot in the per-GPU arrays.
static __always_inline int gpu_of_inode(struct inode *ino, __u32 *slot)
{
	if (!ino)
		return -1;
	umode_t mode = BPF_CORE_READ(ino, i_mode);
	if ((mode & S_IFMT) != S_IFCHR)
		return -1;
	__u32 rdev = BPF_CORE_READ(ino, i_rdev);
	struct gpu_dev *gd = bpf_map_lookup_elem(&gpu_devs, &rdev);
	if (!gd)
		return -1;
	*slot = gd->slot;
	return (int)gd->gpu;
}

// fd_file returns task t's file at fd, or NULL.
static __always_inline struct file *fd_file(struct task_struct *t, long fd)
{
	struct files_struct *files = BPF_CORE_READ(t, files);
	if (!files)
		return NULL;
	struct fdtable *fdt = BPF_CORE_READ(files, fdt);
	if (!fdt)
		return NULL;
	unsigned int max = BPF_CORE_READ(fdt, max_fds);
	if (fd < 0 || (unsigned long)fd >= max)
		return NULL;
	struct file **arr = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	if (bpf_probe_read_kernel(&f, sizeof(f), &arr[fd]))
		return NULL;
	return f;
}

// fd_gpu returns the GPU index behind fd of task t, or -1; *slot gets the
// GPU's slot.
static __always_inline int fd_gpu(struct task_struct *t, long fd, __u32 *slot)
{
	struct file *f = fd_file(t, fd);
	if (!f)
		return -1;
	return gpu_of_inode(BPF_CORE_READ(f, f_inode), slot);
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

// holder_byte is tgid's byte in holder_tgids (NULL past PID_MAX_LIMIT,
// which no kernel gives). One byte per process, so setting and clearing
// are plain stores (no atomics: 5.10 has none but add).
static __always_inline __u8 *holder_byte(__u32 tgid)
{
	__u32 slot = tgid / HOLDER_SLOT;
	struct holder_slot *s = bpf_map_lookup_elem(&holder_tgids, &slot);
	if (!s)
		return NULL;
	return &s->tgid[tgid & (HOLDER_SLOT - 1)];
}

static __always_inline int is_holder(__u32 tgid)
{
	__u8 *b = holder_byte(tgid);
	return b && *b;
}

static __always_inline void mark_holder(__u32 tgid)
{
	__u8 *b = holder_byte(tgid);
	if (b)
		*b = 1;
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

// deny refuses an open from cgroup on gpu (the gate's verdict 0, EPERM),
// reporting it to user space at most once per DENY_REPORT_INTERVAL_NS for
// that (cgroup, GPU).
static __always_inline int deny(__u32 gpu, __u64 cgroup, __u64 now)
{
	struct deny_key dk = {.cgroup = cgroup, .gpu = gpu};
	__u64 *last = bpf_map_lookup_elem(&deny_reported, &dk);
	if (!last || now - *last > DENY_REPORT_INTERVAL_NS) {
		bpf_map_update_elem(&deny_reported, &dk, &now, BPF_ANY);
		gate_event(EV_DENY, gpu, cgroup);
	}
	return 0;
}

// report_open reports a GPU open the gate lets through (EV_OPEN, fd
// unknown: user space reads the opener's fd table): under --hooks driver
// for every open, otherwise when pending has no room for the mark.
static __always_inline int report_open(__u32 mark, __u32 slot, __u32 gpu)
{
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
		__u64 *hmark = bpf_map_lookup_elem(&gpu_high_mark, &slot);
		if (hmark)
			*hmark = bpf_ktime_get_ns();
	}
	return 1;
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
	struct gpu_dev *gd = bpf_map_lookup_elem(&gpu_devs, &rdev);
	if (!gd)
		return 1;
	__u32 gpu = gd->gpu, slot = gd->slot;
	__u32 mark = MARK_GPU;

	// The heartbeat is read before the time, and one not older than the
	// time is fresh: read the other way round, a heartbeat written between
	// the two reads was newer than the time, its unsigned age enormous, and
	// the gate failed open for that open.
	__u64 beat = heartbeat_ns;
	asm volatile("" ::: "memory");
	__u64 now = bpf_ktime_get_ns();
	if (enforcing && (beat >= now || now - beat < fail_open_after_ns)) {
		int fence = share_fences ? share_fence_of(gpu) : FENCE_NONE;
		if (fence == FENCE_OUT)
			return 0; // EPERM: a sharing pod opens a GPU it has no share of
		struct gpu_pol *pol = bpf_map_lookup_elem(&gpu_policy, &slot);
		if (fence == FENCE_NONE && pol && pol->shared) {
			// A GPU shared by memory is opened by its claimants (FENCE_IN),
			// agents and host processes only (cgroups user space never
			// classifies: they stay default-allowed). Any workload gpud
			// knows without a share of it, whatever its class, is refused.
			int reserved_ok = 0;
			__u64 matched = 0;
			if (classify(0, &reserved_ok, &matched) != PRIO_NONE) {
				return deny(gpu, matched, now); // EPERM
			}
		}
		__u64 *hmark = bpf_map_lookup_elem(&gpu_high_mark, &slot);
		__u64 *conf = bpf_map_lookup_elem(&gpu_confirmed, &slot);
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
					return deny(gpu, matched, now); // EPERM
				}
			}
		}
	}

	if (report_opens)
		return report_open(mark, slot, gpu);
	__u64 task = bpf_get_current_task();
	if (bpf_map_update_elem(&pending, &task, &mark, BPF_NOEXIST) == 0)
		__sync_fetch_and_add(&pending_marks, 1);
	else if (bpf_map_update_elem(&pending, &task, &mark, BPF_EXIST) != 0) {
		// pending is full (a user's many live threads opened or
		// access()ed a GPU node): no open goes unseen for it, the gate
		// reports this one itself, as under --hooks driver.
		__sync_fetch_and_add(&pending_full, 1);
		return report_open(mark, slot, gpu);
	}
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
	__u32 slot = 0;
	int gpu = fd_gpu((struct task_struct *)task, ret, &slot);
	if (gpu < 0)
		return 0;
	mark_holder(tgid);
	emit(EV_OPEN, (__u32)id, tgid, 0, ret, gpu);
	if (mark & MARK_HIGH) {
		// Marked again after the event is queued: user space cannot confirm
		// past this mark before it has read the event.
		__u64 *hmark = bpf_map_lookup_elem(&gpu_high_mark, &slot);
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
	if (holders_only && !is_holder(tgid))
		return 0;
	if (is_consumer(tgid))
		return 0;
	__u32 slot = 0;
	int gpu = fd_gpu((struct task_struct *)bpf_get_current_task(), ret, &slot);
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
	if (!is_holder(tgid) || is_consumer(tgid))
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
	if (!is_holder(tgid))
		return 0;
	long fd = (long)(int)fd_arg;
	__u32 slot = 0;
	int gpu = fd_gpu((struct task_struct *)bpf_get_current_task(), fd, &slot);
	if (gpu < 0 || is_consumer(tgid))
		return 0;
	emit(EV_CLOSE, (__u32)id, tgid, 0, fd, gpu);
	return 0;
}

// fds passed over unix sockets (SCM_RIGHTS), --hooks syscalls on a kernel
// without the sock tracepoints: at the exit of recvmsg and recvmmsg on an
// AF_UNIX socket, the control data the kernel wrote says whether fds came
// in; if so, user space reconciles the receiver. Read at the exit, from the
// syscall's own registers, so a receiver that was already waiting inside
// recvmsg when the fds were sent is seen too; nothing is needed at the
// send (sendmsg, sendmmsg).

static __always_inline int fd_is_unix_socket(long fd)
{
	struct file *f = fd_file((struct task_struct *)bpf_get_current_task(), fd);
	if (!f)
		return 0;
	umode_t mode = BPF_CORE_READ(f, f_inode, i_mode);
	if ((mode & S_IFMT) != S_IFSOCK)
		return 0;
	struct socket *sock = BPF_CORE_READ(f, private_data);
	if (!sock)
		return 0;
	return BPF_CORE_READ(sock, sk, __sk_common.skc_family) == AF_UNIX;
}

// A received message's control messages looked at: SCM_RIGHTS comes after
// SCM_CREDENTIALS, SCM_PIDFD and SCM_SECURITY at most.
#define SCM_CMSGS 6
// recvmmsg's messages looked at one by one; past them, the receiver is
// reconciled whatever they hold.
#define SCM_MMSGS 8

// scm_rights_in: the received struct user_msghdr at msg carries SCM_RIGHTS
// (1), or might (1: more control messages than SCM_CMSGS), or does not (0).
static __always_inline int scm_rights_in(void *msg)
{
	__u64 control = 0, controllen = 0;
	if (bpf_probe_read_user(&controllen, sizeof(controllen), msg + USER_MSGHDR_CONTROLLEN_OFF) ||
	    bpf_probe_read_user(&control, sizeof(control), msg + USER_MSGHDR_CONTROL_OFF))
		return 0;
	__u64 off = 0;
	for (int i = 0; i < SCM_CMSGS; i++) {
		struct {
			__u64 len;
			__s32 level;
			__s32 type;
		} h;
		if (off + sizeof(h) > controllen)
			return 0;
		if (bpf_probe_read_user(&h, sizeof(h), (void *)(control + off)))
			return 0;
		if (h.level == SOL_SOCKET && h.type == SCM_RIGHTS)
			return 1;
		if (h.len < sizeof(h))
			return 0;
		off += (h.len + 7) & ~7ULL;
	}
	return off + 16 <= controllen;
}

// passed_fd_received: the current task received fds by SCM_RIGHTS (one
// may be a GPU's): it becomes a holder, and user space reconciles it from
// /proc/<pid>/fd (EV_RESYNC). The consumer (gpud itself) is left alone.
static __always_inline int passed_fd_received(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (is_consumer(tgid))
		return 0;
	mark_holder(tgid);
	emit(EV_RESYNC, (__u32)id, tgid, 0, -1, -1);
	return 0;
}

static __always_inline int exit_recvmsg(long fd, void *msg, long ret, int many)
{
	if (!monitoring || sock_hooks || ret < 0 || (many && ret == 0))
		return 0;
	if (!fd_is_unix_socket(fd))
		return 0;
	int got = 0;
	if (!many) {
		got = scm_rights_in(msg);
	} else {
		for (int i = 0; i < SCM_MMSGS; i++) {
			if (i >= ret)
				break;
			if (scm_rights_in(msg + i * MMSGHDR_SIZE)) {
				got = 1;
				break;
			}
		}
		if (ret > SCM_MMSGS)
			got = 1;
	}
	if (!got)
		return 0;
	return passed_fd_received();
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
	// The registers still hold the arguments at exit (arm64's first is
	// orig_x0, SYSCALL_ARG1).
	case NR_recvmsg:
		return exit_recvmsg((int)SYSCALL_ARG1(regs), (void *)SYSCALL_ARG2(regs), ret, 0);
	case NR_recvmmsg:
		return exit_recvmsg((int)SYSCALL_ARG1(regs), (void *)SYSCALL_ARG2(regs), ret, 1);
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
	__u32 slot = 0;
	int gpu = gpu_of_inode(ino, &slot);
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
	__u32 slot = 0;
	int gpu = gpu_of_inode(BPF_CORE_READ(f, f_inode), &slot);
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
// Passed descriptors without kprobes (the sock tracepoints, Linux 6.3+):
// nothing on the syscall path, and only AF_UNIX sockets go past the first
// compare. A holder that queues fds on a socket marks that (receiving)
// socket; the next receive on it asks user space to reconcile the receiver
// at once (EV_RESYNC: its fd table is read and the rules judge the new
// holder), recvmsg, recvmmsg and io_uring's alike, since every socket
// receive ends in sock_recvmsg. The send is seen at sk_data_ready:
// the message is queued and the receiver not woken yet, so a receiver
// that sleeps in recvmsg always finds the mark; a receiver already inside
// recvmsg may dequeue the message first, which the sender sees as an empty
// queue: it marks then too (it cannot tell whether that message carried
// fds). Where sk_data_ready is missing, sock_send_length (after the send)
// marks the sender's peer: connected sockets only, and a woken receiver
// can outrun it.

static __always_inline int unix_fds_queued(struct sock *sk)
{
	struct unix_sock *u = (struct unix_sock *)sk;
	if (!bpf_core_field_exists(u->scm_stat))
		return 1; // not counted on this kernel: assume some
	return BPF_CORE_READ(u, scm_stat.nr_fds.counter);
}

static __always_inline int scm_queued(struct sock *sk)
{
	if (!monitoring || !sk || BPF_CORE_READ(sk, __sk_common.skc_family) != AF_UNIX)
		return 0;
	if (!is_holder(bpf_get_current_pid_tgid() >> 32))
		return 0;
	if (unix_fds_queued(sk) == 0 && BPF_CORE_READ(sk, sk_receive_queue.qlen) != 0)
		return 0; // nothing passed, and the message is still queued
	__u64 key = (__u64)sk;
	__u64 now = bpf_ktime_get_ns();
	bpf_map_update_elem(&scm_socks, &key, &now, BPF_ANY);
	if (!scm_socks_used)
		scm_socks_used = 1;
	return 0;
}

// The sender queued a message on sk (the receiving socket).
SEC("tp_btf/sk_data_ready")
int BPF_PROG(on_sk_data_ready, const struct sock *sk)
{
	return scm_queued((struct sock *)sk);
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(on_sock_send, struct sock *sk, int ret, int flags)
{
	if (ret < 0 || !monitoring || BPF_CORE_READ(sk, __sk_common.skc_family) != AF_UNIX)
		return 0;
	return scm_queued(BPF_CORE_READ((struct unix_sock *)sk, peer));
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_sock_recv, struct sock *sk, int ret, int flags)
{
	if (!scm_socks_used || ret < 0 || !monitoring)
		return 0;
	__u64 key = (__u64)sk;
	if (!bpf_map_lookup_elem(&scm_socks, &key))
		return 0;
	if (unix_fds_queued(sk) == 0)
		bpf_map_delete_elem(&scm_socks, &key);
	return passed_fd_received();
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
	if (!is_holder(ptgid))
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
	if (!is_holder(tgid))
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
	if (!is_holder(tgid))
		return 0;
	// Only the last thread of the process closes its files.
	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return 0;
	__u8 *held = holder_byte(tgid);
	if (held)
		*held = 0;
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
	struct cgroup_expect *found = bpf_map_lookup_elem(&expect_cgroup, &key);
	if (!found)
		return 0;
	// Copied at once: user space replacing or removing another name's
	// expectation may reuse the element (gpu_devs says why).
	struct cgroup_expect ex = *found;
	struct cgroup_expect *e = &ex;
	// Only root makes a runtime's cgroups (runc, systemd, kubelet); the
	// uid is the init namespace's, so a container's root in a user
	// namespace is not root here.
	if ((__u32)bpf_get_current_uid_gid() != 0)
		return 0;
	// The parent through the css, not kernfs_node.parent (renamed
	// __parent in 6.15): the same fields on every kernel since 5.10.
	__u64 parent = BPF_CORE_READ(cgrp, self.parent, cgroup, kn, id);
	int in_place = 0;
	for (int i = 0; i < EXPECT_PARENTS; i++)
		if (parent && e->parents[i] == parent)
			in_place = 1;
	if (!in_place)
		return 0;
	// The id the gate's ancestor walk reads (kernfs node id).
	__u64 id = BPF_CORE_READ(cgrp, kn, id);
	__u32 p = e->prio;
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
