#!/usr/bin/env bash
# The image's build stage, after scripts/build.sh --binaries: puts what the runtime stage takes
# under STAGE, and nothing else:
#   STAGE/opt/summa/bin/   summa-server, summa-checkpoint, summa-worker (stripped; a summa-worker built with fault
#                          injection, the test suite's, is refused) and, when CUDA was built, the
#                          worker's plugin in cuda/libsumma_cuda.so (where the worker looks for it)
#   STAGE/packages         the distribution's packages that own every shared library they load,
#                          one a line, found with ldd and dpkg: the runtime stage installs these
#                          rather than copying library files, so the runtime libraries stay the
#                          distribution's (the same names on Debian and on NVIDIA's Ubuntu bases);
#                          CUDA's own libraries are left out: NVIDIA's runtime base brings cuBLAS
#                          and the CUDA runtime, the NVIDIA container toolkit the driver's libcuda
#   deploy/docker/stage.sh STAGE [BUILD_DIR]
# BUILD_DIR (default build): where the binaries are, as scripts/build.sh lays them out.
set -euo pipefail
cd "$(dirname "$0")/../.."
stage=${1:?usage: deploy/docker/stage.sh STAGE [BUILD_DIR]}
from=${2:-build}
bin=$stage/opt/summa/bin
mkdir -p "$bin"
install -m 0755 -s "$from"/server/summa-server "$from"/server/summa-checkpoint "$from"/worker/summa-worker "$bin/"
# A production image: a summa-worker with the test-only --fault_* flags (a build configured with
# -DSUMMA_FAULT_INJECTION=ON, as scripts/build.sh makes the test suite's) is refused.
help=$("$bin/summa-worker" --helpfull 2>&1 || true)
if grep -q -- '--fault_' <<<"$help"; then
  echo "stage: $from/worker/summa-worker is a test build with fault injection (its --fault_* flags):" \
    "not for an image; build it with scripts/build.sh --binaries (-DSUMMA_FAULT_INJECTION=OFF)" >&2
  exit 1
fi
if [[ -f "$from"/worker/compute/cuda/libsumma_cuda.so ]]; then
  install -D -m 0644 -s "$from"/worker/compute/cuda/libsumma_cuda.so "$bin/cuda/libsumma_cuda.so"
fi

# The package that owns a library: dpkg knows a file by the path it shipped it under, which on a
# merged /usr system may be the /lib or the /usr/lib spelling of where ldd found it.
owner() {
  local path=$1 real candidate
  real=$(realpath "$path")
  for candidate in "$path" "$real" "${real#/usr}" "/usr${real}"; do
    if dpkg-query -S "$candidate" 2>/dev/null | head -n1 | cut -d: -f1; then return; fi
  done
  echo "stage: no package owns $path ($real); the runtime stage could not install it" >&2
  return 1
}
for f in "$bin"/summa-server "$bin"/summa-checkpoint "$bin"/summa-worker "$bin"/cuda/*.so; do
  [[ -f "$f" ]] || continue
  if ldd "$f" | grep -q "not found"; then
    echo "stage: $f needs a library that is not here:" >&2
    ldd "$f" | grep "not found" >&2
    exit 1
  fi
  ldd "$f" | awk '/=> \// && $1 !~ /^lib(cuda|cudart|cublas|cublasLt|nvidia)/ {print $3}
                 /^\t\/.*ld-linux/ {print $1}'
done | sort -u | while read -r lib; do owner "$lib"; done | sort -u >"$stage/packages"
echo "stage: $(ls "$bin" | tr '\n' ' ')and $(wc -l <"$stage/packages") packages: $(tr '\n' ' ' <"$stage/packages")"
