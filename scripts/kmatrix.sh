#!/usr/bin/env bash
# scripts/kmatrix.sh — gpud's BPF and daemon tests on the kernels GPU fleets
# run, each booted in qemu/KVM: Debian bullseye (5.10), bookworm (6.1) and
# trixie (6.12).
#
# Why: only the host's kernel ever loaded gpud's objects; the gate's helpers,
# BTF tracepoints and cgroup/dev programs differ between kernels. Fleets run
# distribution kernels, so these are Debian's own signed images.
#
# How: the kernel packages come from Debian's archive through a private apt
# configuration under the cache (the host's sources.list is not touched) with
# `apt-get download` and are unpacked with `dpkg -x`: never installed on the
# host. Each kernel boots with a tiny initramfs (busybox-static and the 9p
# modules of that kernel) that mounts the host's / read-only over virtio-9p,
# puts tmpfs, devtmpfs, proc, sysfs, cgroup2 and bpffs over it, and chroots
# into it to run `go test -c` binaries built on the host (so the guest runs
# the same binaries, shell and libraries as the host). Each test binary's
# verdict and what loaded go to the serial console, parsed here.
#
# Cache: $GPUD_KERNEL_CACHE (default /var/cache/gpud-kernels), outside the
# repo like /var/cache/gpud-k8s: apt lists, .debs, unpacked kernels,
# initramfs. A warm run takes about a minute per kernel.
#
# Usage: scripts/kmatrix.sh [SUITE...]   (default: bullseye bookworm trixie)
# Env: GO, KMATRIX_MEM (MiB per guest, default 1536), KMATRIX_TIMEOUT (s per
# kernel, default 480), KMATRIX_OUT (directory for the per-kernel logs and
# the summary, default $CACHE/last), KMATRIX_BENCH (empty; "only": instead of
# the tests, BenchmarkSyscallTax with --hooks driver's kprobes attached, its
# output in $KMATRIX_OUT/SUITE.bench.txt for tools/benchreport — `make bench`
# runs it; KMATRIX_TAX_ROUNDS (1) and KMATRIX_TAX_DIVIDE (20) size it: TCG
# emulates the guest, so only its ratios mean anything).
# Exit: 0 when every test binary passed on every kernel.
set -euo pipefail

CACHE=${GPUD_KERNEL_CACHE:-/var/cache/gpud-kernels}
GO=${GO:-go}
MEM=${KMATRIX_MEM:-1536}
TIMEOUT=${KMATRIX_TIMEOUT:-480}
OUT=${KMATRIX_OUT:-$CACHE/last}
# tcg (default) or kvm. On the CI machine, itself a VM, the guest kernels
# hang right after the boot loader under nested KVM; TCG boots them in
# seconds and runs the tests at a fraction of native speed.
ACCEL=${KMATRIX_ACCEL:-tcg}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=${KMATRIX_BENCH:-}
[[ -z $BENCH || $BENCH == only ]] || { echo "kmatrix.sh: KMATRIX_BENCH=$BENCH: want empty or only" >&2; exit 1; }
# The guest's scripts and test binaries; a benchmark run has its own, so that
# it does not pull them from under a test run of the matrix.
RUN=$CACHE/run
[[ -z $BENCH ]] || RUN=$CACHE/run-bench

die() { echo "kmatrix.sh: $*" >&2; exit 1; }
log() { echo "kmatrix.sh: $*" >&2; }

[[ $(id -u) -eq 0 ]] || die "needs root (KVM, the chroot in the guest, BPF)"
[[ $(uname -m) == x86_64 ]] || die "amd64 hosts only (the kernels are Debian's amd64 images)"
[[ $ACCEL != kvm || -c /dev/kvm ]] || die "KMATRIX_ACCEL=kvm but no /dev/kvm"

SUITES=("$@")
[[ ${#SUITES[@]} -gt 0 ]] || SUITES=(bullseye bookworm trixie)

APTDIR=$CACHE/apt
APT_OPTS=(
	-o "Dir::Etc::SourceList=$APTDIR/etc/sources.list" -o Dir::Etc::SourceParts=-
	-o Dir::Etc::Preferences=- -o "Dir::Etc::PreferencesParts=$APTDIR/etc/preferences.d"
	-o "Dir::State=$APTDIR/state" -o "Dir::Cache=$APTDIR/cache"
	-o APT::Architecture=amd64 -o Acquire::Languages=none -o APT::Sandbox::User=root -q
)

# apt_setup: the private apt configuration, its lists refreshed once a day.
apt_setup() {
	mkdir -p "$APTDIR"/etc/preferences.d "$APTDIR"/state/lists/partial "$APTDIR"/cache/archives/partial
	local s
	: >"$APTDIR/etc/sources.list.new"
	for s in "${SUITES[@]}"; do
		echo "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $s main" >>"$APTDIR/etc/sources.list.new"
	done
	if ! cmp -s "$APTDIR/etc/sources.list.new" "$APTDIR/etc/sources.list" ||
		[[ -z $(find "$APTDIR/state/lists" -maxdepth 1 -name '*_Packages' -mtime -1 2>/dev/null) ]]; then
		mv "$APTDIR/etc/sources.list.new" "$APTDIR/etc/sources.list"
		apt-get "${APT_OPTS[@]}" -o DPkg::Lock::Timeout=600 update >"$CACHE/apt-update.log" 2>&1 ||
			{ cat "$CACHE/apt-update.log" >&2; die "apt-get update (private lists) failed"; }
	else
		rm -f "$APTDIR/etc/sources.list.new"
	fi
}

# kernel_pkg SUITE: the versioned image package linux-image-amd64 of SUITE
# depends on (e.g. linux-image-6.1.0-50-amd64).
kernel_pkg() {
	local ver pkg
	ver=$(apt-cache "${APT_OPTS[@]}" madison linux-image-amd64 | awk -F' *\\| *' -v s="debian $1/main" 'index($3, s) { print $2; exit }')
	[[ -n $ver ]] || die "no linux-image-amd64 in $1"
	pkg=$(apt-cache "${APT_OPTS[@]}" show "linux-image-amd64=$ver" | sed -n 's/^Depends: \(linux-image-[^ ,]*\).*/\1/p' | head -1)
	[[ -n $pkg ]] || die "linux-image-amd64=$ver ($1): no image dependency"
	echo "$pkg"
}

# fetch PKG: the unpacked package under $CACHE/k/PKG (once).
fetch() {
	local pkg=$1 dir=$CACHE/k/$1
	if [[ -f $dir/.done ]]; then
		echo "$dir"
		return
	fi
	rm -rf "$dir" "$CACHE/debs/$pkg"
	mkdir -p "$CACHE/debs/$pkg" "$dir"
	(cd "$CACHE/debs/$pkg" && apt-get "${APT_OPTS[@]}" download "$pkg" >/dev/null) ||
		die "apt-get download $pkg failed"
	dpkg -x "$CACHE/debs/$pkg"/*.deb "$dir/root" || die "dpkg -x $pkg failed"
	rm -rf "$CACHE/debs/$pkg"
	touch "$dir/.done"
	echo "$dir"
}

# modules_closure MODDIR NAME...: the .ko files NAME and their dependencies
# need, dependencies first (modinfo reads each file; no modules.dep needed).
modules_closure() {
	local moddir=$1 name f dep
	shift
	declare -gA _seen=()
	_visit() {
		local n=${1//-/_} f
		[[ -z ${_seen[$n]:-} ]] || return 0
		_seen[$n]=1
		f=$(find "$moddir" \( -name "$n.ko" -o -name "$n.ko.xz" -o -name "${n//_/-}.ko" -o -name "${n//_/-}.ko.xz" \) | head -1)
		[[ -n $f ]] || return 0 # built in
		local deps
		deps=$(modinfo -F depends "$f" | tr ',' ' ')
		for dep in $deps; do _visit "$dep"; done
		echo "$f"
	}
	for name in "$@"; do _visit "$name"; done
}

# initramfs KDIR: $KDIR/initrd.cpio.gz, busybox and the modules the guest
# loads (virtio-pci and 9p to reach the host's /, fuse for the fake GPU
# numbered 10:229), decompressed, in load order.
initramfs() {
	local kdir=$1 r moddir f bb
	[[ -f $kdir/initrd.cpio.gz && $kdir/initrd.cpio.gz -nt $0 ]] && return
	bb=$(command -v busybox) || die "busybox-static missing (scripts/deps.sh kmatrix)"
	r=$(mktemp -d "$CACHE/initrd.XXXXXX")
	mkdir -p "$r"/{bin,dev,proc,sys,host,mod}
	cp "$bb" "$r/bin/busybox"
	for a in sh mount insmod mkdir chroot poweroff cat echo sleep sed cp; do ln -s busybox "$r/bin/$a"; done
	moddir=$(ls -d "$kdir"/root/lib/modules/*/ "$kdir"/root/usr/lib/modules/*/ 2>/dev/null | head -1 || true)
	[[ -n $moddir ]] || die "no modules in $kdir"
	: >"$r/mod/order"
	while read -r f; do
		local b=${f##*/}
		if [[ $b == *.xz ]]; then
			xz -dc "$f" >"$r/mod/${b%.xz}"
			b=${b%.xz}
		else
			cp "$f" "$r/mod/$b"
		fi
		echo "$b" >>"$r/mod/order"
	done < <(modules_closure "$moddir" virtio_pci 9pnet_virtio 9p fuse)
	cat >"$r/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
while read -r m; do insmod /mod/$m || echo "KMATRIX insmod $m failed"; done </mod/order
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host /host || echo "KMATRIX no host fs"
H=/host
mount -t proc proc $H/proc
mount -t sysfs sys $H/sys
mount -t devtmpfs dev $H/dev
mkdir -p $H/dev/pts $H/dev/shm 2>/dev/null
# The checkout (kmatrix.root= on the command line) may be under a directory
# the tmpfs mounts below cover (a clone in /tmp): keep it at its path.
src=$(sed -n 's/.*kmatrix\.root=\([^ ]*\).*/\1/p' /proc/cmdline)
mkdir -p /src
[ -n "$src" ] && mount -o bind $H$src /src
# What udev/systemd would add: bash's process substitution needs /dev/fd.
ln -s /proc/self/fd $H/dev/fd
ln -s /proc/self/fd/0 $H/dev/stdin
ln -s /proc/self/fd/1 $H/dev/stdout
ln -s /proc/self/fd/2 $H/dev/stderr
mount -t devpts devpts $H/dev/pts
mount -t tmpfs tmpfs $H/dev/shm
mount -t tmpfs -o mode=1777 tmpfs $H/tmp
mount -t tmpfs tmpfs $H/run
# fuse's module file, for the test that unloads and reloads the stand-in
# driver (TestDriverHooksModuleReload): /mod is not visible after chroot.
mkdir -p $H/run/kmatrix && cp /mod/fuse.ko $H/run/kmatrix/ 2>/dev/null
mount -t tmpfs tmpfs $H/root
mount -t cgroup2 cgroup2 $H/sys/fs/cgroup
mount -t bpf bpf $H/sys/fs/bpf
mount -t tracefs tracefs $H/sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs $H/sys/kernel/debug 2>/dev/null
if [ -n "$src" ] && [ ! -d $H$src/bpf ]; then
	mkdir -p $H$src && mount -o bind /src $H$src
fi
guest=$(sed -n 's/.*kmatrix\.guest=\([^ ]*\).*/\1/p' /proc/cmdline)
chroot $H /bin/bash ${guest:-KMATRIX_GUEST}
echo "KMATRIX DONE"
poweroff -f
INIT
	sed -i "s|KMATRIX_GUEST|$CACHE/run/guest.sh|" "$r/init"
	chmod 0755 "$r/init"
	(cd "$r" && find . | cpio -o -H newc --quiet | gzip -1) >"$kdir/initrd.cpio.gz.new"
	mv "$kdir/initrd.cpio.gz.new" "$kdir/initrd.cpio.gz"
	rm -rf "$r"
}

# The tests the guests run: the BPF package whole, and the daemon's tests
# that need fake GPUs only. There is no Docker engine in the guest, so the
# gate/bypass/crash tests (workloads in containers) are not among them.
DAEMON_TESTS='^(TestFDLifecycle|TestForkExecExit|TestFDPassing|TestStartupFindsExistingHolder|TestMonitoringSwitch|TestGateOddDeviceNodes|TestDriverHooksFollowModuleReload)$'

build_tests() {
	rm -rf "$RUN"
	mkdir -p "$RUN/bin"
	(cd "$ROOT" && "$GO" test -c -o "$RUN/bin/bpf.test" ./bpf/ &&
		"$GO" test -c -o "$RUN/bin/daemon.test" ./internal/daemon/) ||
		die "building the test binaries failed"
	if [[ -n $BENCH ]]; then
		[[ -x $ROOT/bin/gpud ]] || die "KMATRIX_BENCH: no $ROOT/bin/gpud (make build)"
		cat >"$RUN/guest.sh" <<GUEST
#!/bin/bash
# Runs in the guest: the syscall-tax benchmark only (scripts/bench.sh).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root CI=true TMPDIR=/tmp
export GPUD_TAX_ROUNDS=${KMATRIX_TAX_ROUNDS:-1} GPUD_TAX_DIVIDE=${KMATRIX_TAX_DIVIDE:-20}
echo "KMATRIX KERNEL \$(uname -r)"
echo "KMATRIX BEGIN bench"
(cd $ROOT/internal/daemon && $RUN/bin/daemon.test -test.run '^\$' -test.bench '^BenchmarkSyscallTax\$' -test.benchtime 1x -test.count 1 -test.timeout 10m 2>&1)
echo "KMATRIX RC bench \$?"
GUEST
		chmod 0755 "$RUN/guest.sh"
		return
	fi
	cat >"$RUN/guest.sh" <<GUEST
#!/bin/bash
# Runs in the guest, chrooted into the host's / (read-only; tmpfs on /tmp).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root CI=true TMPDIR=/tmp
echo "KMATRIX KERNEL \$(uname -r)"
[ -f /run/kmatrix/fuse.ko ] && export GPUD_TEST_FUSE_KO=/run/kmatrix/fuse.ko
run() {
	local name=\$1 dir=\$2; shift 2
	echo "KMATRIX BEGIN \$name"
	(cd "\$dir" && "\$@" 2>&1) | tee /tmp/\$name.out
	echo "KMATRIX RC \$name \${PIPESTATUS[0]}"
}
run bpf $ROOT/bpf $RUN/bin/bpf.test -test.v -test.count=1 -test.timeout=5m
# A kernel that refuses the gate (TestGateVerdicts says so) runs gpud
# observe-only: there the gate reports no opens, and --hooks syscalls is
# the documented configuration (sys_exit checks each new fd itself).
if grep -q 'gate refused by this kernel' /tmp/bpf.out; then
	echo "KMATRIX GATE refused: daemon tests with GPUD_TEST_HOOKS=syscalls"
	# --hooks driver must still start there (opens found by /proc scans).
	GPUD_TEST_HOOKS=driver run daemon-driver $ROOT/internal/daemon $RUN/bin/daemon.test -test.v -test.count=1 -test.timeout=5m -test.run '^TestStartupFindsExistingHolder\$'
	export GPUD_TEST_HOOKS=syscalls
else
	echo "KMATRIX GATE loaded"
fi
run daemon $ROOT/internal/daemon $RUN/bin/daemon.test -test.v -test.count=1 -test.timeout=5m -test.run '$DAEMON_TESTS'
GUEST
	chmod 0755 "$RUN/guest.sh"
}

# boot KDIR LOG: the kernel in qemu/KVM, its console in LOG.
boot() {
	local kdir=$1 logf=$2 vmlinuz
	vmlinuz=$(ls "$kdir"/root/boot/vmlinuz-*)
	local machine=(-machine q35 -accel tcg,thread=single -cpu max)
	# arch-capabilities off: nested KVM refuses that MSR.
	[[ $ACCEL == kvm ]] && machine=(-machine q35,accel=kvm -cpu host,-arch-capabilities)
	timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 "${machine[@]}" \
		-smp 2 -m "$MEM" -nographic -no-reboot -nodefaults -serial stdio \
		-kernel "$vmlinuz" -initrd "$kdir/initrd.cpio.gz" \
		-append "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=4 kmatrix.root=$ROOT kmatrix.guest=$RUN/guest.sh" \
		-fsdev local,id=hostfs,path=/,security_model=none,readonly=on \
		-device virtio-9p-pci,fsdev=hostfs,mount_tag=host \
		</dev/null >"$logf" 2>&1 || true
}

command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing (scripts/deps.sh kmatrix)"
mkdir -p "$CACHE" "$OUT"
apt_setup
build_tests
fail=0
summary=$OUT/summary.txt
: >"$summary"
for s in "${SUITES[@]}"; do
	pkg=$(kernel_pkg "$s")
	kdir=$(fetch "$pkg")
	initramfs "$kdir"
	logf=$OUT/$s.log
	start=$SECONDS
	boot "$kdir" "$logf"
	kver=$(sed -n 's/^KMATRIX KERNEL \([^[:space:]]*\).*/\1/p' "$logf" | head -1)
	gate=$(sed -n 's/^KMATRIX GATE \([a-z]*\).*/\1/p' "$logf" | head -1)
	extra=$(sed -n 's/^KMATRIX BEGIN \(daemon-driver\)[[:space:]]*$/\1/p' "$logf")
	tests="bpf daemon $extra"
	if [[ -n $BENCH ]]; then
		tests=bench
		# The benchmark's output, as tools/benchreport reads it.
		{
			echo "benchmeta: series kmatrix-$s"
			echo "benchmeta: kernel ${kver:-no-boot}"
			echo "benchmeta: cpu qemu TCG (emulated: ratios only)"
			echo "benchmeta: date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
			sed -n '/^KMATRIX BEGIN bench[[:space:]]*$/,/^KMATRIX RC bench /p' "$logf" | tr -d '\r' | grep -v '^KMATRIX'
		} >"$OUT/$s.bench.txt"
	fi
	for t in $tests; do
		rc=$(sed -n "s/^KMATRIX RC $t \([0-9]*\).*/\1/p" "$logf" | head -1)
		pass=$(sed -n "/^KMATRIX BEGIN $t[[:space:]]*\$/,/^KMATRIX RC $t /p" "$logf" | grep -c -- '^--- PASS' || true)
		failed=$(sed -n "/^KMATRIX BEGIN $t[[:space:]]*\$/,/^KMATRIX RC $t /p" "$logf" | grep -- '^--- FAIL' | awk '{print $3}' | tr '\n' ' ' || true)
		skipped=$(sed -n "/^KMATRIX BEGIN $t[[:space:]]*\$/,/^KMATRIX RC $t /p" "$logf" | grep -c -- '^--- SKIP' || true)
		verdict=ok
		[[ $rc == 0 ]] || { verdict=FAIL; fail=1; }
		printf '%-9s %-22s gate=%-7s %-7s rc=%-4s passed=%-3s skipped=%-2s failed=%s (%ds)\n' \
			"$s" "${kver:-no-boot}" "${gate:-?}" "$t" "${rc:-none}" "$pass" "$skipped" "${failed:-none}" $((SECONDS - start)) | tee -a "$summary"
		# The guest's log stays on this machine: what failed goes to the
		# run's own output too (CI keeps only that).
		[[ $verdict == ok ]] || sed -n "/^KMATRIX BEGIN $t[[:space:]]*\$/,/^KMATRIX RC $t /p" "$logf" |
			grep -v -e '^=== RUN' -e '^--- PASS' -e '^KMATRIX' | tail -n 60 | sed "s/^/  $s $t| /" >&2
	done
done
[[ $fail == 0 ]] || die "failures (logs in $OUT)"
