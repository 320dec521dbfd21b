#!/usr/bin/env bash
# Configures and builds Summa into build/ (Release). The CUDA backend is configured whenever
# /usr/local/cuda/bin/nvcc exists. Extra arguments go to cmake's configure step (after ours, so
# they win).
#   scripts/build.sh [--binaries] [CMAKE_ARGS...]
# By default: everything, as the test suite runs it, with fault injection (summa-worker's
# test-only --fault_* flags, which tests/fault_process_test.py, shard_fault_process_test.py and
# train_process_test.py use).
# --binaries builds only summa-server, summa-checkpoint, summa-worker and, with CUDA, the worker's plugin
# libsumma_cuda.so (no tests, benchmarks or Python package), and without fault injection: the
# container image's build stage.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
targets=()
fault_injection=ON
if [[ "${1:-}" == --binaries ]]; then
  shift
  targets=(--target summa-server summa-checkpoint summa-worker)
  fault_injection=OFF
  if [[ -x /usr/local/cuda/bin/nvcc && " $* " != *" -DSUMMA_DISABLE_CUDA=ON "* ]]; then
    targets+=(summa_cuda)
  fi
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSUMMA_FAULT_INJECTION="$fault_injection" "$@" >/dev/null
cmake --build build -j "$jobs" "${targets[@]}"
