#!/usr/bin/env bash
# LeNet on Fashion-MNIST through scripts/launch.sh, side by side in one run: 1 CPU worker, then 2
# CPU workers with the data path on the socket data plane, then 2 on gRPC, ROUNDS times in turn;
# then one traced epoch of 2 workers on each transport, summed up by bench/trace_summary.py (the
# communication per step: the exchange of the worker that arrived last). Prints a markdown table
# of seconds per epoch (median of the epochs, and their range) and each 2-worker run's ratio to
# the 1-worker run of its round, with the command behind it.
#
#   bench/lenet_planes.sh [EPOCHS (default 5)] [ROUNDS (default 2)] > bench/results-planes.md
#
# Every run gets the same environment (below): one OpenBLAS/OpenMP thread, glibc's allocator kept
# from returning memory (PyTorch's comparison runs use the same).
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-5}
rounds=${2:-2}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184
trace_dir=$(mktemp -d "${TMPDIR:-/tmp}/summa-lenet-planes.XXXXXX")
trap 'rm -rf "$trace_dir"' EXIT

# Seconds per epoch of one run: "median min-max".
epoch_stats() {
  grep -o '[0-9.]* sec/epoch' | awk '{print $1}' | sort -n | awk '
    { v[NR] = $1 }
    END {
      if (NR == 0) exit 1
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "%.2f %.2f-%.2f\n", m, v[1], v[NR]
    }'
}

run() {  # workers plane: prints "median range accuracy"
  local out
  out=$(scripts/launch.sh --workers "$1" --epochs "$epochs" --batch_size 256 --lr 0.2 -- --progress=never \
        --threads=1 --data_plane="$2" 2>&1) || { echo "lenet_planes: a run failed:" >&2; echo "$out" >&2; exit 1; }
  local stats acc
  stats=$(echo "$out" | epoch_stats) || { echo "lenet_planes: no epoch lines:" >&2; echo "$out" >&2; exit 1; }
  acc=$(echo "$out" | grep -o 'test acc [0-9.]*' | tail -1 | awk '{print $3}')
  echo "$stats $acc"
}

echo "Command: bench/lenet_planes.sh $epochs $rounds"
echo
echo "Environment: $(getconf _NPROCESSORS_ONLN) cores, OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GLIBC_TUNABLES=$GLIBC_TUNABLES;" \
     "load average $(cut -d' ' -f1 /proc/loadavg) at start, $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
     "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo
echo "Each run: scripts/launch.sh --workers N --epochs $epochs --batch_size 256 --lr 0.2 -- --progress=never --threads=1 --data_plane=P"
echo
echo "| round | run | sec/epoch (median) | epochs' range | test acc | ratio to 1 worker |"
echo "|---:|---|---:|---:|---:|---:|"
for ((round = 1; round <= rounds; round++)); do
  result=$(run 1 auto)
  read -r one one_range one_acc <<<"$result"
  echo "| $round | 1 worker | $one | $one_range | $one_acc | 1.00 |"
  for plane in socket grpc; do
    result=$(run 2 "$plane")
    read -r two two_range two_acc <<<"$result"
    ratio=$(awk -v a="$two" -v b="$one" 'BEGIN { printf "%.2f", a / b }')
    echo "| $round | 2 workers, data path on $plane | $two | $two_range | $two_acc | $ratio |"
  done
done
echo
for plane in socket grpc; do
  mkdir -p "$trace_dir/$plane"
  scripts/launch.sh --workers 2 --epochs 1 --batch_size 256 --lr 0.2 --trace_dir "$trace_dir/$plane" -- \
    --progress=never --threads=1 --data_plane="$plane" >/dev/null 2>&1
  echo "2 workers, one traced epoch, data path on $plane: $(/usr/bin/python3 bench/trace_summary.py \
    "$trace_dir/$plane"/*.json | grep '^communication per step')"
done
