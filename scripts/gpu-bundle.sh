#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a machine with a GPU but no Debian packages into the
# ignored folder .bundle/ (kept under 64 MiB): summa.tar.xz with the binaries, the CUDA tests,
# launch.sh and every shared library they need that is not the C library or CUDA's own
# (resolved with ldd: gRPC, Protobuf, Abseil, OpenBLAS, ...), and data/ with Fashion-MNIST.
# The machine with the GPU brings its driver and cuBLAS (gpu-check.sh finds libcublas.so.13).
#   scripts/gpu-bundle.sh        (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
bundle=.bundle
out=$bundle/stage
rm -rf "$bundle"
mkdir -p "$out/bin/server" "$out/bin/worker" "$out/bin/tests" "$out/lib" "$out/scripts" "$bundle/data"
cp "$build/server/summa-server" "$build/server/summa-checkpoint" "$out/bin/server/"
cp "$build/worker/summa-worker" "$out/bin/worker/"
mkdir -p "$out/bin/worker/cuda"
# The CUDA backend plugin, found beside the executables that load it.
cp "$build/worker/compute/cuda/libsumma_cuda.so" "$out/bin/worker/cuda/"
cp "$build/worker/compute/cuda/libsumma_cuda.so" "$out/bin/tests/"
cp "$build/tests/cuda_backend_test" "$build/tests/backend_checks_test" "$build/tests/lenet_test" \
  "$build/tests/cpu_backend_test" "$out/bin/tests/"
cp scripts/launch.sh "$out/scripts/"
cp /usr/share/datasets/fashion-mnist/*.gz "$bundle/data/"

# Libraries the system of any Linux machine has, and CUDA's, which the machine with the GPU brings.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libnvidia)'
for bin in "$out"/bin/*/* "$out"/bin/worker/cuda/*; do
  [[ -f "$bin" ]] || continue
  ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [[ -e "$out/lib/$name" ]] || cp -L "$path" "$out/lib/$name"
  done
done
strip --strip-unneeded "$out"/lib/*.so* "$out"/bin/*/* 2>/dev/null || true
libs=$(ls "$out/lib" | wc -l)
XZ_OPT="-T0" tar -C "$out" -cJf "$bundle/summa.tar.xz" bin lib scripts
rm -rf "$out"
size=$(du -sm "$bundle" | cut -f1)
echo "gpu-bundle: $bundle is ${size} MiB (summa.tar.xz with $libs libraries, and data/)"
if ((size >= 64)); then
  echo "gpu-bundle: over its 64 MiB limit" >&2
  exit 1
fi
