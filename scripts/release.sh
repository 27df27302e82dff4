#!/usr/bin/env bash
# scripts/release.sh [--version V] [--arch "amd64 arm64"] [--name REF] [--out DIR]
#                    [--docker-archive FILE]
#
# gpud's release: one static-layout image for each architecture, in one
# multi-platform OCI archive, the bare binaries, the Helm chart packaged
# for that image, the version's release notes and their checksums.
#
#   $OUT/gpud-linux-<arch>         the binary (cgo: NVML is dlopen'ed from
#                                  the node's driver at run time), stamped:
#                                  `gpud version -o json`
#   $OUT/gpud-<version>.oci.tar    the image index (ctr images import,
#                                  skopeo copy oci-archive:, `make push`)
#   $OUT/gpud-<chart version>.tgz  the chart (`helm package`): version the
#                                  release's without its v, appVersion the
#                                  release's, image.repository --name's
#                                  (its tag: the appVersion)
#   $OUT/gpud-<version>.release-notes.md
#                                  CHANGELOG.md's section of the version
#                                  ("## <version>"; "## Unreleased" while
#                                  there is none, with a warning)
#   $OUT/SHA256SUMS
#
# The chart version is semantic (Helm's rule): vX.Y.Z[-pre][+build] gives
# X.Y.Z[-pre][+build]; anything else (a `git describe` of an untagged
# commit) 0.0.0-<version>. `make release` takes vMAJOR.MINOR.PATCH only.
#
# Why a script and not a Dockerfile: build machines here reach only Debian's
# archive and the Go module proxy, so there is no base image to pull. Each
# image is gpud, the dynamic loader and the C libraries gpud links, taken
# from Debian's packages for that architecture (the native libc, or the
# libc6-*-cross sysroot), assembled by tools/ociimage. The build is
# reproducible: -trimpath, no build id, every file time the commit's time
# (SOURCE_DATE_EPOCH to override), so the same commit and toolchain give
# the same digest.
#
# Defaults: --version from `git describe`, --arch "amd64 arm64", --name
# gpud.local/gpud:<version>, --out bin/release. --docker-archive also writes
# this machine's platform as a `docker load` tarball.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

die() { echo "release.sh: $*" >&2; exit 1; }

version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
arches="amd64 arm64"
name=""
out=bin/release
docker_archive=""
while [[ $# -gt 0 ]]; do
	case $1 in
	--version) version=${2:?}; shift 2 ;;
	--arch) arches=${2:?}; shift 2 ;;
	--name) name=${2:?}; shift 2 ;;
	--out) out=${2:?}; shift 2 ;;
	--docker-archive) docker_archive=${2:?}; shift 2 ;;
	*) die "unknown argument $1 (see the header of $0)" ;;
	esac
done
[[ $version =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] || die "--version $version: letters, digits, . _ + - only"
name=${name:-gpud.local/gpud:$version}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
# The binary's stamp: the commit and its date (not now: the same commit
# builds the same binary).
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[[ -z $(git status --porcelain --untracked-files=no 2>/dev/null) ]] || commit=$commit-dirty
build_date=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
semver='^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$'
if [[ $version =~ $semver ]]; then
	chart_version=${version#v}
else
	chart_version=0.0.0-dev-${version//[^0-9A-Za-z-]/-}
fi
host=$($GO env GOARCH)

# GNU triplet and Debian cross packages of each architecture.
declare -A TRIPLET=([amd64]=x86_64-linux-gnu [arm64]=aarch64-linux-gnu)
declare -A QEMU=([amd64]=qemu-x86_64 [arm64]=qemu-aarch64)

cross=()
for a in $arches; do
	[[ -v TRIPLET[$a] ]] || die "--arch $a: supported: ${!TRIPLET[*]}"
	[[ $a == "$host" ]] || cross+=("$a")
done
if [[ ${#cross[@]} -gt 0 ]]; then
	scripts/deps.sh $(for a in "${cross[@]}"; do echo "cross-$a"; done)
fi
command -v readelf >/dev/null || scripts/deps.sh release

mkdir -p "$out"
work=$(mktemp -d /tmp/gpud-release.XXXXXX)
trap 'rm -rf "$work"' EXIT

# libdir ARCH: where that architecture's C libraries are on this machine.
libdirs() {
	local t=${TRIPLET[$1]}
	if [[ $1 == "$host" ]]; then
		echo "/lib/$t /usr/lib/$t /lib64 /lib"
	else
		echo "/usr/$t/lib /usr/$t/lib64"
	fi
}

# find_lib ARCH NAME: the file of library NAME for ARCH.
find_lib() {
	local d
	for d in $(libdirs "$1"); do
		[[ -e $d/$2 ]] && { echo "$d/$2"; return; }
	done
	die "$1: library $2 not found in $(libdirs "$1")"
}

# NVML_NEEDS: glibc's libraries NVIDIA's libnvidia-ml.so.1 may list as
# NEEDED besides libc (libm, libpthread, libdl; librt in older drivers).
# The NVML double needs libm, so the Kubernetes tests check it is there.
NVML_NEEDS="libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1"

# add_libs ARCH ROOT ELF: ELF's interpreter and every library it needs,
# recursively, at the paths that architecture's loader searches.
add_libs() {
	local arch=$1 root=$2 elf=$3 interp lib src dst
	interp=$(readelf -l "$elf" 2>/dev/null | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
	if [[ -n $interp && ! -e $root$interp ]]; then
		src=$(find_lib "$arch" "$(basename "$interp")")
		mkdir -p "$root$(dirname "$interp")"
		cp -L "$src" "$root$interp"
	fi
	for lib in $(readelf -d "$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
		dst=$root/lib/${TRIPLET[$arch]}/$lib
		[[ -e $dst || -e $root$interp && $(basename "$interp") == "$lib" ]] && continue
		src=$(find_lib "$arch" "$lib")
		mkdir -p "$(dirname "$dst")"
		cp -L "$src" "$dst"
		add_libs "$arch" "$root" "$dst"
	done
}

platforms=()
for a in $arches; do
	bin=$out/gpud-linux-$a
	cc=gcc
	[[ $a == "$host" ]] || cc=${TRIPLET[$a]}-gcc
	echo "release.sh: building gpud $version for linux/$a ($cc)"
	CGO_ENABLED=1 GOOS=linux GOARCH=$a CC=$cc GOFLAGS=-buildvcs=false \
		$GO build -trimpath -ldflags "-s -w -buildid= -X main.version=$version -X main.commit=$commit -X main.buildDate=$build_date" -o "$bin" ./cmd/gpud
	root=$work/rootfs-$a
	mkdir -p "$root"/{etc,tmp,run,var/lib/gpud,proc,sys,dev}
	chmod 1777 "$root/tmp"
	install -m 0755 "$bin" "$root/gpud"
	add_libs "$a" "$root" "$bin"
	# libnvidia-ml, loaded from the node's driver root at run time, needs
	# glibc's libraries beyond gpud's own: the image carries them, or
	# dlopen fails in the pod.
	for lib in $NVML_NEEDS; do
		dst=$root/lib/${TRIPLET[$a]}/$lib
		[[ -e $dst ]] && continue
		src=$(find_lib "$a" "$lib")
		cp -L "$src" "$dst"
		add_libs "$a" "$root" "$dst"
	done
	echo 'root:x:0:0:root:/:/gpud' >"$root/etc/passwd"
	echo 'root:x:0:' >"$root/etc/group"
	chmod -R u=rwX,go=rX "$root/etc" "$root/lib"* "$root/usr" 2>/dev/null || true
	chmod 1777 "$root/tmp"
	# The image's own files must be enough to run it: run it inside its
	# root filesystem (chrooted on this machine's architecture, under
	# qemu-user with the image's loader and libraries on the other).
	got=""
	if [[ $a == "$host" && $(id -u) -eq 0 ]]; then
		got=$(chroot "$root" /gpud version 2>&1) || die "linux/$a: /gpud does not run in its image: $got"
	elif [[ $a != "$host" ]]; then
		got=$(QEMU_LD_PREFIX=$root "${QEMU[$a]}" "$root/gpud" version 2>&1) ||
			die "linux/$a: /gpud does not run on its image's libraries (${QEMU[$a]}): $got"
	fi
	[[ -z $got || $got == *"gpud $version"*"$commit"*"$build_date"*"linux/$a"* ]] ||
		die "linux/$a: /gpud version says '$got', want $version, $commit, $build_date, linux/$a"
	[[ -n $got ]] && echo "release.sh: linux/$a image runs: ${got%%$'\n'*} (${commit:0:12}, $build_date)"
	platforms+=(--platform "linux/$a=$root")
done

archive=$out/gpud-$version.oci.tar
extra=()
[[ -n $docker_archive ]] && extra=(--docker-archive "$docker_archive")
$GO run ./tools/ociimage build --name "$name" --out "$archive" --epoch "$epoch" "${platforms[@]}" "${extra[@]}" \
	--entrypoint /gpud --cmd run \
	--label org.opencontainers.image.title=gpud \
	--label "org.opencontainers.image.version=$version" \
	--label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
	--label "org.opencontainers.image.licenses=Apache-2.0 AND (GPL-2.0-only OR BSD-2-Clause)" >/dev/null
# The chart, for this image: a copy stamped with the version and the
# image's repository (the chart in the repository stays appVersion dev).
repo=${name%:*}
[[ $repo != "$name" && $repo != */ ]] || die "--name $name: want REPOSITORY:TAG"
mkdir -p "$work/chart"
cp -r deploy/helm/gpud "$work/chart/gpud"
sed -i -e "s|^version: .*|version: $chart_version|" -e "s|^appVersion: .*|appVersion: \"$version\"|" "$work/chart/gpud/Chart.yaml"
sed -i "0,/^  repository: .*/s||  repository: $repo|" "$work/chart/gpud/values.yaml"
grep -q "^  repository: $repo\$" "$work/chart/gpud/values.yaml" || die "could not set image.repository in the chart"
scripts/helm.sh lint --strict "$work/chart/gpud" >/dev/null || die "helm lint of the stamped chart failed"
rm -f "$out"/gpud-"$chart_version".tgz
scripts/helm.sh package "$work/chart/gpud" --destination "$out" >/dev/null
chart=gpud-$chart_version.tgz
[[ -f $out/$chart ]] || die "helm package wrote no $out/$chart"
# helm package stamps the time of packaging: repacked with the commit's
# time, sorted, owners 0 and no gzip timestamp, the same commit gives the
# same chart archive.
mkdir -p "$work/chart-pkg"
tar -xmzf "$out/$chart" -C "$work/chart-pkg"
(cd "$work/chart-pkg" && tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
	--mode=u+rw,go+r,go-w --format=gnu -cf - gpud) | gzip -n -9 >"$out/$chart"
echo "release.sh: chart $out/$chart (version $chart_version, appVersion $version, image $repo:$version)"

# The release notes: CHANGELOG.md's section of this version.
notes=gpud-$version.release-notes.md
section() { awk -v h="$1" '$0 ~ "^## " { if (on) exit; if (index($0, "## " h) == 1 && (length($0) == length(h) + 3 || substr($0, length(h) + 4, 1) ~ /[ (]/)) { on = 1; next } } on' CHANGELOG.md; }
body=$(section "$version")
if [[ -z $body ]]; then
	body=$(section Unreleased)
	[[ -n $body ]] || die "CHANGELOG.md has neither a \"## $version\" nor a \"## Unreleased\" section"
	echo "release.sh: warning: CHANGELOG.md has no \"## $version\" section: the notes are Unreleased's (rename it before tagging)" >&2
fi
printf '# gpud %s\n\nCommit %s, %s.\n%s\n' "$version" "$commit" "$build_date" "$body" >"$out/$notes"

(cd "$out" && sha256sum "gpud-$version.oci.tar" $(for a in $arches; do echo "gpud-linux-$a"; done) "$chart" "$notes" >SHA256SUMS)
$GO run ./tools/ociimage inspect "$archive"
echo "release.sh: $archive, $out/$chart, $out/$notes, $out/SHA256SUMS (push: make push REGISTRY=... VERSION=$version)"
