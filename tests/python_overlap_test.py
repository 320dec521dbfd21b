"""The Python optimizers' overlap against real servers (127.0.0.1, OS-chosen ports), with a small
MLP (tests/tools/overlap_child.py) cut into several partitions: overlapped and not give the same
weights bit for bit; each partition goes once a step, during backward, last layers first; each
module's forward waits for its own partitions' new weights; 2 processes follow 1 process on the
whole batch with each optimizer (DistributedOptimizer's averaging, several parameter groups),
through gradient accumulation, frozen and unused parameters; and a host's processes summed
locally (gloo), one of them pushing, give what each pushing on its own gives. Where a GPU is
there, the same on cuda:0 (the gradients and weights through pinned host copies)."""
import argparse
import json
import os
import socket
import sys
import unittest
import urllib.request

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from procs import ProcessGroup, wait_until  # noqa: E402

ARGS = None
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools", "overlap_child.py")
# The MLP's 2,468 floats (1,496 without --frozen and --unused) in partitions of 256 floats.
SERVER = ["--lr=0.05", "--partition_bytes=1024"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PythonOverlapTest(unittest.TestCase):
    def run_job(self, g, world, *flags, server_flags=(), local=False, record=False):
        """`world` processes of the child against a new server; rank 0's weights (and records)."""
        server_world = 1 if local else world
        tag = len(g.procs)
        self.server, port = g.start_server(ARGS.server, f"--workers={server_world}", *SERVER, *server_flags,
                                           name=f"server{tag}")
        dumps = [os.path.join(g.dir, f"w{tag}-{r}.npy") for r in range(world)]
        records = [os.path.join(g.dir, f"r{tag}-{r}.json") for r in range(world)]
        gloo = [f"--local_group={free_port()}"] if local else []
        procs = [g.start(f"child{tag}-{r}", [sys.executable, CHILD, f"--server=127.0.0.1:{port}", f"--world={world}",
                                             f"--rank={r}", f"--dump={dumps[r]}", *gloo, *flags,
                                             *([f"--record={records[r]}"] if record else [])],
                         env={"PYTHONPATH": ARGS.python_path})
                 for r in range(world)]
        for p in procs:
            self.assertEqual(g.wait(p, 120), 0, g.log(p))
        weights = [np.load(d) for d in dumps]
        for w in weights[1:]:
            self.assertTrue(np.array_equal(weights[0], w), "every process ends on the same weights")
        self.port = port
        if record:
            return weights[0], [json.load(open(r)) for r in records]
        return weights[0]

    def reference(self, g, *flags):
        out = os.path.join(g.dir, f"ref{len(g.procs)}.npy")
        proc = g.start(f"reference{len(g.procs)}", [sys.executable, CHILD, "--reference", f"--dump={out}", *flags],
                       env={"PYTHONPATH": ARGS.python_path})
        self.assertEqual(g.wait(proc, 120), 0, g.log(proc))
        return np.load(out)

    def initial(self, g, *flags):
        return self.reference(g, "--steps=0", *flags)

    def assert_follows(self, got, reference, initial):
        self.assertEqual(got.shape, reference.shape)
        self.assertLess(float(np.abs(got - reference).max()), 1e-5)
        # The steps moved the weights well past the tolerance, so a wrong step cannot pass.
        self.assertGreater(float(np.abs(reference - initial).max()), 1e-2)

    def server_status(self):
        import summa
        client = summa.Client(f"127.0.0.1:{self.port}")
        try:
            return client.status()
        finally:
            client.close()

    def test_overlapped_and_not_give_the_same_weights_bit_for_bit_and_each_partition_goes_once(self):
        with ProcessGroup() as g:
            plain = self.run_job(g, 2, "--overlap=0", "--steps=20")
            # On gRPC (the transport woken by an alarm on its completion queue when a partition
            # becomes ready), then on the socket data plane (woken by an eventfd).
            on_grpc = self.run_job(g, 2, "--overlap=1", "--steps=20", "--data_plane=grpc")
            self.assertTrue(np.array_equal(plain, on_grpc), f"max difference {np.abs(plain - on_grpc).max()}")
            overlapped = self.run_job(g, 2, "--overlap=1", "--steps=20")
            status = self.server_status()
            self.assertTrue(np.array_equal(plain, overlapped),
                            f"max difference {np.abs(plain - overlapped).max()}")
            self.assertEqual(status.version, 20)
            # Every partition once a step from each process: none twice, none left out.
            self.assertEqual(status.partition_count, 6)
            self.assertEqual([m.pushes for m in status.members], [20 * 6, 20 * 6])
            self.assertEqual(status.duplicate_pushes, 0)
            self.assert_follows(overlapped, self.reference(g, "--steps=20"), self.initial(g))
            # A bf16 wire: each partition encoded as it is ready, the same steps as not overlapped.
            bf16 = ["--wire_dtype=bf16"]
            plain16 = self.run_job(g, 2, "--overlap=0", "--steps=20", server_flags=bf16)
            overlapped16 = self.run_job(g, 2, "--overlap=1", "--steps=20", server_flags=bf16)
            self.assertTrue(np.array_equal(plain16, overlapped16),
                            f"bf16: max difference {np.abs(plain16 - overlapped16).max()}")
            self.assertFalse(np.array_equal(plain16, plain), "the wire was not bf16")
            self.assertTrue(np.all((plain16.view(np.uint32) & 0xFFFF) == 0), "weights not pulled as bf16")

    def test_on_the_shm_plane_pushes_go_from_the_gradient_buffers_in_place_and_end_on_the_same_weights(self):
        with ProcessGroup() as g:
            plain = self.run_job(g, 2, "--overlap=0", "--steps=20")  # the socket plane
            for overlap in (0, 1):
                tag = f"shm{overlap}"
                metrics_port = os.path.join(g.dir, f"{tag}.metrics.port")
                shm = [f"--shm_socket={os.path.join(g.dir, tag + '.sock')}", "--metrics_address=127.0.0.1:0",
                       f"--metrics_port_file={metrics_port}"]
                got = self.run_job(g, 2, f"--overlap={overlap}", "--steps=20", "--data_plane=shm", server_flags=shm)
                self.assertTrue(np.array_equal(plain, got), f"overlap {overlap}: max difference {np.abs(plain - got).max()}")
                # Every push of every step (2 processes, 20 steps, 6 partitions) read where the
                # process's gradient buffer holds it: the optimizer's buffers are in its values segment.
                port = int(g.wait_for_file(metrics_port, self.server))

                def in_place():
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                        for line in r.read().decode().splitlines():
                            if line.startswith("summa_server_shm_plane_values_in_place_total "):
                                return float(line.split()[1])
                    return None

                wait_until("the pushes read in place in the metrics", lambda: in_place() == 2 * 20 * 6, 10)

    def test_partitions_go_during_backward_last_layers_first_and_each_forward_waits_for_its_own(self):
        with ProcessGroup() as g:
            # Rank 1 starts each backward 0.2 s late: rank 0's partitions cannot come back before
            # rank 1 has pushed them, so a forward that did not wait would start before them.
            _, records = self.run_job(g, 2, "--steps=6", "--delay_rank=1", "--delay=0.2", record=True)
        record = records[0]
        partitions = record["partitions"]
        self.assertEqual(len(partitions), 6)
        steps = record["steps"]
        for s in range(1, len(steps)):
            timeline = steps[s]["timeline"]  # step s - 1's, finished as step s's backward began
            self.assertEqual(len(timeline), len(partitions))
            called = steps[s - 1]["step_called_ns"]
            ready = [t["ready_ns"] for t in timeline]
            # Every partition made ready by backward itself, before step() was called...
            self.assertTrue(all(0 <= r < called for r in ready), (s, ready, called))
            # ...the last layers' first: backward runs them first.
            self.assertEqual(sorted(range(len(ready)), key=lambda k: ready[k]),
                             list(reversed(range(len(ready)))), (s, ready))
            for t in timeline:
                self.assertLessEqual(t["ready_ns"], t["start_ns"])
                self.assertLess(t["start_ns"], t["end_ns"])
            # Each module's forward of step s began only after its partitions of step s - 1 came back.
            for module, params in record["modules"].items():
                mine = {k for k, (o, n) in enumerate(partitions)
                        for a, size in params if o < a + size and a < o + n}
                began = steps[s]["forward_starts"][module]
                last = max(timeline[k]["end_ns"] for k in mine)
                self.assertGreaterEqual(began, last, f"step {s}: {module}'s forward began before its weights came")

    def test_two_processes_follow_one_with_each_optimizer_and_its_options(self):
        cases = [
            ("ps", []),
            ("ps, parameters only (no forward overlap)", ["--params_only"]),
            ("distributed, sum", ["--optimizer=distributed"]),
            ("distributed, average (the default op)", ["--optimizer=distributed", "--op=average"]),
            ("distributed, two parameter groups", ["--optimizer=distributed", "--groups"]),
            ("ps, gradient accumulation over 2 backwards", ["--accumulate=2"]),
            ("distributed, gradient accumulation", ["--optimizer=distributed", "--accumulate=2"]),
            ("ps, unused parameters", ["--unused"]),
            ("ps, .grad set to None before backward", ["--set_to_none"]),
            ("distributed, .grad set to None", ["--optimizer=distributed", "--set_to_none"]),
            ("distributed, unused parameters", ["--optimizer=distributed", "--unused"]),
        ]
        with ProcessGroup() as g:
            for name, flags in cases:
                with self.subTest(name):
                    steps = ["--steps=8"]
                    ref_flags = [f for f in flags if f in ("--groups", "--unused")]
                    got = self.run_job(g, 2, *steps, *flags)
                    self.assert_follows(got, self.reference(g, *steps, *ref_flags), self.initial(g, *ref_flags))

    def test_frozen_parameters_are_neither_pushed_nor_decayed(self):
        with ProcessGroup() as g:
            got = self.run_job(g, 2, "--steps=6", "--frozen", server_flags=["--weight_decay=0.1"])
            status = self.server_status()
            initial = self.initial(g, "--frozen")
        # The server holds 1,496 values (the frozen layer's 1,056 stay out): 6 partitions.
        self.assertEqual(status.partition_count, 6)
        frozen = slice(8 * 32 + 32, 8 * 32 + 32 + 32 * 32 + 32)  # model.parameters() order
        self.assertTrue(np.array_equal(got[frozen], initial[frozen]), "the frozen layer did not move")
        self.assertGreater(float(np.abs(np.delete(got - initial, np.r_[frozen])).max()), 1e-2)

    def test_hierarchical_exchange_equals_each_process_pushing(self):
        for optimizer in ("ps", "distributed"):
            with self.subTest(optimizer), ProcessGroup() as g:
                steps = ["--steps=8", f"--optimizer={optimizer}"]
                flat = self.run_job(g, 2, *steps)
                local = self.run_job(g, 2, *steps, local=True)
                self.assertLess(float(np.abs(flat - local).max()), 1e-6)
                status = self.server_status()
                # One member (the host's leader) pushed for both processes.
                self.assertEqual(len(status.members), 1 if optimizer == "ps" else 0)
                self.assert_follows(local, self.reference(g, *steps[:1]), self.initial(g))

    def test_gpu_parameters_train_as_on_the_cpu(self):
        import torch
        if not torch.cuda.is_available():
            self.skipTest("no GPU on this machine")
        cases = [("ps, overlapped", []), ("ps, not overlapped", ["--overlap=0"]),
                 ("distributed", ["--optimizer=distributed"])]
        with ProcessGroup() as g:
            for name, flags in cases:
                with self.subTest(name):
                    cpu = self.run_job(g, 2, "--steps=8", *flags)
                    gpu = self.run_job(g, 2, "--steps=8", "--device=cuda", *flags)
                    self.assertLess(float(np.abs(cpu - gpu).max()), 1e-5)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--source", required=True)
    ARGS, rest = ap.parse_known_args()
    ARGS.server = os.path.join(ARGS.bin, "server", "summa-server")
    ARGS.python_path = os.path.join(ARGS.bin, "python")
    sys.path.insert(0, ARGS.python_path)
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
