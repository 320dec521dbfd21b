"""The security issue's flood probes with real processes.

Beside two workers training LeNet, a client floods summa-server with bad and abandoned calls
(AllReduce rounds it never completes, some cancelled at once, under fresh names; oversized
messages; pulls for a rank whose session it does not hold; Joins past the rate). Every flood call
is refused or parked within the server's limits, each refusal naming its flag (gRPC's transport
refuses oversized messages itself, naming the size); the workers finish their job; and the
server's peak RSS stays under a bound far below what the flood would otherwise make it hold.

And a flood of connections to the socket data plane that never say their hello, from the
workers' own address, does not keep the workers (--data_plane=socket, with a token) off the
plane: the server evicts the flood's idle connections to make room, never the workers'.

  flood_process_test.py --bin BUILD_DIR [unittest args]
"""
import argparse
import collections
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from grpc_reflect import Reflector  # noqa: E402
from procs import ProcessGroup  # noqa: E402

ARGS = None

# A short job: 4000 examples in batches of 64 (63 steps an epoch), 2 epochs.
JOB = ["--batch_size=64", "--epochs=2", "--train_limit=4000", "--test_limit=500", "--seed=1"]

MIB = 1 << 20
# The limits the flood meets (tighter than the defaults, so that the bound is measurable here).
LIMITS = ["--max_message_bytes=8MiB", "--max_allreduce_bytes=64MiB", "--max_collectives=256",
          "--max_open_collectives_per_peer=32", "--max_parked_calls_per_peer=64",
          "--max_bytes_in_flight_per_peer=48MiB", "--join_rate=1"]  # joins: a burst of 4, then 1/s
# The flood: this many AllReduce calls of 1 MiB each under fresh names, at most 32 outstanding.
# Held, they would be FLOOD_CALLS MiB of sums on the server.
FLOOD_CALLS = 1200
OUTSTANDING = 32
# What the server may reach: LeNet's job (~60 MiB), the AllReduce buffers' limit, and gRPC's
# receive buffers for the outstanding calls, with room to spare; far below FLOOD_CALLS MiB.
RSS_BOUND_MIB = 400
# Connections the silent flood holds open at once: far past the plane's bounds on connections in
# their hello (64, and 16 from one address).
SILENT_WIDTH = 300


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) / 1024


class Flooder:
    """Floods in a thread of its own; counts the status codes (and one message per code)."""

    def __init__(self, port):
        self.r = Reflector(f"127.0.0.1:{port}", timeout=10)
        self.codes = collections.Counter()
        self.messages = {}  # the first message of each code
        self.oversized = set()  # what the oversized pushes got
        self.flags = collections.Counter()  # the flags RESOURCE_EXHAUSTED refusals name
        self.error = None

    def note(self, code, details=""):
        self.codes[code.name] += 1
        self.messages.setdefault(code.name, details)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            for flag in re.findall(r"--\w+", details or ""):
                self.flags[flag] += 1

    def outcome(self, future):
        try:
            future.result()
            self.note(grpc.StatusCode.OK)
        except grpc.FutureCancelledError:
            self.note(grpc.StatusCode.CANCELLED, "cancelled by the flooder")
        except grpc.RpcError as e:
            self.note(e.code(), e.details())

    def flood(self):
        try:
            allreduce, AllReduceRequest = self.r.rpc("summa.v1.ParameterServer/AllReduce")
            push, PushRequest = self.r.rpc("summa.v1.ParameterServer/Push")
            join, JoinRequest = self.r.rpc("summa.v1.ParameterServer/Join")
            pull, PullRequest = self.r.rpc("summa.v1.ParameterServer/Pull")
            data = bytes(MIB)
            pending = []
            for i in range(FLOOD_CALLS):
                req = AllReduceRequest(name=f"flood-{i}", group_size=2, rank=0)
                req.tensor.dtype = 1  # DTYPE_FLOAT32
                req.tensor.shape.append(MIB // 4)
                req.tensor.data = data
                f = allreduce.future(req, timeout=120)
                if i % 2:
                    f.cancel()  # abandoned at once: the server still holds the round it opened
                pending.append(f)
                if len(pending) >= OUTSTANDING:
                    f0 = pending.pop(0)
                    if not f0.done():
                        f0.cancel()  # abandoned later
                    self.outcome(f0)
                if i % 50 == 0:
                    # An oversized push, a spoofed push for rank 0 (no session), a Join for a
                    # rank outside the job: each refused.
                    try:
                        push(PushRequest(rank=0, dtype=1, data=bytes(9 * MIB)), timeout=10)
                        self.note(grpc.StatusCode.OK)
                    except grpc.RpcError as e:
                        self.note(e.code(), e.details())
                        self.oversized.add((e.code().name, e.details()))
                    try:  # rank 0's weights, without its session
                        pull(PullRequest(rank=0, partition=0), timeout=10)
                        self.note(grpc.StatusCode.OK)
                    except grpc.RpcError as e:
                        self.note(e.code(), e.details())
                if i % 200 == 0:
                    for _ in range(30):  # back to back: past the burst of 4
                        try:
                            join(JoinRequest(rank=7, world_size=2), timeout=10)
                            self.note(grpc.StatusCode.OK)
                        except grpc.RpcError as e:
                            self.note(e.code(), e.details())
            for f in pending:
                if not f.done():
                    f.cancel()
                self.outcome(f)
        except Exception as e:  # noqa: BLE001 - reported by the test's thread
            self.error = e


class SilentFlooder:
    """Keeps `width` TCP connections open to a port from 127.0.0.1, none of which ever sends a
    byte, until stopped: each one the server closes is replaced at once. Counts the connections
    it opened and those the server closed. Runs in a thread of its own (run)."""

    def __init__(self, port, width):
        self.port = port
        self.width = width
        self.opened = 0
        self.closed = 0
        self.error = None
        self.stop = threading.Event()
        self.flooding = threading.Event()  # set once the server has closed `width` of them

    def run(self):
        poller = select.poll()
        held = {}
        try:
            while not self.stop.is_set():
                while len(held) < self.width:
                    s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                    held[s.fileno()] = s
                    poller.register(s, select.POLLIN)
                    self.opened += 1
                for fd, _ in poller.poll(50):  # readable: the server's end (EOF or a reset)
                    poller.unregister(fd)
                    held.pop(fd).close()
                    self.closed += 1
                if self.closed >= self.width:
                    self.flooding.set()
        except Exception as e:  # noqa: BLE001 - reported by the test's thread
            self.error = e
        finally:
            for s in held.values():
                s.close()
            self.flooding.set()  # the test waits on it: it ends here, whatever happened


def scrape(port, name):
    """The value of the Prometheus series `name` at 127.0.0.1:port (None when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        m = re.search(rf"^{name} ([0-9.e+-]+)$", r.read().decode(), re.M)
    return float(m.group(1)) if m else None


class FloodProcessTest(unittest.TestCase):
    def test_a_flood_beside_two_training_workers_is_refused_bounded_and_the_job_finishes(self):
        with ProcessGroup() as g:
            server, port = g.start_server(ARGS.server, "--workers=2", "--optimizer=adam", "--lr=0.001",
                                          *LIMITS)
            workers = [g.start(f"worker{r}", [
                ARGS.worker, f"--server=127.0.0.1:{port}", f"--rank={r}", "--world_size=2",
                "--progress=never", *JOB]) for r in range(2)]
            # Flood once both have joined (the Join flood would otherwise slow their own Joins).
            deadline = time.monotonic() + 60
            while True:
                status = Reflector(f"127.0.0.1:{port}").call("summa.v1.ParameterServer/GetStatus")
                if sum(1 for m in status.get("members", []) if m["state"] == "alive") == 2:
                    break
                self.assertLess(time.monotonic(), deadline, f"workers did not join:\n{g.log(server)}")
                time.sleep(0.05)
            flooder = Flooder(port)
            thread = threading.Thread(target=flooder.flood)
            thread.start()
            thread.join(timeout=300)
            self.assertFalse(thread.is_alive(), "the flood did not end in 300 s")
            self.assertIsNone(flooder.error, repr(flooder.error))
            held = Reflector(f"127.0.0.1:{port}").call("summa.v1.ParameterServer/GetStatus")

            for r, proc in enumerate(workers):
                self.assertEqual(g.wait(proc, 300), 0, g.log(proc))
                self.assertIn("epoch 2", g.log(proc), g.log(proc))
            rss = peak_rss_mib(server.pid)
            print(f"flood: {dict(flooder.codes)}, limits hit: {dict(flooder.flags)}; server peak RSS {rss:.0f} MiB "
                  f"(bound {RSS_BOUND_MIB}); held after the flood: {held.get('parkedCalls')} parked "
                  f"calls, {held.get('allreduceCollectives')} collectives, "
                  f"{held.get('allreduceBufferBytes')} AllReduce bytes")
            for code, message in sorted(flooder.messages.items()):
                print(f"  {code}: {message}")

            self.assertNotIn("OK", flooder.codes, "a flood call was served")
            # Every limit the flood reaches names its flag, but for the message size: gRPC's
            # transport refuses those before Summa sees them, naming the size (8 MiB) instead.
            for flag in ("--max_open_collectives_per_peer", "--join_rate"):
                self.assertIn(flag, flooder.flags, flooder.messages)
            self.assertEqual({code for code, _ in flooder.oversized}, {"RESOURCE_EXHAUSTED"})
            self.assertTrue(all(f"vs. {8 * MIB})" in m for _, m in flooder.oversized), flooder.oversized)
            self.assertIn("FAILED_PRECONDITION", flooder.codes)  # the pulls without rank 0's session
            self.assertLessEqual(int(held.get("allreduceBufferBytes", 0)), 64 * MIB)
            self.assertLessEqual(int(held.get("allreduceCollectives", 0)), 256)
            self.assertLess(rss, RSS_BOUND_MIB, f"the server's peak RSS: {rss:.0f} MiB")

    def test_silent_connections_to_the_data_plane_do_not_keep_workers_off_it(self):
        self.silent_flood(tls=False)

    def test_silent_connections_to_the_tls_data_plane_do_not_keep_tls_workers_off_it(self):
        """The same flood against a plane in mutual TLS, whose workers' hellos take a handshake
        first (the handshake's bytes make their connections no longer silent, so the flood's
        silent ones go first)."""
        self.silent_flood(tls=True)

    def silent_flood(self, tls):
        with ProcessGroup() as g:
            token = os.path.join(g.dir, "token")
            with open(token, "w") as f:
                f.write("flood-test-token\n")
            server_tls, worker_tls = [], []
            if tls:
                certs = os.path.join(g.dir, "certs")
                subprocess.run(["bash", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                                                     "make-certs.sh"), certs], check=True, capture_output=True)
                server_tls = [f"--tls_cert={certs}/server.pem", f"--tls_key={certs}/server.key", f"--tls_ca={certs}/ca.pem"]
                worker_tls = [f"--tls_cert={certs}/client.pem", f"--tls_key={certs}/client.key", f"--tls_ca={certs}/ca.pem"]
            data_port_file = os.path.join(g.dir, "data.port")
            metrics_port_file = os.path.join(g.dir, "metrics.port")
            # The default bounds: 64 connections in their hello, 16 from one address.
            server, port = g.start_server(ARGS.server, "--workers=2", "--optimizer=adam", "--lr=0.001",
                                          f"--token_file={token}", "--data_address=127.0.0.1:0",
                                          f"--data_port_file={data_port_file}", "--metrics_address=127.0.0.1:0",
                                          f"--metrics_port_file={metrics_port_file}", *server_tls)
            data_port = int(g.wait_for_file(data_port_file, server))
            metrics_port = int(g.wait_for_file(metrics_port_file, server))
            flooder = SilentFlooder(data_port, width=SILENT_WIDTH)
            thread = threading.Thread(target=flooder.run)
            thread.start()
            try:
                # The workers start into a flood in full force: the server has closed a full
                # width of its connections (evicted, or at the hello timeout) already.
                self.assertTrue(flooder.flooding.wait(120), "the flood did not get going")
                self.assertIsNone(flooder.error, repr(flooder.error))
                workers = [g.start(f"worker{r}", [
                    ARGS.worker, f"--server=127.0.0.1:{port}", f"--rank={r}", "--world_size=2",
                    f"--token_file={token}", "--data_plane=socket", "--progress=never", *worker_tls, *JOB])
                    for r in range(2)]
                for proc in workers:
                    self.assertEqual(g.wait(proc, 300), 0, g.log(proc))
                    self.assertIn("epoch 2", g.log(proc), g.log(proc))
                    self.assertIn("the data path goes over the socket data plane", g.log(proc), g.log(proc))
                self.assertIsNone(flooder.error, repr(flooder.error))
            finally:
                flooder.stop.set()
                thread.join(timeout=60)
            self.assertFalse(thread.is_alive(), "the flooder did not stop")
            # The server refreshes its series every tick (100 ms): poll until the workers' hellos
            # show, with a deadline.
            deadline = time.monotonic() + 30
            while (scrape(metrics_port, "summa_server_data_plane_hellos_total") or 0) < 2:
                self.assertLess(time.monotonic(), deadline, "the workers' hellos never showed")
                time.sleep(0.05)
            hellos = scrape(metrics_port, "summa_server_data_plane_hellos_total")
            evictions = scrape(metrics_port, "summa_server_data_plane_hello_evictions_total")
            failed = scrape(metrics_port, "summa_server_data_plane_failed_hellos_total")
            print(f"silent flood: {flooder.opened} connections opened, {flooder.closed} closed by the server; "
                  f"server: {hellos:.0f} hellos passed, {evictions:.0f} evictions, {failed:.0f} failed hellos")
            self.assertGreater(evictions, 0)
            self.assertGreater(flooder.opened, 2 * SILENT_WIDTH)  # it kept reconnecting
            self.assertIn("still in its hello", g.log(server))  # the eviction's line
            self.assertEqual("data plane: TLSv1.3" in g.log(server), tls)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.server = os.path.join(ARGS.bin, "server", "summa-server")
    ARGS.worker = os.path.join(ARGS.bin, "worker", "summa-worker")
    unittest.main(argv=[sys.argv[0], *rest])
