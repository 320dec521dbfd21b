#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the whole suite.
#
#   scripts/test.sh                               the whole suite in build/ (CI's command)
#   scripts/test.sh --sanitize=address,undefined  the server's and the worker's unit and service
#   scripts/test.sh --sanitize=thread             tests (ctest label `unit`), built with those
#                                                 sanitizers in build-asan/ or build-tsan/
#
# A sanitizer pass leaves out the process tests (Python starting the real binaries), the CUDA
# backend's test and the benchmark's: see tests/CMakeLists.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=""
for arg in "$@"; do
  case "$arg" in
    --sanitize=?*) sanitize=${arg#--sanitize=} ;;
    *) echo "usage: scripts/test.sh [--sanitize=address,undefined | --sanitize=thread]" >&2; exit 2 ;;
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
    -DSUMMA_DISABLE_CUDA=ON >/dev/null
  cmake --build "$dir" -j "$(nproc)" --target summa_unit_tests
  (cd "$dir" && ctest --output-on-failure --timeout 600 -j "$(nproc)" "${select[@]}")
}

scripts/setup.sh
if [[ -n "$sanitize" ]]; then
  sanitized_pass "$sanitize"
  exit
fi
scripts/build.sh
cd build
ctest --output-on-failure --timeout 600 -j "$(nproc)" --no-label-summary
