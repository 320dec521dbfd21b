#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/) with clang into build-fuzz/ and runs each, one after
# another, from its seed corpus fuzz/corpus/<harness>/. Exits non-zero at the first harness that
# finds a crash, a leak, a UBSan report, an input slower than 10 s or one that needs over 2 GiB,
# naming the reproducer.
#
# Usage: scripts/fuzz.sh [seconds per harness, default 60] [harness ...]   (default: all of them)
#        scripts/fuzz.sh --ci [harness ...]
# A timed run explores: it keeps what it finds in build-fuzz/corpus/<harness>/ (never in the
# repository) and starts from there next time. --ci (CI's pass, from scripts/test.sh) replays the
# repository's inputs of each harness (a failure fails the pass), then explores from them for a
# fixed number of inputs (about 20 s each here), reporting any find loudly without failing: see
# below.
# A reproducer runs alone: build-fuzz/fuzz/<harness> <file>.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/fuzz.sh [seconds per harness | --ci] [harness ...]"
ci=false
seconds=60
case "${1:-}" in
  --ci) ci=true; shift ;;
  '') ;;
  *)
    if [[ ! "$1" =~ ^[0-9]+$ ]]; then
      echo "$usage" >&2
      exit 2
    fi
    seconds=$1
    shift
    ;;
esac
# --ci: inputs per harness, about 20 s each on the 2-core VM from the seeds (executions per second
# fall as the inputs grow).
declare -A ci_runs=([checkpoint_fuzzer]=15000 [idx_fuzzer]=20000 [wire_fuzzer]=600000
                    [parameter_server_fuzzer]=10000 [all_reduce_fuzzer]=12000
                    [plane_fuzzer]=2000)
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  harnesses=(checkpoint_fuzzer idx_fuzzer wire_fuzzer parameter_server_fuzzer all_reduce_fuzzer plane_fuzzer)
fi

scripts/setup.sh --fuzz
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DSUMMA_FUZZ=ON -DSUMMA_DISABLE_CUDA=ON >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target summa_fuzzers

# Runs one harness: fuzz_one HARNESS CORPUS_DIR LIBFUZZER_FLAGS...; prints the reproducer and
# returns 1 when it finds something.
fuzz_one() {
  local harness=$1 corpus=$2
  shift 2
  local crashes=build-fuzz/crashes/$harness log=build-fuzz/$harness.log
  mkdir -p "$corpus" "$crashes"
  rm -f "$crashes"/*
  if ! build-fuzz/fuzz/"$harness" "$@" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$crashes/" "$corpus" "fuzz/corpus/$harness" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "fuzz: $harness FOUND A BUG; reproduce with: build-fuzz/fuzz/$harness $crashes/$(ls -t "$crashes" | head -n 1)"
    return 1
  fi
  local runs coverage
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  coverage=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
  echo "fuzz: $harness ok: $runs runs, $coverage, corpus $(ls "$corpus" | wc -l) + $(ls "fuzz/corpus/$harness" | wc -l) seeds"
}

found=()
for harness in "${harnesses[@]}"; do
  if [[ -z "${ci_runs[$harness]:-}" ]]; then
    echo "fuzz: no harness named $harness (${!ci_runs[*]})" >&2
    exit 2
  fi
  if ! $ci; then
    echo "fuzz: $harness for ${seconds}s (log: build-fuzz/$harness.log)"
    fuzz_one "$harness" "build-fuzz/corpus/$harness" -max_total_time="$seconds" || exit 1
    continue
  fi
  # 1. The seeds and regression inputs, each once: the same every time, so a failure here is the
  #    code's. It fails the pass.
  echo "fuzz: $harness: the $(ls "fuzz/corpus/$harness" | wc -l) committed inputs"
  empty=$(mktemp -d "${TMPDIR:-/tmp}/summa-fuzz-ci.XXXXXX")
  fuzz_one "$harness" "$empty" -runs=0 || { rm -rf "$empty"; exit 1; }
  # 2. Exploration from them for a fixed number of inputs. Not repeatable (Abseil salts its hashes
  #    per process, so coverage, and with it the path libFuzzer takes, differs run to run): what it
  #    finds is a real bug to fix with a regression input, reported loudly, but it does not fail
  #    the pass, which would fail an unrelated change by chance.
  echo "fuzz: $harness: exploring ${ci_runs[$harness]} inputs"
  fuzz_one "$harness" "$empty" -runs="${ci_runs[$harness]}" -seed=1 || found+=("$harness")
  rm -rf "$empty"
done
if ((${#found[@]} > 0)); then
  echo "fuzz: EXPLORATION FOUND BUGS in ${found[*]} (reproducers above; they do not fail CI, being found by chance: fix them, and add each reproducer to fuzz/corpus/<harness>/)"
fi
