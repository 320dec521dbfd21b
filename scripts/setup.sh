#!/usr/bin/env bash
# Installs every Debian package that Summa's build, tests and default run need.
# Idempotent: packages already present are not touched, and `apt-get update` runs at most once.
# Usage: scripts/setup.sh [--bench] [--fuzz] [--image] [--binaries]
#   --bench     adds matplotlib for bench/
#   --fuzz      adds clang and its libFuzzer runtime for scripts/fuzz.sh
#   --image     adds podman, runc and mmdebstrap for scripts/image.sh and the container test
#   --binaries  instead of the base set, only what building summa-server and summa-worker needs
#               (scripts/build.sh --binaries): the container image's build stage
# PyTorch and NumPy are in the base set: the Python client's tests (tests/python_client_test.py)
# train with them; python3-venv and setuptools let that test pip-install the package into a
# virtualenv; pybind11-dev and python3-dev build its C++ extension (summa._native, in build/ and
# under pip). python3-mpi4py (with Open MPI's openmpi-bin) runs the AllReduce benchmark's mpi rows,
# which its smoke test checks.
set -euo pipefail

packages=(
  build-essential cmake pkg-config ninja-build systemd
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev
  libopenblas-dev zlib1g-dev prometheus-cpp-dev libssl-dev
  dataset-fashion-mnist grpc-proto openssl
  python3 python3-grpcio python3-protobuf python3-yaml python3-dev pybind11-dev
  python3-torch python3-numpy python3-venv python3-setuptools python3-wheel
  python3-mpi4py
)
# CMake's configure step finds GoogleTest even when only the binaries are built.
binaries=(
  build-essential cmake pkg-config ninja-build
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgtest-dev libgmock-dev
  libopenblas-dev zlib1g-dev prometheus-cpp-dev libssl-dev grpc-proto
)
extra=()
for arg in "$@"; do
  case "$arg" in
    --bench) extra+=(python3-matplotlib) ;;
    --fuzz) extra+=(clang libclang-rt-14-dev) ;;
    --image) extra+=(podman runc mmdebstrap) ;;
    --binaries) packages=("${binaries[@]}") ;;
    *) echo "usage: scripts/setup.sh [--bench] [--fuzz] [--image] [--binaries]" >&2; exit 2 ;;
  esac
done
packages+=("${extra[@]}")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: installed ${#missing[@]} packages"
