"""pip install ./python: the summa package, its summa.v1 stubs generated from
../proto/summa/v1/summa.proto while building (protoc and grpc_python_plugin, Debian's
protobuf-compiler and protobuf-compiler-grpc, the versions python3-grpcio and python3-protobuf
match), so that the stubs can never drift from the .proto the server was built from.

Why setup.py and no pyproject.toml: with a [build-system] table pip builds in an isolated
environment that it fills from PyPI, and the project's machines have no route there; without one,
pip 23 builds with the setuptools it runs beside (a virtualenv made with
--system-site-packages sees Debian's). pip builds in place (since 21.3), so ../proto is found.
Dependencies are Debian's python3-grpcio, python3-protobuf and python3-numpy (torch for the
optimizers); they are not declared, so that pip never tries to fetch a second copy.
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "..", "proto")
PROTO = "summa/v1/summa.proto"


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


setup(
    name="summa",
    version="0.1.0",
    description="Python client for summa-server: parameter server and allreduce for PyTorch",
    packages=["summa", "summa.v1"],
    python_requires=">=3.9",
    cmdclass={"build_py": BuildWithStubs},
)
