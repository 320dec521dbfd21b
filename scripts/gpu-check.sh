#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU.
# Uses .bundle/ from scripts/gpu-bundle.sh when present (a machine with no Debian packages),
# else build/. Runs the CUDA-vs-CPU tests, compute-sanitizer on them where it works, and trains
# the seed's job on the GPU for 2 epochs with 1 worker and with 2 workers sharing the GPU,
# printing seconds per epoch and test accuracy. Everything it prints is also kept in $OUT (or
# gpu-check-out/) when that is set.
#   scripts/gpu-check.sh [--epochs N]
set -uo pipefail
cd "$(dirname "$0")/.."
epochs=2
[[ "${1:-}" == "--epochs" ]] && epochs=$2
out=${OUT:-gpu-check-out}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1

if [[ -f .bundle/summa.tar.xz ]]; then
  unpacked=$(mktemp -d "${TMPDIR:-/tmp}/summa-bundle.XXXXXX")
  tar -C "$unpacked" -xJf .bundle/summa.tar.xz
  bin=$unpacked/bin data=$PWD/.bundle/data launch=$unpacked/scripts/launch.sh
  export LD_LIBRARY_PATH="$unpacked/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
else
  bin=build data=/usr/share/datasets/fashion-mnist launch=scripts/launch.sh
fi
echo "== gpu-check: binaries from $bin, data from $data"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
ldd "$bin/worker/summa-worker" | grep -E "not found|cublas|cudart" || true

status=0
echo "== CUDA vs CPU tests"
"$bin/tests/cuda_backend_test" || status=1
"$bin/tests/lenet_test" || status=1

sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -n "$sanitizer" ]]; then
  echo "== compute-sanitizer (memcheck) on the CUDA tests"
  "$sanitizer" --tool memcheck --error-exitcode 3 "$bin/tests/cuda_backend_test" \
    --gtest_filter='-*LeNetSteps*' || echo "compute-sanitizer: exit $? (see above; 'Device not supported' means it cannot run here)"
else
  echo "== compute-sanitizer: not installed here"
fi

for workers in 1 2; do
  echo "== training: $workers worker(s) on the GPU, $epochs epochs, batch 256, lr 0.2"
  "$launch" --bin "$bin" --workers "$workers" --epochs "$epochs" --batch_size 256 --lr 0.2 -- \
    --device=auto --data_dir="$data" --progress=never || status=1
done
echo "== gpu-check: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
