"""Discovers summa-server through server reflection, as grpcurl does, and calls GetStatus and
the health service. Starts the real binary on 127.0.0.1 with an OS-chosen port and stops it by
PID on every path."""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from grpc_reflect import Reflector  # noqa: E402


def wait_for_port(path, proc, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening")
        if os.path.exists(path):
            return int(open(path).read())
        time.sleep(0.05)
    raise RuntimeError("server did not write its port file in time")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="summa-refl-")
    port_file = os.path.join(tmp, "port")
    proc = subprocess.Popen([args.server, "--address=127.0.0.1:0", f"--port_file={port_file}",
                             "--workers=3", "--lr=0.2"])
    try:
        port = wait_for_port(port_file, proc)
        r = Reflector(f"127.0.0.1:{port}")
        services = r.list_services()
        print("services:", services)
        for want in ["summa.v1.ParameterServer", "grpc.health.v1.Health",
                     "grpc.reflection.v1alpha.ServerReflection"]:
            assert want in services, f"{want} not listed by reflection: {services}"
        methods = [m.name for m in r.service("summa.v1.ParameterServer").methods]
        for want in ["Join", "Push", "Pull", "PushPull", "AllReduce", "GetStatus"]:
            assert want in methods, f"method {want} missing: {methods}"
        status = r.call("summa.v1.ParameterServer/GetStatus")
        print("status:", status)
        assert status["worldSize"] == 3, status
        assert status["mode"] == "MODE_SYNC", status
        assert status["uptimeSeconds"] > 0, status
        assert "lr=0.2" in status["optimizer"], status
        health = r.call("grpc.health.v1.Health/Check", '{"service": "summa.v1.ParameterServer"}')
        print("health:", health)
        assert health["status"] == "SERVING", health
        print("reflection_test: PASS")
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
