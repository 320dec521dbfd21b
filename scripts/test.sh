#!/usr/bin/env bash
# The README's test command (and CI's): installs what is missing, builds, and runs
#   1. the whole suite in build/;
#   2. the ASan/UBSan pass: the server's and the worker's unit and service tests (ctest label
#      `unit`) built with -fsanitize=address,undefined in build-asan/;
#   3. a short fuzzing pass, the same every time: every harness of fuzz/ for a fixed number of
#      inputs from the repository's seeds (scripts/fuzz.sh --ci, build-fuzz/).
# All three run whatever the others say; the exit status is non-zero when any failed.
#
#   scripts/test.sh --suite                       only 1 (the whole suite, as before the passes)
#   scripts/test.sh --sanitize=address,undefined  only 2
#   scripts/test.sh --sanitize=thread             the TSan pass (build-tsan/), not part of CI
#
# A sanitizer pass leaves out the process tests (Python starting the real binaries), the CUDA
# backend's test and the benchmark's: see tests/CMakeLists.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/test.sh [--suite | --sanitize=address,undefined | --sanitize=thread]"
mode=all
sanitize=""
for arg in "$@"; do
  case "$arg" in
    --suite) mode=suite ;;
    --sanitize=?*) mode=sanitize; sanitize=${arg#--sanitize=} ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done

# Builds the unit tests with -fsanitize=$1 in a directory of their own and runs them; a report
# fails its test (ASan and TSan exit non-zero, UBSan is built not to recover).
sanitized_pass() {
  local sanitizers=$1 dir
  local select=(-L unit)
  case "$sanitizers" in
    address,undefined | undefined,address | address) dir=build-asan ;;
    thread) dir=build-tsan ;;
    *) dir="build-${sanitizers//,/-}" ;;
  esac
  # TSan cannot see the synchronization inside Debian's gRPC: the tests that run gRPC in-process
  # (label unit-grpc) stay out of its pass (tests/CMakeLists.txt).
  if [[ "$sanitizers" == *thread* ]]; then select+=(-LE grpc); fi
  export ASAN_OPTIONS="detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
  echo "test: -fsanitize=$sanitizers in $dir/ (${select[*]})"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSUMMA_SANITIZE="$sanitizers" \
    -DSUMMA_DISABLE_CUDA=ON >/dev/null || return
  cmake --build "$dir" -j "$(nproc)" --target summa_unit_tests || return
  (cd "$dir" && ctest --output-on-failure --timeout 600 -j "$(nproc)" "${select[@]}")
}

# (Each step returns on failure itself: `set -e` does not hold inside a function called from `||`.)
suite() {
  scripts/build.sh || return
  (cd build && ctest --output-on-failure --timeout 600 -j "$(nproc)" --no-label-summary)
}

scripts/setup.sh --image  # podman for the container test (tests/container_test.py)
case "$mode" in
  suite) suite ;;
  sanitize) sanitized_pass "$sanitize" ;;
  all)
    failed=()
    suite || failed+=(suite)
    sanitized_pass address,undefined || failed+=(asan,ubsan)
    scripts/fuzz.sh --ci || failed+=(fuzz)
    if ((${#failed[@]} > 0)); then
      echo "test: FAILED: ${failed[*]}"
      exit 1
    fi
    echo "test: suite, asan,ubsan and fuzz passes all passed"
    ;;
esac
