#!/usr/bin/env bash
# Builds Summa's container image from deploy/docker/Dockerfile and tags it with the git revision:
#   scripts/image.sh [--gpu | --prebuilt BUILD_DIR] [--iidfile FILE]
# CPU (default): localhost/summa:cpu and localhost/summa:cpu-<revision>[-dirty], on a Debian 12
# base that it makes when it is missing (mmdebstrap from the Debian mirror, imported as
# localhost/debian:bookworm). --gpu: localhost/summa:gpu and :gpu-<revision> on NVIDIA's CUDA
# images, only where those can be pulled. --iidfile writes the built image's ID there.
# --prebuilt BUILD_DIR (CPU only; the test suite's way): the image holds the summa-server and
# summa-worker that BUILD_DIR already holds, a plain Release build of this machine (Debian 12, as
# the image), rather than compiling them again in the build stage (minutes on two cores);
# everything else is built as always. The tags name the checkout's revision: the binaries are
# whatever BUILD_DIR was last built from. A build with sanitizers, fuzzing or fault injection
# (-DSUMMA_FAULT_INJECTION=ON, as scripts/build.sh makes the test suite's build/) is refused:
# its binaries are not the ones to ship (tests/CMakeLists.txt builds the suite's image from a
# build directory of its own without fault injection).
# Installs what it needs first (scripts/setup.sh --image: podman, runc, mmdebstrap); the engine
# is podman, or docker where that is what the machine has (scripts/container.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/image.sh [--gpu | --prebuilt BUILD_DIR] [--iidfile FILE]"
flavour=cpu
iidfile=""
prebuilt=""
while (($#)); do
  case "$1" in
    --gpu) flavour=gpu ;;
    --iidfile) iidfile=${2:?$usage}; shift ;;
    --iidfile=?*) iidfile=${1#--iidfile=} ;;
    --prebuilt) prebuilt=${2:?$usage}; shift ;;
    --prebuilt=?*) prebuilt=${1#--prebuilt=} ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift
done

if [[ -n "$prebuilt" ]]; then
  if [[ "$flavour" == gpu ]]; then
    echo "image: --prebuilt makes the CPU image only (the GPU image's base is Ubuntu's)" >&2
    exit 2
  fi
  cache() { sed -n "s/^$1:[A-Z]*=//p" "$prebuilt/CMakeCache.txt" 2>/dev/null || true; }
  if [[ "$(cache CMAKE_BUILD_TYPE)" != Release || -n "$(cache SUMMA_SANITIZE)" || "$(cache SUMMA_FUZZ)" == ON ]]; then
    echo "image: --prebuilt $prebuilt is not a plain Release build of scripts/build.sh" \
      "(CMAKE_BUILD_TYPE '$(cache CMAKE_BUILD_TYPE)', SUMMA_SANITIZE '$(cache SUMMA_SANITIZE)', SUMMA_FUZZ '$(cache SUMMA_FUZZ)')" >&2
    exit 2
  fi
  if [[ "$(cache SUMMA_FAULT_INJECTION)" != OFF ]]; then
    echo "image: --prebuilt $prebuilt is a test build with fault injection (SUMMA_FAULT_INJECTION" \
      "'$(cache SUMMA_FAULT_INJECTION)'; scripts/build.sh makes build/ so for the test suite): its" \
      "summa-worker takes the test-only --fault_* flags. Give a build configured with" \
      "-DSUMMA_FAULT_INJECTION=OFF, or build without --prebuilt" >&2
    exit 2
  fi
  for binary in server/summa-server server/summa-checkpoint worker/summa-worker; do
    if [[ ! -x "$prebuilt/$binary" ]]; then
      echo "image: --prebuilt $prebuilt holds no $binary: build it first (scripts/build.sh)" >&2
      exit 2
    fi
  done
  # Binaries older than the sources would be labelled with a revision they were not built from.
  if ninja -C "$prebuilt" -n summa-server summa-checkpoint summa-worker 2>/dev/null | grep -qE 'Building|Linking'; then
    echo "image: --prebuilt $prebuilt is not up to date with the sources: build it first (scripts/build.sh)" >&2
    exit 2
  fi
fi

scripts/setup.sh --image
engine=$(scripts/container.sh --which)

case "$flavour" in
  cpu)
    base=localhost/debian:bookworm
    runtime_base=$base
    ;;
  gpu)
    base=docker.io/nvidia/cuda:13.0.0-devel-ubuntu24.04
    runtime_base=docker.io/nvidia/cuda:13.0.0-runtime-ubuntu24.04
    ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# --prebuilt: the binaries go in the build context under a name of this run's own, which the
# build argument PREBUILT names; without it the build stage compiles, whatever the context holds.
# Those a killed run left behind (its PID gone) are removed.
for stale in .prebuilt.*; do
  if [[ -d "$stale" ]] && ! kill -0 "${stale#.prebuilt.}" 2>/dev/null; then rm -rf "$stale"; fi
done
staged=""
if [[ -n "$prebuilt" ]]; then
  staged=.prebuilt.$$
  trap 'rm -rf "$work" "$staged"' EXIT
  # The binaries only: the CUDA plugin a build of this machine may hold needs CUDA's libraries,
  # which the CPU image has not.
  install -D -m 0755 "$prebuilt/server/summa-server" "$staged/server/summa-server"
  install -D -m 0755 "$prebuilt/server/summa-checkpoint" "$staged/server/summa-checkpoint"
  install -D -m 0755 "$prebuilt/worker/summa-worker" "$staged/worker/summa-worker"
fi
if [[ "$flavour" == cpu ]] && ! scripts/container.sh image inspect "$base" >/dev/null 2>&1; then
  echo "image: making $base (mmdebstrap, Debian 12 minbase without docs, man pages or locales)"
  # The mirrors are named, so mmdebstrap does not read them from a standard input that is not a
  # terminal (CI's); the excluded paths stay excluded for packages installed on this base later.
  mmdebstrap --variant=minbase --format=tar --quiet \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    bookworm "$work/base.tar" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main" </dev/null
  scripts/container.sh import "$work/base.tar" "$base" >/dev/null
fi

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
tag=$flavour-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then tag+=-dirty; fi
version=$(git describe --tags --always --dirty 2>/dev/null || echo unknown)
source=$(git config --get remote.origin.url 2>/dev/null || echo "file://$PWD")

echo "image: building localhost/summa:$flavour and localhost/summa:$tag with $engine${prebuilt:+ from the binaries of $prebuilt}"
start=$SECONDS
# The labels also on the command line: podman 4.3 takes a cached LABEL step whatever the
# build arguments it expands, and so would label a new revision's image with an old revision.
labels=()
for kv in "source=$source" "version=$version" "revision=$revision"; do
  labels+=(--label "org.opencontainers.image.$kv")
done
scripts/container.sh build -f deploy/docker/Dockerfile \
  --build-arg BASE="$base" --build-arg RUNTIME_BASE="$runtime_base" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" --build-arg SOURCE="$source" \
  --build-arg PREBUILT="$staged" \
  "${labels[@]}" \
  --iidfile "$work/iid" -t "localhost/summa:$flavour" -t "localhost/summa:$tag" .
id=$(cat "$work/iid")
if [[ -n "$iidfile" ]]; then
  mkdir -p "$(dirname "$iidfile")"
  cp "$work/iid" "$iidfile"
fi
size=$(scripts/container.sh image inspect --format '{{.Size}}' "$id")
echo "image: localhost/summa:$tag ($id) built in $((SECONDS - start)) s, $((size / 1000000)) MB"
