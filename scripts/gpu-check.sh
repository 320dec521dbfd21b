#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU. It prints PASS only if all of this held:
# - nvidia-smi -L lists a GPU;
# - libcublas.so.13 is found (ldconfig, /usr/local/cuda*/lib64, or a Python package's
#   nvidia/cublas/lib, as GPU images with PyTorch carry it); its folder joins LD_LIBRARY_PATH;
# - the CUDA-vs-CPU tests pass with SUMMA_REQUIRE_GPU=1 (a skip is a failure) and none skipped;
# - training the seed's job with --device=cuda:0 (never auto, which may fall back to the CPU) for
#   2 epochs, with 1 worker and with 2 workers sharing the GPU, succeeds and every epoch line says
#   it ran on cuda:0.
# - compute-sanitizer's memcheck and racecheck report nothing on the CUDA tests, where the
#   sanitizer can run on this machine (it says "Device not supported" where it cannot);
# - with --bench E: bench/gpu_bench.py (Summa 1 and 2 workers and PyTorch on the GPU, E epochs;
#   with --profile also a timeline of 1 worker's steps and ncu's per-kernel times) finishes and
#   meets its checks; its table lands in $OUT/results-gpu.md.
# - with --python S: the Python package on cuda:0 (the bundle's bin/python, with a summa._native
#   built for this machine's python3: gpu-bundle.sh --python): tests/python_overlap_test.py's GPU
#   case passes and did not skip (2 processes on the GPU end where 2 on the CPU do, each optimizer,
#   overlapped or not); then bench/python_bench.py --device cuda, the ResNet-18 shape and the GPT
#   with 1 and 2 processes against DDP, S steps each, and the exchange of 64 MiB alone from Python
#   against the C++ client's; its table lands in $OUT/results-python-gpu.md.
# Prints seconds per epoch and test accuracy. Uses .bundle/ from scripts/gpu-bundle.sh when present
# (a machine with no Debian packages), else build/. Everything it prints is also kept in $OUT (or
# gpu-check-out/) when that is set.
#   scripts/gpu-check.sh [--epochs N] [--bench E [--profile]] [--python S] [--no_sanitizer]
# (--no_sanitizer leaves compute-sanitizer out, where device time is short.)
set -uo pipefail
cd "$(dirname "$0")/.."
epochs=2 bench=0 profile=() python_steps=0 sanitize=1
while (($#)); do
  case "$1" in
    --epochs|--bench|--python)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || { echo "gpu-check: $1 needs a number" >&2; exit 2; }
      case "$1" in --epochs) epochs=$2 ;; --bench) bench=$2 ;; *) python_steps=$2 ;; esac
      shift 2 ;;
    --profile) profile=(--profile); shift ;;
    --no_sanitizer) sanitize=0; shift ;;
    *) echo "gpu-check: unknown argument '$1' (--epochs N, --bench E, --profile, --python S, --no_sanitizer)" >&2; exit 2 ;;
  esac
done
out=${OUT:-gpu-check-out}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1

status=0
failures=()
fail() {
  echo "gpu-check: FAIL: $*"
  failures+=("$*")
  status=1
}

if [[ -f .bundle/summa.tar.xz ]]; then
  unpacked=$(mktemp -d "${TMPDIR:-/tmp}/summa-bundle.XXXXXX")
  tar -C "$unpacked" -xJf .bundle/summa.tar.xz
  bin=$unpacked/bin data=$PWD/.bundle/data launch=$unpacked/scripts/launch.sh
  export LD_LIBRARY_PATH="$unpacked/lib:${LD_LIBRARY_PATH:-}"
else
  bin=build data=/usr/share/datasets/fashion-mnist launch=scripts/launch.sh
fi
echo "== gpu-check: binaries from $bin, data from $data"

echo "== the GPU"
gpus=""
if command -v nvidia-smi >/dev/null; then
  gpus=$(nvidia-smi -L 2>&1 | grep '^GPU ' || true)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
fi
if [[ -n "$gpus" ]]; then
  echo "$gpus"
else
  fail "no GPU: $(command -v nvidia-smi >/dev/null && echo 'nvidia-smi -L lists none' || echo 'nvidia-smi is not installed')"
fi

echo "== cuBLAS (libcublas.so.13)"
# Prints "<path> (<how found>)" for the first libcublas.so.13 found, nothing if none.
find_cublas() {
  local p
  p=$(ldconfig -p 2>/dev/null | awk '$1 == "libcublas.so.13" {print $NF; exit}')
  [[ -n "$p" ]] && { echo "$p (ldconfig)"; return; }
  for p in /usr/local/cuda*/lib64/libcublas.so.13 /usr/local/cuda*/lib/libcublas.so.13 \
           /usr/local/cuda*/targets/*/lib/libcublas.so.13; do
    [[ -e "$p" ]] && { echo "$p (CUDA toolkit)"; return; }
  done
  local roots=()
  if command -v python3 >/dev/null; then
    mapfile -t roots < <(python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
  fi
  for p in /usr/lib/python3* /usr/local/lib/python3* /opt /root /home; do [[ -d "$p" ]] && roots+=("$p"); done
  local existing=()
  for p in "${roots[@]}"; do [[ -d "$p" ]] && existing+=("$p"); done
  ((${#existing[@]})) || return 0
  p=$(find "${existing[@]}" -path '*/nvidia/cublas/lib/libcublas.so.13' -print -quit 2>/dev/null)
  [[ -n "$p" ]] && echo "$p (Python package)"
}
cublas=$(find_cublas)
if [[ -n "$cublas" ]]; then
  cublas_dir=$(dirname "${cublas% (*}")
  echo "gpu-check: libcublas.so.13 found: $cublas; $cublas_dir joins LD_LIBRARY_PATH"
  export LD_LIBRARY_PATH="$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  fail "libcublas.so.13 not found (ldconfig -p, /usr/local/cuda*/lib64, Python packages' nvidia/cublas/lib)"
fi
# The bundle's plugin sits beside the worker (worker/cuda/); a build tree's in worker/compute/cuda/.
plugin=$bin/worker/cuda/libsumma_cuda.so
[[ -f "$plugin" ]] || plugin=$bin/worker/compute/cuda/libsumma_cuda.so
if [[ -f "$plugin" ]]; then
  ldd "$plugin" | grep -E "not found|cublas" || true
  ldd "$plugin" | grep -q "not found" && fail "$plugin: a library it needs is not found (above)"
else
  fail "$plugin is missing: this build has no CUDA backend"
fi

echo "== CUDA vs CPU tests (SUMMA_REQUIRE_GPU=1: a skip is a failure)"
export SUMMA_REQUIRE_GPU=1
"$bin/tests/backend_checks_test" || fail "backend_checks_test (the checks, CPU against CPU)"
test_log=$out/cuda_backend_test.log
"$bin/tests/cuda_backend_test" 2>&1 | tee "$test_log"
rc=${PIPESTATUS[0]}
((rc == 0)) || fail "cuda_backend_test exited with status $rc"
if grep -q '^\[  SKIPPED \]' "$test_log"; then
  if [[ -n "$gpus" ]]; then
    fail "CUDA tests skipped although nvidia-smi lists a GPU"
  else
    fail "CUDA tests skipped: no GPU"
  fi
fi
grep -qE '^\[  PASSED  \] [1-9]' "$test_log" || fail "no CUDA test passed"
"$bin/tests/lenet_test" || fail "lenet_test"

# The interpreter with torch: Debian's where it has torch, else the first python3.
python=$(command -v python3)
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import torch' 2>/dev/null && python=/usr/bin/python3
if ((python_steps > 0)); then
  echo "== Python on cuda:0 ($python): tests/python_overlap_test.py's GPU case"
  if [[ -d "$bin/python/summa" ]]; then
    "$python" -c 'import sys; sys.path.insert(0, sys.argv[1]); from summa import client
assert client._native is not None, client.NATIVE_IMPORT_ERROR
print("summa._native:", client._native.__file__)' "$bin/python" || fail "summa._native does not load in $python"
    py_log=$out/python-gpu-test.log
    PYTHONUNBUFFERED=1 timeout 300 "$python" tests/python_overlap_test.py --bin "$bin" --source . -v \
      PythonOverlapTest.test_gpu_parameters_train_as_on_the_cpu 2>&1 | tee "$py_log"
    rc=${PIPESTATUS[0]}
    ((rc == 0)) || fail "python_overlap_test's GPU case exited with status $rc"
    grep -q "skipped" "$py_log" && fail "python_overlap_test's GPU case skipped"
  else
    fail "$bin/python/summa is missing (scripts/gpu-bundle.sh after the package is built)"
  fi
fi

sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if ((!sanitize)); then
  echo "== compute-sanitizer: left out (--no_sanitizer)"
elif [[ -n "$sanitizer" ]]; then
  # memcheck also runs the LeNet steps (every kernel, the gather from resident tables); racecheck,
  # much slower, the operations one by one.
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer ($tool) on the CUDA tests"
    san_log=$out/sanitizer-$tool.log
    filter='-*EveryOperationSelectsItsDevice*'
    [[ "$tool" == racecheck ]] && filter='-*LeNetSteps*:*EveryOperationSelectsItsDevice*'
    "$sanitizer" --tool "$tool" --error-exitcode 3 "$bin/tests/cuda_backend_test" \
      --gtest_filter="$filter" 2>&1 | tee "$san_log"
    rc=${PIPESTATUS[0]}
    if grep -q 'Device not supported' "$san_log"; then
      echo "compute-sanitizer ($tool) cannot run on this machine (Device not supported)"
    elif ((rc != 0)); then
      fail "compute-sanitizer $tool: exit $rc (see $san_log)"
    fi
  done
else
  echo "== compute-sanitizer: not installed here"
fi

for workers in 1 2; do
  echo "== training: $workers worker(s) on cuda:0, $epochs epochs, batch 256, lr 0.2"
  train_log=$out/train-$workers.log
  "$launch" --bin "$bin" --workers "$workers" --epochs "$epochs" --batch_size 256 --lr 0.2 -- \
    --device=cuda:0 --data_dir="$data" --progress=never 2>&1 | tee "$train_log"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) || { fail "training with $workers worker(s) on cuda:0 exited with status $rc"; continue; }
  lines=$(grep -cE '^epoch [0-9]+/[0-9]+: .* on \[' "$train_log")
  ((lines == epochs)) || fail "training with $workers worker(s): $lines epoch lines, want $epochs"
  while read -r line; do
    on=${line##* on }
    [[ "$on" == *cuda:0* && "$on" != *cpu* ]] || fail "training with $workers worker(s) did not run on cuda:0: $line"
  done < <(grep -E '^epoch [0-9]+/[0-9]+: .* on \[' "$train_log")
done

if ((bench > 0)); then
  echo "== bench/gpu_bench.py --epochs $bench ${profile[*]}"
  PYTHONUNBUFFERED=1 "$python" bench/gpu_bench.py --epochs "$bench" --bin "$bin" --launch "$launch" \
    --data_dir "$data" --python "$python" ${profile[@]+"${profile[@]}"} | tee "$out/results-gpu.md"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) || fail "bench/gpu_bench.py exited with status $rc"
fi

if ((python_steps > 0)) && [[ -d "$bin/python/summa" ]]; then
  echo "== bench/python_bench.py --device cuda --steps $python_steps"
  PYTHONUNBUFFERED=1 "$python" bench/python_bench.py --device cuda --processes 1,2 --no_lenet \
    --runs ps,ps-no-overlap,distributed,ddp --batch_size 64 --steps "$python_steps" --warmup 3 \
    --python "$python" --bin "$bin" --trace_dir "$out/python-traces" --run_timeout 120 --models resnet,gpt --out "$out/results-python-gpu.md"
  rc=$?
  ((rc == 0)) || fail "bench/python_bench.py --device cuda exited with status $rc"
fi

if ((status == 0)); then
  echo "== gpu-check: PASS"
else
  echo "== gpu-check: FAIL (${#failures[@]} problems):"
  printf '  - %s\n' "${failures[@]}"
fi
exit $status
