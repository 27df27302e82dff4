/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Minimal kernel types for gpud's programs. Field offsets are relocated at
 * load time against the running kernel's BTF (CO-RE), so only the fields we
 * read are declared; no full vmlinux.h is needed to build.
 */
#ifndef GPUD_H
#define GPUD_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

typedef unsigned short umode_t;
typedef __u32 dev_t;

#define S_IFMT 00170000
#define S_IFCHR 0020000
#define S_IFSOCK 0140000

typedef struct {
	int counter;
} atomic_t;

struct inode {
	umode_t i_mode;
	dev_t i_rdev;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
	void *private_data;
} __attribute__((preserve_access_index));

/* Passed descriptors (SCM_RIGHTS): an AF_UNIX socket, its peer, its
 * receive queue's length and the fds queued on it (scm_stat, 5.7+). */
struct sock_common {
	unsigned short skc_family;
} __attribute__((preserve_access_index));

struct sk_buff_head {
	__u32 qlen;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	struct sk_buff_head sk_receive_queue;
} __attribute__((preserve_access_index));

struct scm_stat {
	atomic_t nr_fds;
} __attribute__((preserve_access_index));

struct unix_sock {
	struct sock *peer;
	struct scm_stat scm_stat;
} __attribute__((preserve_access_index));

struct socket {
	struct sock *sk;
} __attribute__((preserve_access_index));

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct signal_struct {
	atomic_t live;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct files_struct *files;
	struct signal_struct *signal;
} __attribute__((preserve_access_index));

/* cgroup_mkdir/cgroup_rmdir: a new cgroup's kernfs node (its leaf name and
 * the id bpf_get_current_cgroup_id reports) and its hierarchy (0: v2). */
struct kernfs_node {
	const char *name;
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup_root {
	int hierarchy_id;
} __attribute__((preserve_access_index));

/* A cgroup's parent is read through its own css (cgroup->self.parent),
 * which every kernel since 5.10 has; kernfs_node.parent became __parent in
 * 6.15. */
struct cgroup;
struct cgroup_subsys_state {
	struct cgroup *cgroup;
	struct cgroup_subsys_state *parent;
} __attribute__((preserve_access_index));

struct cgroup {
	struct cgroup_subsys_state self;
	struct kernfs_node *kn;
	struct cgroup_root *root;
} __attribute__((preserve_access_index));

/*
 * Syscall registers and numbers, per architecture: bpf2go builds one object
 * for each (gen.go). The x86-64 one is loaded by the tests here; the arm64 one
 * is checked to offer the same programs and maps (objects_test.go).
 */
#if defined(__TARGET_ARCH_x86)
struct pt_regs {
	unsigned long di;
	unsigned long si;
	unsigned long orig_ax;
} __attribute__((preserve_access_index));
#define SYSCALL_NR(regs) ((regs)->orig_ax)
#define SYSCALL_ARG1(regs) ((regs)->di)
#define SYSCALL_ARG2(regs) ((regs)->si)
/* A kprobe's first two arguments (at function entry). */
#define KPROBE_ARG1(r) ((r)->di)
#define KPROBE_ARG2(r) ((r)->si)
#define NR_open 2
#define NR_close 3
#define NR_dup 32
#define NR_dup2 33
#define NR_sendmsg 46
#define NR_recvmsg 47
#define NR_fcntl 72
#define NR_openat 257
#define NR_dup3 292
#define NR_close_range 436
#define NR_openat2 437
#define NR_pidfd_getfd 438
#define NR_recvmmsg 299
#define NR_sendmmsg 307
#elif defined(__TARGET_ARCH_arm64)
struct pt_regs {
	unsigned long regs[31];
	unsigned long orig_x0;
	int syscallno;
} __attribute__((preserve_access_index));
#define SYSCALL_NR(regs) ((regs)->syscallno)
#define SYSCALL_ARG1(regs) ((regs)->orig_x0)
#define SYSCALL_ARG2(regs) ((regs)->regs[1])
#define KPROBE_ARG1(r) ((r)->regs[0])
#define KPROBE_ARG2(r) ((r)->regs[1])
#define NR_dup 23
#define NR_dup3 24
#define NR_fcntl 25
#define NR_openat 56
#define NR_close 57
#define NR_sendmsg 211
#define NR_recvmsg 212
#define NR_close_range 436
#define NR_openat2 437
#define NR_pidfd_getfd 438
#define NR_recvmmsg 243
#define NR_sendmmsg 269
#else
#error "unsupported architecture"
#endif

/* offsetof(struct user_msghdr, msg_control / msg_controllen) and
 * sizeof(struct mmsghdr), on 64-bit */
#define USER_MSGHDR_CONTROL_OFF 32
#define USER_MSGHDR_CONTROLLEN_OFF 40
#define MMSGHDR_SIZE 64
#define AF_UNIX 1
#define SOL_SOCKET 1
#define SCM_RIGHTS 1

enum event_type {
	EV_OPEN = 1,   /* a GPU fd appeared in a process (open, dup, pidfd_getfd) */
	EV_CLOSE = 2,  /* a GPU fd is being closed */
	EV_FORK = 3,   /* a holder forked: reconcile the child */
	EV_EXEC = 4,   /* a holder exec'd: reconcile (O_CLOEXEC) */
	EV_EXIT = 5,   /* a holder's last thread exited */
	EV_RESYNC = 6, /* fds changed in bulk (dup2/dup3/close_range/SCM_RIGHTS): reconcile */
	EV_GATE_HIGH = 7, /* the gate let a high-priority open of a GPU with low holders through */
	EV_DENY = 8,      /* the gate refused a low-priority open */
	EV_RELEASE = 9,   /* a GPU file's last reference went (driver release): reconcile its holders */
};

/* EV_OPEN's fd when the hook sees the file before it has an fd (the
 * driver's open, receive_fd): user space reads the process's fd table. */
#define FD_UNKNOWN (-2147483647 - 1)
/* ...and its ppid, when the gate marked the GPU high for that open. */
#define OPEN_MARKED_HIGH 1

enum prio {
	PRIO_NONE = 0, /* unknown cgroup: allowed, never blocks anyone */
	PRIO_HIGH = 1,
	PRIO_LOW = 2,
	/* a workload gpud knows whose class the table does not enforce
	 * (unmanaged or unclassified): the table ignores it, but it is no
	 * claimant, agent or host process, so a shared GPU refuses it */
	PRIO_WORKLOAD = 3,
};

/* What user space tells the gate about one GPU (gpu_policy). */
struct gpu_pol {
	__u32 high;              /* high-priority holders (processes) */
	__u32 low;               /* low-priority holders */
	__u64 reserved_cgroup;   /* a reservation: only this cgroup (or its descendants) may open low */
	__u64 reserved_until_ns; /* CLOCK_MONOTONIC */
	__u32 shared;            /* shared by memory (DRA shares): the table does not apply, the share fence does */
	__u32 _pad;
};

#define MAX_GPUS 256

/* gpu_devs' value: a GPU's index (user space's name for it, in events) and
 * its slot (< MAX_GPUS) in the per-GPU arrays. */
struct gpu_dev {
	__u32 gpu;
	__u32 slot;
};
/* expect_cgroup's key: a cgroup's leaf name, NUL-padded (user space refuses
 * names of CGROUP_NAME_LEN - 1 bytes or more, so a truncated read never
 * matches). */
#define CGROUP_NAME_LEN 128
#define MAX_CGROUP_DEPTH 16

struct event {
	__u64 ts; /* CLOCK_MONOTONIC ns */
	__u64 cgroup_id;
	__u32 type;
	__u32 pid;
	__u32 tgid;
	__u32 ppid;
	__s32 fd;
	__s32 gpu;
	char comm[16];
};

#endif
