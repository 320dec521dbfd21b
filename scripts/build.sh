#!/usr/bin/env bash
# Configures and builds Summa into build/ (Release). The CUDA backend is configured whenever
# /usr/local/cuda/bin/nvcc exists. Extra arguments go to cmake's configure step.
#   scripts/build.sh [--binaries] [CMAKE_ARGS...]
# --binaries builds only summa-server, summa-worker and, with CUDA, the worker's plugin
# libsumma_cuda.so (no tests, benchmarks or Python package): the container image's build stage.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
targets=()
if [[ "${1:-}" == --binaries ]]; then
  shift
  targets=(--target summa-server summa-worker)
  if [[ -x /usr/local/cuda/bin/nvcc && " $* " != *" -DSUMMA_DISABLE_CUDA=ON "* ]]; then
    targets+=(summa_cuda)
  fi
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs" "${targets[@]}"
