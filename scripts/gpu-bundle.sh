#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a machine with a GPU but no Debian packages into the
# ignored folder .bundle/ (kept under 64 MiB): summa.tar.xz with the binaries, the CUDA tests,
# launch.sh and every shared library they need that is not the C library or CUDA's own
# (resolved with ldd: gRPC, Protobuf, Abseil, OpenBLAS, ...), and data/ with Fashion-MNIST.
# The machine with the GPU brings its driver and cuBLAS (gpu-check.sh finds libcublas.so.13).
# bin/python holds the built Python package (build/python: sources, stubs, and summa._native for
# the Python it was built for); each --python PY adds a summa._native built for that interpreter
# too (in build-python<X.Y>/, -DSUMMA_PYTHON_ONLY=ON), for a GPU machine whose Python with torch
# is another version than Debian's (gpu-check.sh --python runs the package there).
#   scripts/gpu-bundle.sh [--python PY ...]       (after scripts/build.sh)
#   e.g. scripts/gpu-bundle.sh --python ~/.pyenv/versions/3.12.1/bin/python3
set -euo pipefail
cd "$(dirname "$0")/.."
pythons=()
while (($#)); do
  case "$1" in
    --python)
      py=$( (cd "$OLDPWD" && command -v "${2:-}") 2>/dev/null) || py=""
      [[ -n "$py" && -x "$py" ]] || { echo "gpu-bundle: --python needs an interpreter ('${2:-}' is not one)" >&2; exit 2; }
      pythons+=("$(cd "$OLDPWD" && realpath "$py")"); shift 2 ;;
    *) echo "gpu-bundle: unknown argument '$1' (--python PY)" >&2; exit 2 ;;
  esac
done
build=${BUILD_DIR:-build}
bundle=.bundle
out=$bundle/stage
rm -rf "$bundle"
mkdir -p "$out/bin/server" "$out/bin/worker" "$out/bin/tests" "$out/bin/bench" "$out/lib" "$out/scripts" "$bundle/data"
cp "$build/server/summa-server" "$build/server/summa-checkpoint" "$out/bin/server/"
cp "$build/worker/summa-worker" "$out/bin/worker/"
# The C++ side of bench/python_bench.py's exchange rows.
cp "$build/bench/summa-bench-allreduce" "$build/bench/summa-bench-scale" "$out/bin/bench/"
mkdir -p "$out/bin/worker/cuda"
# The CUDA backend plugin, found beside the executables that load it.
cp "$build/worker/compute/cuda/libsumma_cuda.so" "$out/bin/worker/cuda/"
cp "$build/worker/compute/cuda/libsumma_cuda.so" "$out/bin/tests/"
cp "$build/tests/cuda_backend_test" "$build/tests/backend_checks_test" "$build/tests/lenet_test" \
  "$build/tests/cpu_backend_test" "$out/bin/tests/"
cp scripts/launch.sh "$out/scripts/"
if [[ -f "$build/python/summa/v1/summa_pb2.py" ]]; then
  mkdir -p "$out/bin/python"
  cp -r "$build/python/summa" "$out/bin/python/"
  find "$out/bin/python" -name __pycache__ -prune -exec rm -rf {} +
fi
for py in ${pythons[@]+"${pythons[@]}"}; do
  [[ -d "$out/bin/python" ]] || { echo "gpu-bundle: --python needs the package built ($build/python)" >&2; exit 1; }
  version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  pybuild=build-python$version
  cmake -S . -B "$pybuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSUMMA_PYTHON_ONLY=ON \
    -DPYTHON_EXECUTABLE="$py" >/dev/null
  cmake --build "$pybuild" -j "$(nproc)" --target summa_native
  cp "$pybuild"/python/summa/_native*.so "$out/bin/python/summa/"
done
cp /usr/share/datasets/fashion-mnist/*.gz "$bundle/data/"

# Libraries the system of any Linux machine has, and CUDA's, which the machine with the GPU brings.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libnvidia)'
for bin in "$out"/bin/*/* "$out"/bin/worker/cuda/* "$out"/bin/python/summa/_native*.so; do
  [[ -f "$bin" ]] || continue
  ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [[ -e "$out/lib/$name" ]] || cp -L "$path" "$out/lib/$name"
  done
done
strip --strip-unneeded "$out"/lib/*.so* "$out"/bin/*/* "$out"/bin/python/summa/_native*.so 2>/dev/null || true
libs=$(ls "$out/lib" | wc -l)
XZ_OPT="-T0" tar -C "$out" -cJf "$bundle/summa.tar.xz" bin lib scripts
rm -rf "$out"
size=$(du -sm "$bundle" | cut -f1)
echo "gpu-bundle: $bundle is ${size} MiB (summa.tar.xz with $libs libraries, and data/)"
if ((size >= 64)); then
  echo "gpu-bundle: over its 64 MiB limit" >&2
  exit 1
fi
