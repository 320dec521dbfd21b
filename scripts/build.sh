#!/usr/bin/env bash
# Configures and builds Summa into build/ (Release). The CUDA backend is configured whenever
# /usr/local/cuda/bin/nvcc exists. Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
