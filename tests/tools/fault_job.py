"""The harness of the fault tests with real processes (fault_process_test.py and
shard_fault_process_test.py): Job, a summa-server (or its shards) and its summa-workers inside
one ProcessGroup on 127.0.0.1 (OS-chosen ports), each worker training the small job JOB (STEPS
steps); and JobCases, the steps both files' cases take (an undisturbed run to compare with,
waiting for the workers to finish, three workers with one's pushes arriving last).

Job finds the binaries through configure(), which each test file's __main__ calls with its
arguments: it takes --bin BUILD_DIR and returns the rest, for unittest."""
import argparse
import base64
import os
import re
import signal
import time

import grpc

from grpc_reflect import Reflector
from procs import ProcessGroup

ARGS = None  # configure() sets it: bin, server, worker
# A small job that still learns: 8000 examples in batches of 64 (125 steps an epoch), 3 epochs,
# with Adam: SGD at lr 0.5 sits on LeNet's first-epoch plateau, where one perturbed step decides
# whether the run ever leaves it.
JOB = ["--batch_size=64", "--epochs=3", "--train_limit=8000", "--test_limit=1000", "--seed=1"]
STEPS = 3 * 125


def accuracies(text):
    return [float(a) for a in re.findall(r"test acc ([0-9.]+)", text)]


class Job:
    """A server and its workers inside one ProcessGroup."""

    def __init__(self, group, world, server_flags=(), port=None, shards=1, label="",
                 optimizer=("--optimizer=adam", "--lr=0.001"), workers=None):
        # `label` starts the servers' names (logs, port files): another job in the same group
        # (the same job restarted on other shards) needs one of its own. `optimizer`: the
        # server's (none for DiLoCo, whose workers bring theirs); `workers`: --workers' value
        # (default `world`).
        self.g, self.world, self.label = group, world, label
        # The data path on the socket data plane (the workers find it): a restarted server serves
        # it on a new port, which the workers must find again.
        self.server_flags = ["--workers=%s" % (workers or world), *optimizer, "--lease=1s",
                             "--data_address=127.0.0.1:0", *server_flags]
        if shards == 1:
            self.start_server(port)
            self.ports = [self.port]
        else:
            # Shard i of `shards`, each on its own port; shard 0 answers status(), and the others
            # follow it (--coordinator).
            self.ports, self.shards = [], []
            for i in range(shards):
                proc, p = group.start_server(ARGS.server, *self.server_flags, *self.shard_flags(i, shards),
                                             name=f"{label}shard{i}")
                self.shards.append(proc)
                self.ports.append(p)
            self.server, self.port = self.shards[0], self.ports[0]
        self.workers = {}

    def start_server(self, port=None):
        if port is None:
            self.server, self.port = self.g.start_server(ARGS.server, *self.server_flags, name=f"{self.label}server")
        else:
            self.server = self.restart_on(port, self.server_flags)
            self.port = port
        return self.server

    def restart_on(self, port, flags):
        port_file = os.path.join(self.g.dir, f"server-{time.monotonic_ns()}.port")
        proc = self.g.start(f"server-{port}-{time.monotonic_ns()}", [
            ARGS.server, f"--address=127.0.0.1:{port}", f"--port_file={port_file}", *flags])
        self.g.wait_for_file(port_file, proc)
        return proc

    def shard_flags(self, i, shards):
        flags = [f"--shards={shards}", f"--shard={i}"]
        return flags + ([f"--coordinator=127.0.0.1:{self.ports[0]}"] if i > 0 else [])

    def restart_shard(self, i):
        """Starts shard i again on its port (after it was killed)."""
        self.shards[i] = self.restart_on(self.ports[i], [*self.server_flags, *self.shard_flags(i, len(self.ports))])
        if i == 0:
            self.server = self.shards[0]
        return self.shards[i]

    def servers(self):
        """The server's processes: its shards, or the one server."""
        return list(self.shards) if len(self.ports) > 1 else [self.server]

    def shard_status(self, i):
        return Reflector(f"127.0.0.1:{self.ports[i]}", timeout=5).call("summa.v1.ParameterServer/GetStatus")

    def start_worker(self, rank, *extra):
        name = f"worker{rank}-{time.monotonic_ns()}"
        self.workers[rank] = self.g.start(name, [
            ARGS.worker, "--server=" + ",".join(f"127.0.0.1:{p}" for p in self.ports), f"--rank={rank}",
            f"--world_size={self.world}", "--status_address=127.0.0.1:0", "--progress=never",
            "--retry_deadline=60s", *JOB, *extra])
        return self.workers[rank]

    def start_and_freeze(self, at_version):
        """Starts every worker, and freezes them all (SIGSTOP) once `at_version` is reached;
        thaw() lets them go on."""
        for r in range(self.world):
            self.start_worker(r)
        self.wait_version(at_version)
        for w in self.workers.values():
            w.send_signal(signal.SIGSTOP)

    def thaw(self):
        for w in self.workers.values():
            w.send_signal(signal.SIGCONT)

    def status(self, seconds=15):
        """The server's status. A connection to the server's port that an earlier server left
        behind fails the first call with UNAVAILABLE ("Broken pipe") while gRPC reconnects:
        retried, for at most `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                return Reflector(f"127.0.0.1:{self.port}", timeout=5).call("summa.v1.ParameterServer/GetStatus")
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def wait_version(self, at_least, seconds=120):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if int(self.status().get("version", 0)) >= at_least:
                    return
            except Exception:  # noqa: BLE001 - the server may be restarting
                pass
            time.sleep(0.1)
        raise AssertionError(f"version {at_least} not reached in {seconds} s")

    def restart_server_after_checkpoint(self, version, seconds=120):
        """SIGKILLs the server once a checkpoint at `version` or later is on disk (an event, not a
        guess at timing) and starts a new one on its port; the new server's log."""
        deadline = time.monotonic() + seconds
        while int(self.status().get("lastCheckpointVersion", 0)) < version:
            if time.monotonic() > deadline:
                raise AssertionError(f"no checkpoint past version {version} in {seconds} s")
            time.sleep(0.05)
        self.server.send_signal(signal.SIGKILL)
        self.server.wait()
        time.sleep(1)
        self.start_server(self.port)
        return self.g.log(self.server)

    def weights(self):
        """The whole flat weights, every partition, from the shard that holds it."""
        shards = [Reflector(f"127.0.0.1:{p}", timeout=5) for p in self.ports]
        parts = sum(int(r.call("summa.v1.ParameterServer/GetStatus").get("partitionCount", 1)) for r in shards)
        out = b""
        for p in range(parts):
            for r in shards:
                try:
                    reply = r.call("summa.v1.ParameterServer/Pull", '{"rank": -1, "partition": %d}' % p)
                except grpc.RpcError as e:
                    if "held by shard" in (e.details() or ""):
                        continue
                    raise
                out += base64.b64decode(reply["data"])
                break
            else:
                raise AssertionError(f"no shard holds partition {p}")
        return out


def configure(argv):
    """Takes --bin BUILD_DIR (the build tree holding server/summa-server and worker/summa-worker)
    out of argv, a test file's arguments without the program's name, for Job; returns the rest."""
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ARGS, rest = ap.parse_known_args(argv)
    ARGS.server = os.path.join(ARGS.bin, "server/summa-server")
    ARGS.worker = os.path.join(ARGS.bin, "worker/summa-worker")
    return rest


class JobCases:
    """Steps of the fault tests' cases, mixed into their unittest.TestCase classes."""

    def finish(self, g, job, seconds=240):
        outs = {}
        for rank, proc in job.workers.items():
            self.assertEqual(g.wait(proc, seconds), 0, g.log(proc))
            outs[rank] = g.log(proc)
        return outs

    def undisturbed(self, server_flags=(), shards=1):
        with ProcessGroup() as g:
            job = Job(g, 2, server_flags, shards=shards)
            for r in range(2):
                job.start_worker(r)
            outs = self.finish(g, job)
            return accuracies(outs[0]), job.weights()

    def thirty_steps_one_late(self, g, job, late_rank):
        """Three workers, one epoch of 1920 examples (30 steps), `late_rank`'s pushes held back
        20 ms each so that they arrive last; their logs."""
        for r in range(3):
            extra = ["--epochs=1", "--train_limit=1920"]
            if r == late_rank:
                extra.append("--fault_delay_push=20ms")
            job.start_worker(r, *extra)
        return self.finish(g, job)
