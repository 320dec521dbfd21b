#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/) with clang into build-fuzz/ and runs each for a bounded
# time, one after another, from its seed corpus fuzz/corpus/<harness>/ (what a run adds is kept in
# build-fuzz/corpus/<harness>/, never in the repository). Exits non-zero at the first harness that
# finds a crash, a leak, a UBSan report, an input slower than 10 s or one that needs over 2 GiB,
# naming the reproducer.
#
# Usage: scripts/fuzz.sh [seconds per harness, default 60] [harness ...]   (default: all of them)
# A reproducer runs alone: build-fuzz/fuzz/<harness> <file>.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
if [[ ! "$seconds" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh [seconds per harness] [harness ...]" >&2
  exit 2
fi
shift || true
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  harnesses=(checkpoint_fuzzer idx_fuzzer wire_fuzzer parameter_server_fuzzer all_reduce_fuzzer)
fi

scripts/setup.sh --fuzz
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DSUMMA_FUZZ=ON -DSUMMA_DISABLE_CUDA=ON >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target summa_fuzzers

for harness in "${harnesses[@]}"; do
  corpus=build-fuzz/corpus/$harness
  crashes=build-fuzz/crashes/$harness
  log=build-fuzz/$harness.log
  mkdir -p "$corpus" "$crashes"
  rm -f "$crashes"/*
  echo "fuzz: $harness for ${seconds}s (log: $log)"
  if ! build-fuzz/fuzz/"$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$crashes/" "$corpus" "fuzz/corpus/$harness" >"$log" 2>&1; then
    tail -n 40 "$log"
    reproducer=$(ls -t "$crashes" | head -n 1)
    echo "fuzz: $harness FAILED; reproduce with: build-fuzz/fuzz/$harness $crashes/$reproducer"
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  coverage=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
  echo "fuzz: $harness ok: $runs runs, $coverage, corpus $(ls "$corpus" | wc -l) + $(ls "fuzz/corpus/$harness" | wc -l) seeds"
done
