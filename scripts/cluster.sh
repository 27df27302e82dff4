#!/usr/bin/env bash
# scripts/cluster.sh up|down|status|restart-kubelet|restart-containerd [DIR] — a real one-node
# Kubernetes cluster for gpud's tests, private to DIR.
#
# Why: gpud's Kubernetes side (device plugin registration, Allocate,
# PodResources, evictions, a DaemonSet) is only worth testing against a real
# kubelet and API server. Test machines have no registry and no Kubernetes
# packages, so the binaries come from scripts/k8s-build.sh (Go module proxy,
# Debian's etcd) and the images are built here: a static pause binary and the
# busybox-static rootfs, as single-layer OCI archives imported with `ctr`
# (gpud.local/pause:1 and gpud.local/busybox:1; pods need
# `imagePullPolicy: Never`). See /work/shared/test-cluster.md.
#
# up [DIR]    DIR defaults to a new /tmp/gpud-cluster.XXXXXX (printed on
#             stdout). Creates certificates, starts etcd, kube-apiserver, a
#             private containerd (own config/root/state/socket in DIR; built
#             by scripts/containerd-build.sh, 1.7 with NRI on at
#             /var/run/nri/nri.sock and CDI on, its specs read from
#             DIR/cdi: CDI_SPEC_DIR in DIR/env), kubelet,
#             kube-scheduler and kube-controller-manager, waits until the node
#             is Ready and a test pod runs, deletes the pod. Writes
#             DIR/kubeconfig (admin) and DIR/env (shell exports: KUBECONFIG,
#             CONTAINERD_SOCK, KUBELET_ROOT, NODE_NAME, *_PID, ...). If DIR is
#             already up and healthy, prints it and does nothing. On failure it
#             prints the logs' tails and cleans up (GPUD_CLUSTER_KEEP=1 keeps
#             everything for a look; `down` cleans it later).
# down [DIR]  Stops only what `up` started (pids and start times in DIR/run),
#             unmounts what kubelet/containerd left mounted, removes the pods'
#             cgroups, the CNI bridge, the kubelet files outside DIR that this
#             cluster created, then DIR. Works after a failed or killed `up`.
# status [DIR]            exit 0 all running, 1 something died, 3 not up.
# restart-kubelet [DIR]   stop kubelet and start it again (same flags).
# restart-containerd [DIR] the same for containerd (containers keep running).
#
# Without DIR, down/status/restart-kubelet use the cluster that is up
# (recorded in /run/gpud-cluster.active). One cluster per machine: the ports
# (6443, 2379/2380, 10250/10248), /var/lib/kubelet/device-plugins and the
# kubepods cgroups are machine-wide.
#
# Environment: GPUD_K8S_CACHE (binaries, default /var/cache/gpud-k8s),
# GPUD_NODE_NAME (default: hostname, lowercased), GPUD_POD_SUBNET (default
# 10.244.0.0/24; the bridge gpudk8s0 gets .1, the node IP),
# GPUD_CLUSTER_SA_ADMISSION=0 (turn the ServiceAccount admission plugin off).
#
# Outside DIR (all undone by `down`; directories removed only when this
# cluster created them): kubelet uses /var/lib/kubelet/device-plugins/
# (kubelet.sock, kubelet_internal_checkpoint) whatever its root dir,
# /var/log/containers/ (links into DIR), the kubepods cgroups, iptables chains
# (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) and kernel
# tunables (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops, ...:
# restored); containerd/CNI add /run/netns/cni-*, /var/lib/cni/results/,
# shim sockets in /run/containerd/s/ and the bridge gpudk8s0.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_VERSION=${K8S_VERSION:-v1.36.3}
BIN=${GPUD_K8S_CACHE:-/var/cache/gpud-k8s}/$K8S_VERSION/bin
IMG_CACHE=${GPUD_K8S_CACHE:-/var/cache/gpud-k8s}/images
# containerd with NRI (scripts/containerd-build.sh): first on PATH, so its
# shim and ctr are the ones used too. Docker's containerd stays Debian's.
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v1.7.35}
CONTAINERD_BIN=${GPUD_CONTAINERD_CACHE:-/var/cache/gpud-containerd}/$CONTAINERD_VERSION/bin
export PATH=$CONTAINERD_BIN:$PATH
# The runtime's NRI socket, at its default path: what gpud's DaemonSet mounts.
NRI_SOCK=/var/run/nri/nri.sock
ACTIVE=/run/gpud-cluster.active
MARKER=.gpud-cluster
NET_NAME=gpud-k8s
BRIDGE=gpudk8s0
POD_SUBNET=${GPUD_POD_SUBNET:-10.244.0.0/24}
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
CNI_BIN=/usr/lib/cni
CNI_CACHE=/var/lib/cni
KUBELET_VAR=/var/lib/kubelet
DP_DIR=$KUBELET_VAR/device-plugins
LOG_CONTAINERS=/var/log/containers
NETNS_DIR=/var/run/netns
SHIM_SOCK_DIR=/run/containerd/s
PAUSE_IMAGE=gpud.local/pause:1
BUSYBOX_IMAGE=gpud.local/busybox:1
BUSYBOX=/bin/busybox
PORTS=(6443 2379 2380 10250 10248)
# Start order (`down` stops kubelet first, then the others).
COMPONENTS=(etcd containerd kube-apiserver kubelet kube-scheduler kube-controller-manager)
K8S_CMDS=(kube-apiserver kubelet kube-scheduler kube-controller-manager kubectl etcd)
CGROUP_ROOT=/sys/fs/cgroup

die() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# GPUD_CLUSTER_VERBOSE=1: the time of each step of `up`.
step() { [[ ${GPUD_CLUSTER_VERBOSE:-0} != 1 ]] || log "+$(since "$T0")s $*"; }
T0=$(now)

# ---- processes ---------------------------------------------------------------

# Field 22 of /proc/PID/stat: the start time, which with the pid names a
# process uniquely (guards against pid reuse).
starttime() {
	local s
	s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	s=${s##*) }
	# shellcheck disable=SC2086
	set -- $s
	echo "${20}"
}


# The pid of component $1 of cluster $D if that very process still runs.
comp_pid() {
	local f=$D/run/$1.pid pid st
	[[ -s $f ]] || return 1
	read -r pid st <"$f" || true
	alive "$pid" && [[ $(starttime "$pid") == "$st" ]] && echo "$pid"
}

# start NAME CMD...: a daemon in its own session, logging to DIR/logs/NAME.log;
# the command line is kept in DIR/run/NAME.cmd (restart-kubelet).
start() {
	local name=$1
	shift
	printf '%q ' "$@" >"$D/run/$name.cmd"
	echo "=== $(date -Is) cluster.sh start $name" >>"$D/logs/$name.log"
	# In a non-interactive shell a background job is no group leader, so
	# setsid execs the command itself: $! is the daemon's pid.
	setsid "$@" </dev/null >>"$D/logs/$name.log" 2>&1 &
	local pid=$!
	disown "$pid"
	echo "$pid $(starttime "$pid")" >"$D/run/$name.pid"
}

# stop_pid PID NAME [TIMEOUT]: SIGTERM, then SIGKILL after TIMEOUT seconds.
stop_pid() {
	local pid=$1 name=$2 t=${3:-10} st
	st=$(starttime "$pid") || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	local deadline=$((SECONDS + t))
	while alive "$pid" && [[ $(starttime "$pid") == "$st" ]] && ((SECONDS < deadline)); do
		sleep 0.1
	done
	if alive "$pid" && [[ $(starttime "$pid") == "$st" ]]; then
		log "$name ($pid) ignored SIGTERM for ${t}s; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		while alive "$pid" && [[ $(starttime "$pid") == "$st" ]]; do sleep 0.05; done
	fi
}

stop_comp() {
	local pid
	if pid=$(comp_pid "$1"); then
		stop_pid "$pid" "$1" "${2:-10}"
	fi
	rm -f "$D/run/$1.pid"
}

log_tail() {
	local f
	for f in "$D"/logs/*.log; do
		[[ -f $f ]] || continue
		echo "----- $(basename "$f") (last ${1:-15} lines)" >&2
		tail -n "${1:-15}" "$f" >&2
	done
}

# wait_until DESC TIMEOUT COMPONENT CMD...: poll CMD every 0.1 s; fail early
# when COMPONENT (the process that should make it true) has died.
wait_until() {
	local desc=$1 t=$2 comp=$3
	shift 3
	local deadline
	deadline=$(awk -v a="$(now)" -v t="$t" 'BEGIN { printf "%.3f", a + t }')
	until "$@" >/dev/null 2>&1; do
		if [[ -n $comp ]] && ! comp_pid "$comp" >/dev/null; then
			die "$comp exited while waiting for $desc (log: $D/logs/$comp.log)"
		fi
		if awk -v a="$(now)" -v d="$deadline" 'BEGIN { exit !(a > d) }'; then
			die "timed out after ${t}s waiting for $desc"
		fi
		sleep 0.1
	done
}

kc() { "$BIN/kubectl" --kubeconfig "$D/kubeconfig" --cache-dir "$D/kubectl-cache" --request-timeout=10s "$@"; }
ctr_() { ctr -a "$D/containerd/containerd.sock" -n k8s.io "$@"; }

# ---- certificates --------------------------------------------------------------

write_openssl_cnf() {
	local node=$1 gw=$2
	cat >"$D/pki/openssl.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,digitalSignature,keyEncipherment,keyCertSign
subjectKeyIdentifier = hash
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
[apiserver]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
authorityKeyIdentifier = keyid
subjectAltName = DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:$node,IP:127.0.0.1,IP:$SERVICE_IP,IP:$gw
[kubelet]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
authorityKeyIdentifier = keyid
subjectAltName = DNS:localhost,DNS:$node,IP:127.0.0.1,IP:$gw
EOF
}

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# cert NAME SUBJECT EXTENSIONS
cert() {
	local p=$D/pki
	newkey "$p/$1.key"
	openssl req -new -key "$p/$1.key" -subj "$2" -config "$p/openssl.cnf" -out "$p/$1.csr"
	openssl x509 -req -in "$p/$1.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" \
		-set_serial "0x$(openssl rand -hex 12)" -days 3650 \
		-extfile "$p/openssl.cnf" -extensions "$3" -out "$p/$1.crt" 2>/dev/null
	rm -f "$p/$1.csr"
}

make_pki() {
	local node=$1 gw=$2 p=$D/pki
	write_openssl_cnf "$node" "$gw"
	newkey "$p/ca.key"
	openssl req -x509 -new -key "$p/ca.key" -subj "/CN=gpud-test-ca" -days 3650 \
		-config "$p/openssl.cnf" -extensions ca -out "$p/ca.crt"
	cert apiserver "/CN=kube-apiserver" apiserver
	cert admin "/O=system:masters/CN=gpud-test-admin" client
	cert kubelet-client "/O=system:nodes/CN=system:node:$node" client
	cert kubelet-serving "/CN=$node" kubelet
	cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client
	cert scheduler "/CN=system:kube-scheduler" client
	cert controller-manager "/CN=system:kube-controller-manager" client
	newkey "$p/sa.key"
	openssl pkey -in "$p/sa.key" -pubout -out "$p/sa.pub"
	chmod 0600 "$p"/*.key
}

# kubeconfig FILE NAME (certificates embedded: the file can be copied around)
kubeconfig() {
	local p=$D/pki
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gpud-test
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: $(base64 -w0 "$p/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$p/$2.crt")
    client-key-data: $(base64 -w0 "$p/$2.key")
contexts:
- name: gpud-test
  context:
    cluster: gpud-test
    user: $2
current-context: gpud-test
EOF
	chmod 0600 "$1"
}

# ---- images ----------------------------------------------------------------------

sha() { sha256sum "$1" | cut -d' ' -f1; }

# oci_archive OUT NAME ROOTFS CONFIG_JSON: a single-layer OCI image layout tar.
oci_archive() {
	local out=$1 name=$2 rootfs=$3 imgcfg=$4 arch
	arch=$(go env GOARCH 2>/dev/null || dpkg --print-architecture)
	local t
	t=$(mktemp -d "$D/tmp/oci.XXXXXX")
	mkdir -p "$t/blobs/sha256"
	tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$rootfs" -cf "$t/layer.tar" .
	local ld ls cd cs md ms
	ld=$(sha "$t/layer.tar")
	ls=$(stat -c %s "$t/layer.tar")
	mv "$t/layer.tar" "$t/blobs/sha256/$ld"
	printf '{"architecture":"%s","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"scripts/cluster.sh"}]}' \
		"$arch" "$imgcfg" "$ld" >"$t/config.json"
	cd=$(sha "$t/config.json")
	cs=$(stat -c %s "$t/config.json")
	mv "$t/config.json" "$t/blobs/sha256/$cd"
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
		"$cd" "$cs" "$ld" "$ls" >"$t/manifest.json"
	md=$(sha "$t/manifest.json")
	ms=$(stat -c %s "$t/manifest.json")
	mv "$t/manifest.json" "$t/blobs/sha256/$md"
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
		"$md" "$ms" "$arch" "$name" "${name##*:}" >"$t/index.json"
	echo '{"imageLayoutVersion":"1.0.0"}' >"$t/oci-layout"
	tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$t" -cf "$out.tmp" oci-layout index.json blobs
	mv -f "$out.tmp" "$out"
	rm -rf "$t"
}

# The image archives, cached in $IMG_CACHE under a key of their inputs.
build_images() {
	mkdir -p "$IMG_CACHE"
	local src=$HERE/cluster/pause/main.go.in key
	# Inputs: the pause source and the code that builds the archives.
	key=$( (cat "$src"; declare -f oci_archive build_images) | sha256sum | cut -c1-16)
	local pause_tar=$IMG_CACHE/pause-$key.tar
	if [[ ! -s $pause_tar ]]; then
		command -v go >/dev/null 2>&1 || die "go not found (needed once to build the pause image)"
		local m=$D/tmp/pause-src r=$D/tmp/pause-root
		mkdir -p "$m" "$r"
		cp "$src" "$m/main.go"
		printf 'module gpud.local/pause\n\ngo 1.22\n' >"$m/go.mod"
		(cd "$m" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOWORK=off GOTOOLCHAIN=local \
			go build -trimpath -ldflags '-s -w' -o "$r/pause" .) || die "building pause failed"
		oci_archive "$pause_tar" "$PAUSE_IMAGE" "$r" '{"Entrypoint":["/pause"],"User":"65535:65535"}'
		rm -rf "$m" "$r"
	fi
	local bbkey
	bbkey=$( (sha "$BUSYBOX"; echo "$key") | sha256sum | cut -c1-16)
	local bb_tar=$IMG_CACHE/busybox-$bbkey.tar
	if [[ ! -s $bb_tar ]]; then
		[[ -x $BUSYBOX ]] || die "$BUSYBOX not found (scripts/deps.sh k8s installs busybox-static)"
		static_busybox "$BUSYBOX" || die "$BUSYBOX is not a static busybox (install busybox-static)"
		# The same rootfs as scripts/image.sh builds for Docker.
		local r=$D/tmp/busybox-root
		busybox_rootfs "$BUSYBOX" "$r"
		oci_archive "$bb_tar" "$BUSYBOX_IMAGE" "$r" \
			'{"Cmd":["/bin/sh"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}'
		rm -rf "$r"
	fi
	# Drop archives of older inputs.
	find "$IMG_CACHE" -maxdepth 1 -name '*.tar' ! -name "pause-$key.tar" ! -name "busybox-$bbkey.tar" -delete
	echo "$pause_tar $bb_tar"
}

import_images() {
	local f
	for f in "$@"; do
		ctr_ images import --no-unpack=false "$f" >>"$D/logs/ctr-import.log" 2>&1 ||
			die "ctr images import $f failed (see $D/logs/ctr-import.log)"
	done
	# (No `ctr ... | grep -q`: with pipefail, grep quitting early fails the pipe.)
	local have i
	have=$(ctr_ images ls -q)
	for i in "$PAUSE_IMAGE" "$BUSYBOX_IMAGE"; do
		grep -qxF "$i" <<<"$have" || die "$i missing after import"
	done
}

# ---- configuration files -----------------------------------------------------------

write_containerd_config() {
	local c=$D/containerd
	cat >"$c/config.toml" <<EOF
# Private containerd of the gpud test cluster ($D).
version = 2
root = "$c/root"
state = "$c/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$c/containerd.sock"

[ttrpc]
  address = ""

[debug]
  address = ""

[metrics]
  address = ""

# NRI: gpud's plugin classifies pods before their containers start.
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "$NRI_SOCK"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # CDI, as on CDI-native stacks (the GPU Operator's default since 25.10):
  # devices a device plugin names as CDI devices are injected from the
  # specs in this directory (tests write them; not the host's /etc/cdi).
  enable_cdi = true
  cdi_spec_dirs = ["$D/cdi"]
  # Without it sandbox creation fails on machines without CAP_SYS_RESOURCE.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$c/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$D/cni/net.d"
    max_conf_num = 1
EOF
}

write_cni_config() {
	cat >"$D/cni/net.d/10-$NET_NAME.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$NET_NAME",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "$1"}]],
        "routes": [{"dst": "0.0.0.0/0", "gw": "$1"}],
        "dataDir": "$D/cni/ipam"
      }
    }
  ]
}
EOF
}

write_kubelet_config() {
	local gw=$1
	cat >"$D/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $gw
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $D/pki/kubelet-serving.crt
tlsPrivateKeyFile: $D/pki/kubelet-serving.key
cgroupDriver: cgroupfs
# kubelet >= 1.35 refuses cgroup v1 otherwise.
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$D/containerd/containerd.sock
staticPodPath: $D/manifests
podLogsDir: $D/pod-logs
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: $D/pki/ca.crt
authorization:
  mode: Webhook
# A test machine's disk may be fuller than the defaults allow: no evictions,
# and no image GC (the local images cannot be pulled again).
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
}

# ---- machine state outside DIR -------------------------------------------------------

cgroup_hierarchies() {
	local d
	for d in "$CGROUP_ROOT"/*/; do
		d=${d%/}
		[[ -L $d ]] && continue # cpu -> cpu,cpuacct links
		[[ -e $d/cgroup.procs ]] && echo "$d"
	done
	[[ -e $CGROUP_ROOT/cgroup.procs ]] && echo "$CGROUP_ROOT" # pure cgroup v2
	return 0
}

# Pids in any kubepods cgroup.
kubepods_procs() {
	local h
	for h in $(cgroup_hierarchies); do
		[[ -d $h/kubepods ]] || continue
		find "$h/kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null || true
	done | sort -un
}

remove_kubepods() {
	local h i pids
	for i in 1 2 3 4 5 6 7 8 9 10; do
		pids=$(kubepods_procs)
		[[ -z $pids ]] && break
		# Processes of this cluster's pods that outlived their runtime.
		# shellcheck disable=SC2086
		kill -KILL $pids 2>/dev/null || true
		sleep 0.2
	done
	for h in $(cgroup_hierarchies); do
		[[ -d $h/kubepods ]] || continue
		find "$h/kubepods" -depth -type d -exec rmdir {} + 2>/dev/null || true
		[[ -d $h/kubepods ]] && log "could not remove $h/kubepods"
	done
	return 0
}

# Whether kubepods cgroups exist anywhere.
kubepods_exist() {
	local h
	for h in $(cgroup_hierarchies); do
		[[ -d $h/kubepods ]] && return 0
	done
	return 1
}

# Paths outside DIR whose existence before `up` decides whether `down` removes them.
OUTSIDE=("$KUBELET_VAR" "$DP_DIR" "$LOG_CONTAINERS" "$CNI_CACHE" "$CNI_CACHE/results" "$NETNS_DIR" "$SHIM_SOCK_DIR" "${SHIM_SOCK_DIR%/s}")

record_preexisting() {
	local p
	: >"$D/run/preexisting"
	for p in "${OUTSIDE[@]}"; do
		[[ -e $p ]] && echo "$p" >>"$D/run/preexisting"
	done
	return 0
}

preexisted() { grep -qxF "$1" "$D/run/preexisting" 2>/dev/null; }

# kubelet sets these kernel tunables on start (unless protectKernelDefaults,
# with which it refuses to start if they differ): kept before kubelet's first
# start, put back by `down`.
SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
# kubelet's iptables chains (table:chain), made whenever an iptables binary is
# on PATH, and left behind when it stops.
IPT_CHAINS=(mangle:KUBE-IPTABLES-HINT mangle:KUBE-KUBELET-CANARY nat:KUBE-KUBELET-CANARY filter:KUBE-KUBELET-CANARY filter:KUBE-FIREWALL)

record_host_state() {
	local k v cmd tc
	: >"$D/run/sysctl.orig"
	for k in "${SYSCTLS[@]}"; do
		v=$(cat "/proc/sys/$k" 2>/dev/null) && echo "$k $v" >>"$D/run/sysctl.orig"
	done
	: >"$D/run/iptables.pre"
	for cmd in iptables ip6tables; do
		command -v "$cmd" >/dev/null 2>&1 || continue
		for tc in "${IPT_CHAINS[@]}"; do
			if "$cmd" -w 5 -t "${tc%%:*}" -S "${tc#*:}" >/dev/null 2>&1; then
				echo "$cmd $tc" >>"$D/run/iptables.pre"
			fi
		done
	done
	if command -v nft >/dev/null 2>&1; then
		nft list tables >"$D/run/nft-tables.pre" 2>/dev/null || true
	fi
	return 0
}

restore_host_state() {
	local k v cur cmd tc t c r
	if [[ -f $D/run/sysctl.orig ]]; then
		while read -r k v; do
			cur=$(cat "/proc/sys/$k" 2>/dev/null) || continue
			[[ $cur == "$v" ]] || echo "$v" >"/proc/sys/$k" 2>/dev/null ||
				log "could not restore $k=$v (is $cur)"
		done <"$D/run/sysctl.orig"
	fi
	[[ -f $D/run/iptables.pre ]] || return 0
	for cmd in iptables ip6tables; do
		command -v "$cmd" >/dev/null 2>&1 || continue
		for tc in "${IPT_CHAINS[@]}"; do
			grep -qxF "$cmd $tc" "$D/run/iptables.pre" && continue
			t=${tc%%:*}
			c=${tc#*:}
			"$cmd" -w 5 -t "$t" -S "$c" >/dev/null 2>&1 || continue
			# Rules that jump to it (kubelet: INPUT/OUTPUT -> KUBE-FIREWALL).
			while read -r r; do
				eval "\"\$cmd\" -w 5 -t \"\$t\" -D ${r#-A }" 2>/dev/null || true
			done < <("$cmd" -w 5 -t "$t" -S 2>/dev/null | grep -E -- "^-A .* -j $c( |$)" || true)
			"$cmd" -w 5 -t "$t" -F "$c" 2>/dev/null || true
			"$cmd" -w 5 -t "$t" -X "$c" 2>/dev/null || true
		done
	done
	# iptables-nft made these tables for kubelet's chains; drop them if
	# they did not exist before and are empty now.
	if [[ -f $D/run/nft-tables.pre ]] && command -v nft >/dev/null 2>&1; then
		local fam name
		while read -r _ fam name; do
			[[ $fam == ip || $fam == ip6 ]] || continue
			grep -qxF "table $fam $name" "$D/run/nft-tables.pre" && continue
			local body
			body=$(nft list table "$fam" "$name" 2>/dev/null) || continue
			# Empty: no rules, sets or maps; only (base) chains accepting all.
			if [[ -z $(grep -vE '^[[:space:]]*(table .*\{|chain [^ ]+ \{|type .* policy accept;|\}|)[[:space:]]*$' <<<"$body" || true) ]]; then
				nft delete table "$fam" "$name" 2>/dev/null || true
			fi
		done < <(nft list tables 2>/dev/null || true)
	fi
	return 0
}

# Unmount every mount point at or under $1 (deepest first), repeatedly
# (mounts may be stacked).
umount_under() {
	local base=$1 i m
	for i in 1 2 3 4 5; do
		mapfile -t ms < <(awk -v b="$base" '{ p = $5; gsub(/\\040/, " ", p); if (p == b || index(p, b "/") == 1) print p }' /proc/self/mountinfo | awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-)
		[[ ${#ms[@]} -eq 0 ]] && return 0
		for m in "${ms[@]}"; do
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
		done
	done
	awk -v b="$base" '{ p = $5; if (p == b || index(p, b "/") == 1) { print p; n++ } } END { exit n > 0 }' /proc/self/mountinfo >&2 || {
		log "mounts left under $base (above)"
		return 1
	}
}

# ---- up --------------------------------------------------------------------------------

check_prereqs() {
	[[ $(id -u) -eq 0 ]] || die "must run as root"
	local c
	for c in "${K8S_CMDS[@]}"; do
		[[ -x $BIN/$c ]] || die "$BIN/$c missing (run: make k8s, or scripts/deps.sh k8s && scripts/k8s-build.sh)"
	done
	for c in containerd containerd-shim-runc-v2 ctr; do
		[[ -x $CONTAINERD_BIN/$c ]] || die "$CONTAINERD_BIN/$c missing (run: make k8s, or scripts/containerd-build.sh)"
	done
	for c in runc openssl ip setsid; do
		command -v "$c" >/dev/null 2>&1 || die "$c not found (run scripts/deps.sh k8s)"
	done
	for c in bridge host-local loopback; do
		[[ -x $CNI_BIN/$c ]] || die "$CNI_BIN/$c not found (run scripts/deps.sh k8s)"
	done
	[[ $POD_SUBNET =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.0/(1[6-9]|2[0-4])$ ]] ||
		die "GPUD_POD_SUBNET must look like 10.244.0.0/24 (a /16../24 ending in .0)"
}

# Whether the cluster in $D has all components running.
all_running() {
	local c
	for c in "${COMPONENTS[@]}"; do
		comp_pid "$c" >/dev/null || return 1
	done
}

any_running() {
	local c
	for c in "${COMPONENTS[@]}"; do
		comp_pid "$c" >/dev/null && return 0
	done
	return 1
}

write_env() {
	local node=$1 c v
	{
		echo "# gpud test cluster: source this file. Stop with: scripts/cluster.sh down $D"
		echo "export GPUD_CLUSTER_DIR=$D"
		echo "export KUBECONFIG=$D/kubeconfig"
		echo "export KUBELET_KUBECONFIG=$D/kubelet.kubeconfig"
		echo "export K8S_BIN=$BIN"
		echo "export PATH=$CONTAINERD_BIN:\$PATH # containerd $CONTAINERD_VERSION's ctr"
		echo "export NRI_SOCK=$NRI_SOCK"
		echo "export CDI_SPEC_DIR=$D/cdi # containerd's CDI specs"
		echo "export KUBECTL=$BIN/kubectl"
		echo "export KUBECACHEDIR=$D/kubectl-cache # not ~/.kube/cache"
		echo "export NODE_NAME=$node"
		echo "export CONTAINERD_SOCK=$D/containerd/containerd.sock"
		echo "export CONTAINERD_NAMESPACE=k8s.io"
		echo "export KUBELET_ROOT=$D/kubelet"
		echo "export POD_RESOURCES_SOCK=$D/kubelet/pod-resources/kubelet.sock"
		echo "export DEVICE_PLUGINS_DIR=$DP_DIR"
		echo "export STATIC_POD_DIR=$D/manifests"
		echo "export PAUSE_IMAGE=$PAUSE_IMAGE"
		echo "export BUSYBOX_IMAGE=$BUSYBOX_IMAGE"
		for c in "${COMPONENTS[@]}"; do
			v=$(comp_pid "$c" || true)
			c=${c#kube-}
			c=${c//-/_}
			echo "export ${c^^}_PID=$v"
		done
	} >"$D/env.tmp"
	mv -f "$D/env.tmp" "$D/env"
}

start_kubelet() {
	local node=$1 gw=$2
	start kubelet "$BIN/kubelet" \
		--config="$D/kubelet-config.yaml" \
		--kubeconfig="$D/kubelet.kubeconfig" \
		--root-dir="$D/kubelet" \
		--cert-dir="$D/kubelet/pki" \
		--hostname-override="$node" \
		--node-ip="$gw" \
		--v=2
}

smoke_pod() {
	local node=$1
	kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: gpud-cluster-smoke
  namespace: default
spec:
  nodeName: $node
  terminationGracePeriodSeconds: 5
  containers:
  - name: sh
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
EOF
	pod_running() { [[ $(kc get pod gpud-cluster-smoke -o 'jsonpath={.status.phase}') == Running ]]; }
	wait_until "the test pod to run" 60 kubelet pod_running
	kc delete pod gpud-cluster-smoke --wait=true --timeout=30s >/dev/null
}

up() {
	local t0
	t0=$(now)
	check_prereqs
	# A node as systemd sets it up: a bpf filesystem at /sys/fs/bpf, where
	# gpud in its pod pins the gate so that it outlives the pod's restarts.
	mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf || die "cannot mount bpffs at /sys/fs/bpf"
	# Shared, as systemd leaves every mount: the DaemonSet mounts it with
	# HostToContainer propagation, which containerd refuses on a private one.
	mount --make-shared /sys/fs/bpf || die "cannot make /sys/fs/bpf a shared mount"
	# So is /: the DaemonSet mounts the driver root (/ for a host install)
	# with HostToContainer propagation, so that a driver container's mount
	# appears in gpud's pod. Not recursive: nothing below changes.
	mount --make-shared / || die "cannot make / a shared mount"
	local node=${GPUD_NODE_NAME:-$(hostname)}
	node=${node,,}
	[[ $node =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || die "node name '$node' is not a DNS name (set GPUD_NODE_NAME)"
	[[ $POD_SUBNET =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.0/ ]]
	local gw=${BASH_REMATCH[1]}.1

	# One cluster per machine.
	if [[ -s $ACTIVE ]]; then
		local other
		other=$(<"$ACTIVE")
		if [[ -f $other/$MARKER ]]; then
			D=$other
			local want=${1:-}
			[[ -z $want || $want == /* ]] || want=$PWD/$want
			if [[ -z $want || ${want%/} == "$other" ]] && all_running; then
				log "already up: $other"
				echo "$other"
				return 0
			fi
			if any_running; then
				die "a cluster is up in $other: run scripts/cluster.sh down $other first"
			fi
			log "cleaning up the stopped cluster in $other"
			down "$other"
		else
			rm -f "$ACTIVE"
		fi
	fi

	# Machine-wide things another kubelet (or a cluster killed without
	# `down`) may hold.
	local p
	for p in "${PORTS[@]}"; do
		if [[ -n $(ss -Hltn "sport = :$p" 2>/dev/null) ]]; then
			die "port $p is in use (another cluster?): $(ss -Hltnp "sport = :$p" 2>/dev/null || true)"
		fi
	done
	# (Not zombies: PID 1 of some sandboxes reaps our exited daemons slowly.)
	for p in $(pgrep -x kubelet || true); do
		alive "$p" && die "a kubelet is already running on this machine (pid $p)"
	done

	if [[ -n ${1:-} ]]; then
		D=$1
		[[ $D == /* ]] || D=$PWD/$D
		if [[ -e $D ]]; then
			[[ -d $D ]] || die "$D is not a directory"
			if [[ -f $D/$MARKER ]]; then
				log "cleaning up an earlier cluster in $D"
				down "$D"
			elif [[ -n $(ls -A "$D") ]]; then
				die "$D exists, is not empty and is not a cluster dir"
			fi
		fi
		mkdir -p "$D"
	else
		D=$(mktemp -d /tmp/gpud-cluster.XXXXXX)
	fi
	D=$(cd "$D" && pwd -P)
	((${#D} <= 60)) || die "$D: path too long (unix socket paths below it must fit in 108 bytes)"

	mkdir -p "$D"/{run,logs,tmp,pki,manifests,pod-logs,kubelet,cni/net.d,cni/ipam,containerd,etcd,cdi}
	chmod 0700 "$D/etcd"
	echo "$K8S_VERSION" >"$D/$MARKER"
	echo "$D" >"$ACTIVE"
	record_preexisting
	record_host_state
	if kubepods_exist; then
		[[ -z $(kubepods_procs) ]] || die "kubepods cgroups with processes exist (another kubelet's pods?)"
		log "removing stale (empty) kubepods cgroups"
		remove_kubepods
	fi
	UP_OK=0
	trap 'up_exit $?' EXIT

	# The bridge exists before kubelet: its address is the node IP, which
	# kubelet listens on and the API server connects to (loopback is refused
	# as a node IP). CNI's bridge plugin adds the pods to it.
	if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
		ip link add "$BRIDGE" type bridge
	fi
	ip addr replace "$gw/${POD_SUBNET#*/}" dev "$BRIDGE"
	ip link set "$BRIDGE" up

	step "checks done"
	make_pki "$node" "$gw"
	step "certificates"
	kubeconfig "$D/kubeconfig" admin
	kubeconfig "$D/kubelet.kubeconfig" kubelet-client
	kubeconfig "$D/scheduler.kubeconfig" scheduler
	kubeconfig "$D/controller-manager.kubeconfig" controller-manager
	write_containerd_config
	write_cni_config "$gw"
	write_kubelet_config "$gw"

	start etcd "$BIN/etcd" \
		--name=gpud-test --data-dir="$D/etcd" \
		--listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
		--listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
		--initial-cluster=gpud-test=http://127.0.0.1:2380 --logger=zap --log-level=warn
	start containerd containerd --config="$D/containerd/config.toml"

	local sa_admission=--disable-admission-plugins=ServiceAccount
	[[ ${GPUD_CLUSTER_SA_ADMISSION:-1} == 0 ]] || sa_admission=--enable-admission-plugins=NodeRestriction,ServiceAccount
	start kube-apiserver "$BIN/kube-apiserver" \
		--etcd-servers=http://127.0.0.1:2379 \
		--bind-address=127.0.0.1 --secure-port=6443 --advertise-address=127.0.0.1 \
		--endpoint-reconciler-type=none \
		--authorization-mode=Node,RBAC \
		--enable-admission-plugins=NodeRestriction "$sa_admission" \
		--allow-privileged=true \
		--client-ca-file="$D/pki/ca.crt" \
		--tls-cert-file="$D/pki/apiserver.crt" --tls-private-key-file="$D/pki/apiserver.key" \
		--kubelet-client-certificate="$D/pki/apiserver-kubelet-client.crt" \
		--kubelet-client-key="$D/pki/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$D/pki/sa.pub" \
		--service-account-signing-key-file="$D/pki/sa.key" \
		--service-cluster-ip-range="$SERVICE_CIDR" \
		--profiling=false

	step "etcd, containerd, kube-apiserver started"
	local imgs
	imgs=$(build_images)
	step "image archives"
	wait_until "containerd" 30 containerd ctr -a "$D/containerd/containerd.sock" version
	step "containerd answers"
	# shellcheck disable=SC2086
	import_images $imgs
	step "images imported"
	start_kubelet "$node" "$gw"

	apiserver_ready() { [[ $(kc get --raw=/readyz 2>/dev/null) == ok ]]; }
	wait_until "kube-apiserver" 60 kube-apiserver apiserver_ready
	step "kube-apiserver ready"
	start kube-scheduler "$BIN/kube-scheduler" \
		--kubeconfig="$D/scheduler.kubeconfig" \
		--authentication-kubeconfig="$D/scheduler.kubeconfig" \
		--authorization-kubeconfig="$D/scheduler.kubeconfig" \
		--leader-elect=false --bind-address=127.0.0.1 --secure-port=0
	start kube-controller-manager "$BIN/kube-controller-manager" \
		--kubeconfig="$D/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$D/controller-manager.kubeconfig" \
		--authorization-kubeconfig="$D/controller-manager.kubeconfig" \
		--leader-elect=false --use-service-account-credentials=true \
		--service-account-private-key-file="$D/pki/sa.key" \
		--root-ca-file="$D/pki/ca.crt" \
		--cluster-signing-cert-file="$D/pki/ca.crt" --cluster-signing-key-file="$D/pki/ca.key" \
		--cluster-name=gpud-test --bind-address=127.0.0.1 --secure-port=0 \
		--kube-api-qps=200 --kube-api-burst=400
	write_env "$node"

	node_ready() {
		[[ $(kc get node "$node" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]
	}
	wait_until "node $node to be Ready" 60 kubelet node_ready
	step "node Ready"
	# What NVIDIA's GPU feature discovery labels a GPU node with; gpud's
	# chart and base schedule on it (the node's GPUs are the tests' fakes).
	kc label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null
	if [[ ${GPUD_CLUSTER_SA_ADMISSION:-1} != 0 ]]; then
		wait_until "the default ServiceAccount" 30 kube-controller-manager kc get serviceaccount default
	fi
	step "default ServiceAccount"
	smoke_pod "$node"
	step "test pod ran and was deleted"
	local c
	for c in "${COMPONENTS[@]}"; do
		comp_pid "$c" >/dev/null || die "$c exited (log: $D/logs/$c.log)"
	done
	UP_OK=1
	log "up in $(since "$t0")s: node $node Ready; source $D/env (stop: scripts/cluster.sh down $D)"
	echo "$D"
}

up_exit() {
	trap - EXIT
	((UP_OK)) && exit "$1"
	local rc=$1
	((rc != 0)) || rc=1
	log "up failed; last log lines:"
	log_tail 15
	if [[ ${GPUD_CLUSTER_KEEP:-0} == 1 ]]; then
		log "GPUD_CLUSTER_KEEP=1: left as it is; clean up with: scripts/cluster.sh down $D"
	else
		log "cleaning up (GPUD_CLUSTER_KEEP=1 keeps the cluster for a look)"
		(down "$D") || true
	fi
	exit "$rc"
}

# ---- down ------------------------------------------------------------------------------

# Let kubelet stop the pods (graceful: CNI teardown, netns, cgroups), if the
# cluster still runs.
drain_pods() {
	rm -f "$D"/manifests/* 2>/dev/null || true
	comp_pid kube-apiserver >/dev/null && comp_pid kubelet >/dev/null || return 0
	[[ -f $D/kubeconfig ]] || return 0
	kc delete daemonsets,deployments,replicasets,statefulsets,jobs,cronjobs --all --all-namespaces \
		--wait=false >/dev/null 2>&1 || true
	kc delete pods --all --all-namespaces --grace-period=2 --wait=false >/dev/null 2>&1 || true
	local deadline=$((SECONDS + 30)) n
	while ((SECONDS < deadline)); do
		n=$(kc get pods --all-namespaces --no-headers 2>/dev/null | wc -l || echo 1)
		if ((n == 0)) && [[ -z $(ctr_ tasks ls -q 2>/dev/null) ]]; then
			return 0
		fi
		# Mirror pods of static pods are not deleted by kubelet when it
		# cannot see their manifests: they go once their containers have.
		sleep 0.2
	done
	log "pods still present after 30s; killing them"
}

# Whatever containers remain in our containerd: kill and delete them.
kill_containers() {
	comp_pid containerd >/dev/null || return 0
	local id
	for id in $(ctr_ tasks ls -q 2>/dev/null); do
		ctr_ tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true
	done
	for id in $(ctr_ tasks ls -q 2>/dev/null); do
		ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true
	done
	for id in $(ctr_ containers ls -q 2>/dev/null); do
		ctr_ containers delete "$id" >/dev/null 2>&1 || true
	done
}

# containerd-shim processes serving our containerd (they outlive it).
our_shims() {
	local p cmd
	for p in /proc/[0-9]*; do
		cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
		[[ $cmd == *containerd-shim* && $cmd == *"-address $D/containerd/containerd.sock "* ]] && echo "${p#/proc/}"
	done
	return 0
}

kill_shims() {
	local pid id cmd
	for pid in $(our_shims); do
		cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || continue
		id=$(sed -n 's/.* -id \([^ ]*\) .*/\1/p' <<<"$cmd")
		stop_pid "$pid" containerd-shim 5
		# Its socket: /run/containerd/s/sha256(address/namespace/id)
		# (containerd 1.6 runtime/v2/shim.SocketAddress).
		if [[ -n $id ]]; then
			rm -f "$SHIM_SOCK_DIR/$(printf '%s' "$D/containerd/containerd.sock/k8s.io/$id" | sha256sum | cut -d' ' -f1)"
		fi
	done
}

# The network namespaces (/run/netns/cni-*) of this cluster's pods: those
# named in containerd's metadata (the CRI sandbox records hold their paths as
# JSON text), and those whose eth0 is paired with a port of our bridge.
our_netns() {
	local db=$D/containerd/root/io.containerd.metadata.v1.bolt/meta.db n ports peer
	if [[ -f $db ]]; then
		grep -aoE '/(var/)?run/netns/cni-[0-9a-f-]{36}' "$db" 2>/dev/null | sed 's|^/var/run/|/run/|' || true
	fi
	if ip link show "$BRIDGE" >/dev/null 2>&1; then
		ports=" $(ip -o link show master "$BRIDGE" 2>/dev/null | cut -d: -f1 | tr '\n' ' ') "
		for n in /run/netns/cni-*; do
			[[ -e $n ]] || continue
			peer=$(ip -n "${n##*/}" -o link show eth0 2>/dev/null | sed -n 's/.*eth0@if\([0-9]*\).*/\1/p')
			[[ -n $peer && $ports == *" $peer "* ]] && echo "$n"
		done
	fi
	return 0
}

# Network namespaces, CNI cache entries and veths of our pods that were not
# torn down (kubelet or containerd killed), and the bridge.
clean_cni() {
	local f n id
	for n in $(our_netns | sort -u); do
		[[ -e $n ]] || continue
		umount "$n" 2>/dev/null || umount -l "$n" 2>/dev/null || true
		rm -f "$n"
	done
	for f in "$CNI_CACHE"/results/"$NET_NAME"-*-eth0; do
		[[ -f $f ]] || continue
		# containerd's own loopback network of the same sandbox.
		id=${f##*/"$NET_NAME"-}
		id=${id%-eth0}
		rm -f "$f" "$CNI_CACHE/results/cni-loopback-$id-lo"
	done
	# The bridge (the name is this script's) and any pod veths left on it.
	if ip link show "$BRIDGE" >/dev/null 2>&1; then
		local v
		for v in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
			ip link del "$v" 2>/dev/null || true
		done
		ip link del "$BRIDGE" 2>/dev/null || true
	fi
	for f in "$CNI_CACHE/results" "$CNI_CACHE" "$NETNS_DIR"; do
		preexisted "$f" || rmdir "$f" 2>/dev/null || true
	done
	return 0
}

clean_kubelet_outside() {
	rm -f "$DP_DIR/kubelet.sock" "$DP_DIR/kubelet_internal_checkpoint"
	preexisted "$DP_DIR" || rmdir "$DP_DIR" 2>/dev/null || true
	preexisted "$KUBELET_VAR" || rmdir "$KUBELET_VAR" 2>/dev/null || true
	local l
	for l in "$LOG_CONTAINERS"/*; do
		[[ -L $l && $(readlink "$l") == "$D"/* ]] && rm -f "$l"
	done
	preexisted "$LOG_CONTAINERS" || rmdir "$LOG_CONTAINERS" 2>/dev/null || true
	preexisted "$SHIM_SOCK_DIR" || rmdir "$SHIM_SOCK_DIR" 2>/dev/null || true
	preexisted "${SHIM_SOCK_DIR%/s}" || rmdir "${SHIM_SOCK_DIR%/s}" 2>/dev/null || true
}

down() {
	[[ $(id -u) -eq 0 ]] || die "must run as root"
	D=${1:-}
	if [[ -z $D ]]; then
		[[ -s $ACTIVE ]] || { log "no cluster is up"; return 0; }
		D=$(<"$ACTIVE")
	fi
	[[ $D == /* ]] || D=$PWD/$D
	if [[ ! -e $D ]]; then
		[[ -s $ACTIVE && $(<"$ACTIVE") == "$D" ]] && rm -f "$ACTIVE"
		log "$D does not exist: nothing to do"
		return 0
	fi
	[[ -f $D/$MARKER ]] || die "$D is not a cluster dir (no $MARKER): not touching it"
	D=$(cd "$D" && pwd -P)
	local t0
	t0=$(now)

	# Best effort from here on: one step failing must not leave the rest.
	set +e
	drain_pods
	# kubelet first: it would restart what is killed below.
	stop_comp kubelet 15
	stop_comp kube-controller-manager
	stop_comp kube-scheduler
	kill_containers
	stop_comp containerd 15
	rm -f "$NRI_SOCK"
	stop_comp kube-apiserver
	stop_comp etcd
	# Container processes that outlived their runtime (a killed `up`,
	# a crash): only this cluster's kubelet made kubepods cgroups.
	remove_kubepods
	kill_shims
	clean_cni
	clean_kubelet_outside
	restore_host_state
	set -e
	umount_under "$D" || die "mounts remain under $D; not removing it"
	remove_kubepods
	rm -rf --one-file-system "$D"
	if [[ -s $ACTIVE && $(<"$ACTIVE") == "$D" ]]; then rm -f "$ACTIVE"; fi
	log "down in $(since "$t0")s: $D removed"
}

# ---- status / restart-kubelet ------------------------------------------------------------

pick_dir() {
	D=${1:-}
	if [[ -z $D ]]; then
		[[ -s $ACTIVE ]] || { echo "not up (no active cluster)"; exit 3; }
		D=$(<"$ACTIVE")
	fi
	[[ $D == /* ]] || D=$PWD/$D
	[[ -f $D/$MARKER ]] || { echo "not up ($D is not a cluster dir)"; exit 3; }
	D=$(cd "$D" && pwd -P)
}

status() {
	pick_dir "${1:-}"
	local c pid rc=0 n=0
	echo "cluster $D"
	for c in "${COMPONENTS[@]}"; do
		if pid=$(comp_pid "$c"); then
			printf '  %-24s running (pid %s)\n' "$c" "$pid"
			n=$((n + 1))
		else
			printf '  %-24s stopped\n' "$c"
			rc=1
		fi
	done
	((n == 0)) && rc=3
	if comp_pid kube-apiserver >/dev/null; then
		kc get nodes -o wide 2>&1 | sed 's/^/  /' || true
	fi
	return "$rc"
}

# restart_comp NAME [DIR]: stop a component and start it again with the same
# command line. Containers outlive a containerd restart (their shims run on),
# and kubelet reconnects to containerd by itself.
restart_comp() {
	local name=$1
	pick_dir "${2:-}"
	[[ -s $D/run/$name.cmd ]] || die "no $name command recorded in $D"
	stop_comp "$name" 15
	local -a cmd
	eval "cmd=($(<"$D/run/$name.cmd"))"
	start "$name" "${cmd[@]}"
	sleep 0.5
	comp_pid "$name" >/dev/null || die "$name exited (log: $D/logs/$name.log)"
	if [[ $name == containerd ]]; then
		wait_until "containerd serving" 30 containerd ctr_ version
	fi
	write_env "$(awk '/^export NODE_NAME=/ { sub(/.*=/, ""); print }' "$D/env" 2>/dev/null)"
	log "$name restarted (pid $(comp_pid "$name"))"
}

D=
UP_OK=1
case "${1:-}" in
up) up "${2:-}" ;;
down) down "${2:-}" ;;
status) status "${2:-}" ;;
restart-kubelet) restart_comp kubelet "${2:-}" ;;
restart-containerd) restart_comp containerd "${2:-}" ;;
*) die "usage: $0 up|down|status|restart-kubelet|restart-containerd [DIR]" ;;
esac
