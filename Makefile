# gpud — make targets. `make demo` and `make test` do all set-up on a fresh
# Debian machine as root (packages through apt-get, a private Docker engine).

GO        ?= go
BIN       := bin/gpud
# Versions are git tags vMAJOR.MINOR.PATCH (`make release` takes no other);
# between tags, `git describe` (v0.3.0-4-gabcdef0, -dirty when edited).
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# gpud version's stamp: the commit and its date (reproducible: not now).
COMMIT    := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILD_DATE := $(shell TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd 2>/dev/null || echo unknown)
LDFLAGS   := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.buildDate=$(BUILD_DATE)
# Privileged packages share the kernel and the fake GPU device numbers: one at a time.
TESTFLAGS ?= -count=1 -p 1 -timeout 30m
# The cluster tests' flags (`make test-k8s K8SFLAGS='-count=3 -timeout 50m'`).
K8SFLAGS  ?= -count=1 -timeout 15m
BENCHTIME ?= 1x
# make bench: runs per series (unloaded, loaded); the kernel-matrix guest
# the syscall-tax benchmark also runs in (empty: none); 1 for CI's smoke run.
RUNS      ?= 3
BENCH_KMATRIX ?= trixie
BENCH_SMOKE ?=
# Time each fuzz target runs for in `make fuzz` and `make test`.
FUZZTIME  ?= 10s
# The daemon tests `make test` runs a second time with --hooks syscalls
# (the opt-in mode; the whole suite runs in the default driver mode): fd
# tracking, the bypass routes, crashes, the gate's verdicts and overload.
SYSCALLS_MODE_TESTS ?= ^(TestFDLifecycle|TestForkExecExit|TestFDPassing|TestStartupFindsExistingHolder|TestBypass|TestBypassIOUringResync|TestCrashCampaign|TestGateLowHeldHighOpens|TestGateHighHeldLowDenied|TestGateFirstOpen|TestOverloadDropsResync|TestDriverHooksOpenRoutes|TestPassedFDReceiverKilled)$$
# HOG=1: `make test` runs its Go tests with a spinning loop per CPU beside
# them (scripts/hog.sh; .ci/run sets it from GPUD_CI_HOG=1).
HOG       ?=
GOTEST    = $(if $(filter 1,$(HOG)),scripts/hog.sh )$(GO) test
# The kernels `make test` boots (scripts/kmatrix.sh suites).
KMATRIX_IN_TEST ?= bullseye bookworm trixie
IMAGE_REPO ?= gpud.local/gpud
IMAGE     ?= $(IMAGE_REPO):dev
# The release's registry: the image is REGISTRY/gpud:VERSION (the packaged
# chart's default image), `make push` sends the chart to REGISTRY/charts.
REGISTRY  ?= ghcr.io/gpud
CLUSTER_DIR ?= /tmp/gpud-cluster

.PHONY: all build generate check-generate test unit fuzz bench demo gpu-check lint clean image release push test-k8s k8s cluster-up cluster-down kmatrix

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/gpud

# Rebuild the BPF objects and Go bindings (committed, so `build` needs no clang).
generate:
	scripts/deps.sh bpf
	cd bpf && $(GO) generate ./...

# Fails when the committed BPF objects are not what bpf/gpud.bpf.c gives.
check-generate:
	scripts/deps.sh bpf
	GO=$(GO) scripts/check-generate.sh

# Everything, privileged tests included: real BPF in the kernel, real Docker
# containers. A private dockerd is started for the run and stopped after.
# Then the Kubernetes end-to-end tests on a real one-node cluster (built
# once into a cache outside the repo, brought up for the run, torn down
# after, even when a test fails).
test: build k8s
	scripts/deps.sh build test
	scripts/dockerd.sh start
	@set -e; trap 'scripts/cluster.sh down $(CLUSTER_DIR); scripts/dockerd.sh stop' EXIT; \
	scripts/image.sh; \
	$(MAKE) --no-print-directory lint; \
	$(GOTEST) $(TESTFLAGS) ./...; \
	GPUD_TEST_HOOKS=syscalls $(GOTEST) $(TESTFLAGS) -run '$(SYSCALLS_MODE_TESTS)' ./internal/daemon/; \
	scripts/gpu-check.sh --double --out bin/gpu-check-double.txt; \
	GO=$(GO) FUZZTIME=$(FUZZTIME) scripts/fuzz.sh; \
	GO=$(GO) scripts/release.sh --version $(VERSION) --name $(IMAGE) --out bin/release; \
	scripts/cluster.sh up $(CLUSTER_DIR); \
	. $(CLUSTER_DIR)/env; \
	ctr -n k8s.io -a $$CONTAINERD_SOCK images import bin/release/gpud-$(VERSION).oci.tar >/dev/null; \
	ctr -n k8s.io -a $$CONTAINERD_SOCK images tag --force $(IMAGE) $(IMAGE_REPO):$(VERSION) >/dev/null; \
	GPUD_VERSION=$(VERSION) $(GOTEST) -tags k8s $(K8SFLAGS) ./test/k8s/; \
	scripts/cluster.sh down $(CLUSTER_DIR); \
	scripts/deps.sh kmatrix; \
	GO=$(GO) scripts/kmatrix.sh $(KMATRIX_IN_TEST)

# The kernel matrix (docs/kernels.md): the BPF tests and the daemon's
# fake-GPU tests on Debian's 5.10, 6.1 and 6.12 kernels, each booted in qemu
# with the host's / shared read-only. Kernels are fetched with apt-get
# download into /var/cache/gpud-kernels (never installed); logs and the
# summary in /var/cache/gpud-kernels/last. About 3 minutes a kernel (TCG).
# `test` runs it on $(KMATRIX_IN_TEST): all three (5.10 runs gpud
# observe-only, its daemon tests with --hooks syscalls; docs/kernels.md).
kmatrix:
	scripts/deps.sh build kmatrix
	GO=$(GO) scripts/kmatrix.sh

# Unprivileged unit tests only (no root needed; privileged tests skip outside CI).
unit:
	$(GO) test -count=1 -short ./internal/cgroups/ ./internal/status/

# Every Go fuzz target (FuzzXxx) for $(FUZZTIME) each: one line per target
# with its executions and new inputs; a failing input is left in the
# package's testdata/fuzz/ and printed (see docs/fuzz.md).
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

# Figures, each beside its goal (tools/benchreport/goals.go), MET or MISSED:
# RUNS unloaded and RUNS loaded runs (a spinning loop per CPU), interleaved,
# then BenchmarkSyscallTax in a kernel-matrix guest (BENCH_KMATRIX, kprobes
# attached); docs/benchmarks.md's tables are written from the run, the
# runs' output is in bin/bench/ (scripts/bench.sh; ~30 minutes on 2 cores).
# CI's smoke run: `make bench BENCH_SMOKE=1` (small sizes, one run each, no
# doc write).
bench: build
	scripts/deps.sh build test
	scripts/dockerd.sh start
	@set -e; trap 'scripts/dockerd.sh stop' EXIT; \
	GO=$(GO) RUNS=$(RUNS) BENCHTIME=$(BENCHTIME) BENCH_SMOKE=$(BENCH_SMOKE) BENCH_KMATRIX='$(BENCH_KMATRIX)' scripts/bench.sh

# On a node with an NVIDIA driver (nothing else: no CUDA toolkit, no
# network): a CUDA program under gpud, one table of checks in
# bin/gpu-check.txt (docs/real-gpu.md, "make gpu-check"). `make test` runs
# the same script against the doubles (--double).
gpu-check: build
	scripts/gpu-check.sh --out bin/gpu-check.txt

# gpud's main job on fake GPUs (or real ones when an NVIDIA driver is present).
demo: build
	scripts/deps.sh build docker
	scripts/demo.sh $(BIN)

# The release of VERSION (vMAJOR.MINOR.PATCH): gpud for amd64 and arm64,
# bare and as one multi-platform image, reproducible, nothing pulled; the
# chart packaged for that image; the CHANGELOG section; checksums
# (scripts/release.sh lists the files). `make push REGISTRY=registry.example.com/team`
# sends the image to REGISTRY/gpud:VERSION and the chart to
# oci://REGISTRY/charts/gpud (version VERSION without its v), with `docker
# login`'s credentials.
SEMVER_TAG := ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$$
release:
	@echo '$(VERSION)' | grep -Eq '$(SEMVER_TAG)' || { echo "make release: VERSION=$(VERSION): want vMAJOR.MINOR.PATCH, e.g. make release VERSION=v0.3.0 (or on a commit tagged so)" >&2; exit 2; }
	GO=$(GO) scripts/release.sh --version $(VERSION) --name $(REGISTRY)/gpud:$(VERSION) --out bin/release

push: release
	$(GO) run ./tools/ociimage push bin/release/gpud-$(VERSION).oci.tar $(REGISTRY)/gpud:$(VERSION)
	$(GO) run ./tools/ociimage push-chart bin/release/gpud-$(VERSION:v%=%).tgz $(REGISTRY)/charts

# The image for this machine's architecture as $(IMAGE), loaded into the
# local Docker engine; bin/release/gpud-$(VERSION).oci.tar is the same
# image for `ctr -n k8s.io images import`.
image:
	scripts/deps.sh docker
	scripts/dockerd.sh start
	GO=$(GO) scripts/release.sh --version $(VERSION) --arch $$($(GO) env GOARCH) --name $(IMAGE) --out bin/release --docker-archive bin/gpud-image.docker.tar
	docker load -i bin/gpud-image.docker.tar

# The Kubernetes end-to-end test: gpud in its DaemonSet pod (deploy/base) on a
# real one-node cluster brought up for the run and torn down after.
test-k8s: image k8s
	@set -e; trap 'scripts/cluster.sh down $(CLUSTER_DIR); scripts/dockerd.sh stop' EXIT; \
	scripts/cluster.sh up $(CLUSTER_DIR); \
	. $(CLUSTER_DIR)/env; \
	ctr -n k8s.io -a $$CONTAINERD_SOCK images import bin/release/gpud-$(VERSION).oci.tar >/dev/null; \
	ctr -n k8s.io -a $$CONTAINERD_SOCK images tag --force $(IMAGE) $(IMAGE_REPO):$(VERSION) >/dev/null; \
	GPUD_VERSION=$(VERSION) $(GO) test -tags k8s $(K8SFLAGS) ./test/k8s/

# gofmt, go vet (k8s-tagged tests too), staticcheck, a build without cgo
# (only internal/nvidia uses it), the arm64 build and vet (Grace nodes), the
# committed BPF objects against their C source, and docs/architecture.md's
# package table.
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags k8s ./test/...
	$(GO) tool staticcheck ./...
	CGO_ENABLED=0 $(GO) build -o /dev/null ./...
	GOARCH=arm64 $(GO) build -o /dev/null ./...
	GOARCH=arm64 $(GO) vet ./...
	scripts/deps.sh bpf
	GO=$(GO) scripts/check-generate.sh
	GO=$(GO) scripts/check-architecture.sh
	$(GO) run scripts/check-links.go

clean:
	rm -rf bin

# A real one-node Kubernetes cluster (etcd, kube-apiserver, containerd,
# kubelet, scheduler, controller-manager) for the Kubernetes tests. `k8s`
# builds the binaries once into /var/cache/gpud-k8s (GPUD_K8S_CACHE), the
# pinned helm for the chart tests into /var/cache/gpud-helm (scripts/helm.sh),
# and kubeconform with the cluster version's schemas into
# /var/cache/gpud-kubeconform (scripts/kubeconform.sh);
# `cluster-up` starts the cluster in $(CLUSTER_DIR) (source $(CLUSTER_DIR)/env),
# `cluster-down` stops it and removes everything it made.

.PHONY: k8s cluster-up cluster-down

k8s:
	scripts/deps.sh k8s
	scripts/k8s-build.sh >/dev/null
	scripts/containerd-build.sh >/dev/null
	scripts/helm.sh
	scripts/kubeconform.sh

cluster-up: k8s
	scripts/cluster.sh up $(CLUSTER_DIR)

cluster-down:
	scripts/cluster.sh down $(CLUSTER_DIR)
