"""pip install ./python: the summa package, its summa.v1 stubs generated from
../proto/summa/v1/summa.proto while building (protoc and grpc_python_plugin, Debian's
protobuf-compiler and protobuf-compiler-grpc, the versions python3-grpcio and python3-protobuf
match), so that the stubs can never drift from the .proto the server was built from, and its
extension summa._native (python/native/module.cc on the C++ client, client/) built by CMake.

The extension: setup.py configures the repository's top-level project (..) with
-DSUMMA_PYTHON_ONLY=ON (the extension and the libraries it links: no CUDA, BLAS, GoogleTest,
binaries or tests) for the Python that runs it (PYTHON_EXECUTABLE=sys.executable), in the
build_temp (python/build/temp.*/cmake, kept: a second install rebuilds only what changed), builds
the one target summa_native and copies _native*.so into the package. SUMMA_CMAKE_BUILD_DIR=DIR
builds that target in a tree already configured from this repository for the same Python version
instead (the test suite points it at build/, so pip only checks that the extension is up to date).
Without cmake, pybind11-dev or python3-dev the install still succeeds, without the extension, and
says so (pip shows it with -v): summa.Client then uses its grpcio client. SUMMA_REQUIRE_NATIVE=1
makes that an error.

Why setup.py and no pyproject.toml: with a [build-system] table pip builds in an isolated
environment that it fills from PyPI, and the project's machines have no route there; without one,
pip 23 builds with the setuptools it runs beside (a virtualenv made with
--system-site-packages sees Debian's). pip builds in place (since 21.3), so ../proto is found.
Dependencies are Debian's python3-grpcio, python3-protobuf and python3-numpy (torch for the
optimizers); they are not declared, so that pip never tries to fetch a second copy.
"""
import collections
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PROTO_ROOT = os.path.join(REPO, "proto")
PROTO = "summa/v1/summa.proto"
NATIVE_PACKAGES = "cmake, pybind11-dev and python3-dev (scripts/setup.sh installs them)"


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        protoc = shutil.which("protoc")
        plugin = shutil.which("grpc_python_plugin")
        if not (protoc and plugin):
            raise SystemExit("summa: protoc and grpc_python_plugin are needed to generate the stubs "
                             "(apt-get install protobuf-compiler protobuf-compiler-grpc)")
        if not os.path.exists(os.path.join(PROTO_ROOT, PROTO)):
            raise SystemExit(f"summa: {PROTO} not found under {PROTO_ROOT}; install from the "
                             "repository (pip install ./python)")
        subprocess.check_call([protoc, f"--proto_path={PROTO_ROOT}", f"--python_out={self.build_lib}",
                               f"--grpc_python_out={self.build_lib}",
                               f"--plugin=protoc-gen-grpc_python={plugin}",
                               os.path.join(PROTO_ROOT, PROTO)])


class NativeBuildError(Exception):
    pass


class CMakeExtension(Extension):
    """An extension that CMake builds: `target` of the project at `source`, whose output lands in
    `output_dir` (relative to the build tree)."""

    def __init__(self, name, source, target, output_dir):
        super().__init__(name, sources=[])
        self.source, self.target, self.output_dir = source, target, output_dir


def run_tool(cmd):
    """Runs cmd, its output passed on; raises NativeBuildError with the output's tail on failure."""
    print(" ".join(cmd), flush=True)
    tail = collections.deque(maxlen=15)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            tail.append(line)
    if proc.returncode != 0:
        raise NativeBuildError(f"{' '.join(cmd[:2])} ... failed (exit {proc.returncode}):\n"
                               + "".join(tail).rstrip())


class BuildNative(build_ext):
    def build_extension(self, ext):
        dest = self.get_ext_fullpath(ext.name)
        try:
            built = self.cmake_build(ext)
        except NativeBuildError as e:
            # pip builds in place: an extension that an earlier install left in build/lib would
            # go into this one, built from other sources.
            if os.path.exists(dest):
                os.remove(dest)
            if os.environ.get("SUMMA_REQUIRE_NATIVE") == "1":
                raise SystemExit(f"summa: the C++ client ({ext.name}) was not built, and "
                                 f"SUMMA_REQUIRE_NATIVE=1 asks for it: {e}") from None
            sys.stderr.write(
                f"summa: WARNING: the C++ client ({ext.name}) was not built: {e}\n"
                "summa: WARNING: installing without it: summa.Client falls back to its grpcio "
                "client (no socket data plane, no shards, no overlapped step). Install "
                f"{NATIVE_PACKAGES} and install again; SUMMA_REQUIRE_NATIVE=1 makes this an error.\n")
            return
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)

    def cmake_build(self, ext):
        """Builds ext's target and returns the path of the extension it made."""
        cmake = shutil.which("cmake")
        if not cmake:
            raise NativeBuildError("cmake not found")
        build_dir = os.environ.get("SUMMA_CMAKE_BUILD_DIR")
        if build_dir:
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                raise NativeBuildError(f"SUMMA_CMAKE_BUILD_DIR={build_dir} is not a configured "
                                       "CMake build tree")
        else:
            if not os.path.exists(os.path.join(ext.source, "CMakeLists.txt")):
                raise NativeBuildError(f"no CMakeLists.txt in {ext.source}; install from the "
                                       "repository (pip install ./python)")
            build_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
            configure = [cmake, "-S", ext.source, "-B", build_dir, "-DSUMMA_PYTHON_ONLY=ON",
                         "-DCMAKE_BUILD_TYPE=Release", f"-DPYTHON_EXECUTABLE={sys.executable}"]
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")) and shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            run_tool(configure)
        build = [cmake, "--build", build_dir, "--target", ext.target]
        if "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ:
            build += ["--parallel", str(os.cpu_count() or 1)]
        run_tool(build)
        name = ext.name.split(".")[-1] + sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(build_dir, ext.output_dir, name)
        if not os.path.exists(built):
            found = glob.glob(os.path.join(build_dir, ext.output_dir, ext.name.split(".")[-1] + ".*"))
            raise NativeBuildError(f"the build made no {built} for {sys.executable} (found: "
                                   f"{found or 'nothing'}; a tree configured for another Python?)")
        return built


setup(
    name="summa",
    version="0.1.0",
    description="Python client for summa-server: parameter server and allreduce for PyTorch",
    packages=["summa", "summa.v1"],
    ext_modules=[CMakeExtension("summa._native", source=REPO, target="summa_native",
                                output_dir="python/summa")],
    python_requires=">=3.9",
    zip_safe=False,
    cmdclass={"build_py": BuildWithStubs, "build_ext": BuildNative},
)
