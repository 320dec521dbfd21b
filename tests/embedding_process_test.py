"""Embedding tables on real servers (127.0.0.1, OS-chosen ports), trained from PyTorch through
summa.Embedding by two processes (tests/tools/embedding_child.py): sparse and dense give the same
weights bit for bit with sgd and adagrad (the table small enough to train both ways), on the C++
client over gRPC and over the socket data plane and on grpcio, on one server and on two shards; a
step that looks up no row; a row pulled and pushed by both ranks in
a step counts once for each; lazy Adam leaves the rows no one pushed as they were; a server
SIGKILLed after a checkpoint comes back with every row and its optimizer state, so that the job
ends on an undisturbed run's weights bit for bit; bad input is refused naming what is wrong."""
import argparse
import json
import os
import signal
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from procs import ProcessGroup, wait_until  # noqa: E402

ARGS = None
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools", "embedding_child.py")
STEPS = 12
# Each rank's shard: 4 examples of 2 ids, distinct within the shard.
PULLED_PER_STEP = 8


class EmbeddingProcessTest(unittest.TestCase):
    def start_servers(self, g, shards, *flags, workers=2):
        """One server, or `shards` shards; their comma-joined addresses and ports."""
        if shards == 1:
            _, port = g.start_server(ARGS.server, f"--workers={workers}", *flags, name=f"server{len(g.procs)}")
            return f"127.0.0.1:{port}", [port]
        ports = []
        for i in range(shards):
            _, port = g.start_server(ARGS.server, "--workers=2", f"--shards={shards}", f"--shard={i}",
                                     "--partition_bytes=256", *flags, name=f"shard{i}-{len(g.procs)}")
            ports.append(port)
        return ",".join(f"127.0.0.1:{p}" for p in ports), ports

    def run_job(self, g, server, *flags, steps=STEPS, expect=0):
        tag = len(g.procs)
        dump = os.path.join(g.dir, f"job{tag}")
        procs = [g.start(f"child{tag}-{r}", [sys.executable, CHILD, f"--server={server}", f"--rank={r}",
                                             f"--steps={steps}", f"--dump={dump}", *flags],
                         env={"PYTHONPATH": ARGS.python_path})
                 for r in range(2)]
        for p in procs:
            self.assertEqual(g.wait(p, 120), expect, g.log(p))
        return dump

    def sparse_and_dense(self, g, optimizer, server_flags, child_flags=(), shards=1):
        server, _ = self.start_servers(g, shards, *server_flags)
        initial = os.path.join(g.dir, f"initial{len(g.procs)}.npy")
        sparse = np.load(self.run_job(g, server, "--table=sparse", f"--optimizer={optimizer}",
                                      f"--dump_initial={initial}", *child_flags) + ".npz")
        server, _ = self.start_servers(g, shards, *server_flags)
        dense = np.load(self.run_job(g, server, "--table=dense", f"--initial={initial}", *child_flags) + ".npz")
        return sparse, dense, np.load(initial)

    def assert_same(self, sparse, dense, initial):
        self.assertTrue(np.array_equal(sparse["rows"], dense["rows"]),
                        f"rows differ by {np.abs(sparse['rows'] - dense['rows']).max()}")
        self.assertTrue(np.array_equal(sparse["mlp"], dense["mlp"]),
                        f"the MLP differs by {np.abs(sparse['mlp'] - dense['mlp']).max()}")
        # The steps moved the touched rows: a table that never stepped cannot pass.
        self.assertGreater(float(np.abs(sparse["rows"][:48] - initial[:48]).max()), 1e-3)
        # Rows no batch touched are their initial values.
        self.assertTrue(np.array_equal(sparse["rows"][48:], initial[48:]))

    def status(self, address):
        import summa
        client = summa.Client(address, native=False)
        try:
            return client.status()
        finally:
            client.close()

    def test_sparse_and_dense_give_the_same_weights_with_sgd_and_adagrad(self):
        with ProcessGroup() as g:
            self.assert_same(*self.sparse_and_dense(g, "sgd", ["--lr=0.1"]))
            self.assert_same(*self.sparse_and_dense(g, "adagrad", ["--lr=0.1", "--optimizer=adagrad", "--eps=1e-10"],
                                                    ["--eps=1e-10"]))
            # On the socket data plane (required: a client that could not take it fails).
            self.assert_same(*self.sparse_and_dense(g, "sgd", ["--lr=0.1", "--data_address=127.0.0.1:0"],
                                                    ["--data_plane=socket"]))
            # The grpcio client, where the extension is not built, moves the same rows.
            self.assert_same(*self.sparse_and_dense(g, "sgd", ["--lr=0.1"], ["--native=0"]))
            # Prefetched rows of ids the forward does not look up are not taken for its own.
            self.assert_same(*self.sparse_and_dense(g, "sgd", ["--lr=0.1"], ["--prefetch=2"]))

    def test_steps_that_look_up_no_row_still_step_the_table(self):
        # Odd steps use no row: their pushes are empty, and each waits for the table to reach its
        # step first (a shard a step behind would refuse it as a future step's).
        with ProcessGroup() as g:
            server, _ = self.start_servers(g, 1, "--lr=0.1")
            # Rank 1's rows of each even step go late, so that rank 0 reaches the odd step after
            # it before the table has finished the even one.
            self.run_job(g, server, "--table=sparse", "--skip_odd", "--steps=20", "--slow_sparse_rank=1",
                         "--prefetch=0")  # a prefetch would wait for the table (the barrier) itself
            table = self.status(server).tables[0]
        self.assertEqual(table.version, 20)
        self.assertEqual(table.rows_pushed, 2 * 10 * PULLED_PER_STEP)

    def test_two_shards_hold_the_rows_by_hash_and_train_as_one_server(self):
        with ProcessGroup() as g:
            sparse, dense, initial = self.sparse_and_dense(g, "sgd", ["--lr=0.1"], shards=2)
            self.assert_same(sparse, dense, initial)
            one, _, _ = self.sparse_and_dense(g, "sgd", ["--lr=0.1"])
            self.assertTrue(np.array_equal(one["rows"], sparse["rows"]))
            # Each shard holds its share of the 64 rows (every row was pulled), none twice.
            server, ports = self.start_servers(g, 2, "--lr=0.1")
            self.run_job(g, server, "--table=sparse", "--steps=2")
            held = [self.status(f"127.0.0.1:{p}").tables[0].rows for p in ports]
            self.assertEqual(sum(held), 64)
            self.assertTrue(all(0 < h < 64 for h in held), held)

    def test_a_row_pulled_and_pushed_by_both_ranks_counts_once_for_each(self):
        import urllib.request
        with ProcessGroup() as g:
            metrics_file = os.path.join(g.dir, "server.metrics")
            server, _ = self.start_servers(g, 1, "--lr=0.1", "--metrics_address=127.0.0.1:0",
                                           f"--metrics_port_file={metrics_file}")
            dump = self.run_job(g, server, "--table=sparse")
            status = self.status(server)
            metrics_port = int(open(metrics_file).read())

            def scraped():  # the metrics are refreshed on the server's tick
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
                    text = r.read().decode()
                return text if f'summa_server_table_rows_pushed_total{{table="items"}} {2 * STEPS * PULLED_PER_STEP}' \
                    in text else None
            metrics = wait_until("the table's metrics", scraped, 30)
            worker = json.load(open(dump + ".json"))
        self.assertIn('summa_server_table_rows{table="items"} 64', metrics)
        self.assertIn('summa_server_table_rows_created_total{table="items"} 64', metrics)
        table = status.tables[0]
        self.assertEqual(table.name, "items")
        self.assertEqual(table.version, STEPS)
        # Every step each rank pushes its 8 distinct rows once (the ranks share them all).
        self.assertEqual(table.rows_pushed, 2 * STEPS * PULLED_PER_STEP)
        # Each rank pulls its batch's rows once a step (the prefetch is the forward's pull), and
        # rank 0 the whole table at the end.
        self.assertEqual(table.rows_pulled, 2 * STEPS * PULLED_PER_STEP + 64)
        self.assertEqual(worker, {"rows_pulled": STEPS * PULLED_PER_STEP, "rows_pushed": STEPS * PULLED_PER_STEP})
        self.assertEqual(table.rows, 64)
        self.assertEqual(table.rows_created, 64)
        self.assertEqual(status.duplicate_pushes, 0)
        self.assertGreater(status.table_bytes, 64 * 4 * 4)

    def test_lazy_adam_leaves_the_rows_no_one_pushed_as_they_were(self):
        with ProcessGroup() as g:
            server, _ = self.start_servers(g, 1, "--lr=0.1")
            initial = os.path.join(g.dir, "initial.npy")
            got = np.load(self.run_job(g, server, "--table=sparse", "--optimizer=adam",
                                       f"--dump_initial={initial}") + ".npz")
            start = np.load(initial)
        from embedding_child import batch
        drawn = np.zeros(64, bool)
        for step in range(STEPS):
            drawn[batch(step, 8, 2, 64, 48)[0].reshape(-1).numpy()] = True
        self.assertGreater(drawn.sum(), 30)
        self.assertLess(drawn.sum(), 64)
        self.assertTrue(np.array_equal(got["rows"][~drawn], start[~drawn]))
        self.assertTrue((np.abs(got["rows"][drawn] - start[drawn]).max(axis=1) > 1e-4).all())

    def test_a_server_killed_after_a_checkpoint_comes_back_with_its_rows_and_their_state(self):
        flags = ["--lr=0.1", "--optimizer=adagrad", "--eps=1e-10", "--checkpoint_every=3"]
        child = ["--optimizer=adagrad", "--eps=1e-10"]
        with ProcessGroup() as g:
            server, _ = self.start_servers(g, 1, *flags, f"--checkpoint_dir={os.path.join(g.dir, 'a')}")
            undisturbed = np.load(self.run_job(g, server, "--table=sparse", *child) + ".npz")
            ckpt = os.path.join(g.dir, "b")
            proc, port = g.start_server(ARGS.server, "--workers=2", *flags, f"--checkpoint_dir={ckpt}", name="killed")
            address = f"127.0.0.1:{port}"
            self.run_job(g, address, "--table=sparse", "--steps=6", "--no_leave", *child)
            wait_until("the checkpoint of step 6", lambda: self.status(address).last_checkpoint_version == 6)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            _, port = g.start_server(ARGS.server, "--workers=2", *flags, f"--checkpoint_dir={ckpt}", name="restored")
            address = f"127.0.0.1:{port}"
            table = self.status(address).tables[0]
            self.assertEqual((table.version, table.rows), (6, 64))
            resumed = np.load(self.run_job(g, address, "--table=sparse", *child) + ".npz")
        self.assertTrue(np.array_equal(undisturbed["rows"], resumed["rows"]),
                        f"rows differ by {np.abs(undisturbed['rows'] - resumed['rows']).max()}")
        self.assertTrue(np.array_equal(undisturbed["mlp"], resumed["mlp"]))

    def test_bad_input_is_refused_naming_it(self):
        import grpc
        import summa
        from summa.v1 import summa_pb2 as pb
        with ProcessGroup() as g:
            # Messages as small as the server takes: an answer of 300,000 rows of 4 floats is past it.
            server, _ = self.start_servers(g, 1, "--lr=0.1", "--max_message_bytes=4259840", workers=1)
            table = pb.EmbeddingTableSpec(name="items", dim=4, num_embeddings=100)
            for native in (True, False):
                client = summa.Client(server, rank=0, world_size=1, native=native)
                try:
                    client.join([("w", (2,))], np.zeros(2, np.float32), tables=[table])
                    rows = np.empty((1, 4), np.float32)
                    with self.assertRaises(summa.SummaError) as e:
                        client.sparse_pull(3, 0, np.array([1], np.uint64), rows)
                    self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                    # The C++ client knows the tables it declared; the server names them.
                    self.assertIn("table 3 is not declared", e.exception.message)
                    self.assertIn("1 table", e.exception.message)
                    with self.assertRaises(summa.SummaError) as e:
                        client.sparse_pull(0, 0, np.array([5, 100], np.uint64), np.empty((2, 4), np.float32))
                    self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                    self.assertIn("id 100 is past its num_embeddings, 100", e.exception.message)
                    # The C++ client checks the buffer before sending (ValueError, as numpy's); the
                    # server refuses what grpcio sends.
                    with self.assertRaises((summa.SummaError, ValueError)) as e:
                        client.sparse_push(0, 0, 1, np.array([5], np.uint64), np.zeros((1, 3), np.float32))
                    self.assertIn("4 floats", str(e.exception))
                    if not native:
                        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                finally:
                    client.close()
            # Malformed requests on the wire and a non-finite gradient are refused, naming why.
            client = summa.Client(server, rank=0, world_size=1, native=False)
            try:
                client.join([("w", (2,))], None, tables=[table])
                cases = [
                    (client._sparse_push, pb.SparsePushRequest(rank=0, session=client.session, table=0, count=10,
                                                               data=b"\0" * 8), "fewer than its ids"),
                    (client._sparse_push, pb.SparsePushRequest(rank=0, session=client.session, table=0, count=1,
                                                               data=b"\0" * 8 + b"\0" * 15), "not ids then float32"),
                    (client._sparse_pull, pb.SparsePullRequest(rank=0, session=client.session, table=0,
                                                               ids=b"\0" * 7), "do not hold"),
                    (client._sparse_pull, pb.SparsePullRequest(rank=0, session=client.session, table=0,
                                                               ids=np.full(300000, 5, np.uint64).tobytes()),  # duplicates: a row each
                     "--max_message_bytes"),
                ]
                for method, request, why in cases:
                    with self.assertRaises(summa.SummaError) as e:
                        client._call(method, request.SerializeToString(), "malformed")
                    self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT, why)
                    self.assertIn(why, e.exception.message)
                nan = np.zeros((1, 4), np.float32)
                nan[0, 2] = np.nan
                with self.assertRaises(summa.SummaError) as e:
                    client.sparse_push(0, 0, 1, np.array([7], np.uint64), nan)
                self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("row 7 holds nan", e.exception.message)
            finally:
                client.close()
            # Under --nonfinite=zero a NaN is taken as 0: that element of the row stays, the rest moves.
            zero, _ = self.start_servers(g, 1, "--lr=0.1", "--nonfinite=zero", workers=1)
            client = summa.Client(zero, rank=0, world_size=1)
            try:
                client.join([("w", (2,))], np.zeros(2, np.float32), tables=[table])
                before = np.empty((1, 4), np.float32)
                client.sparse_pull(0, 0, np.array([7], np.uint64), before)
                grads = np.ones((1, 4), np.float32)
                grads[0, 2] = np.nan
                self.assertTrue(client.sparse_push(0, 0, 1, np.array([7], np.uint64), grads))
                after = np.empty((1, 4), np.float32)
                self.assertEqual(client.sparse_pull(0, 1, np.array([7], np.uint64), after), 1)
                self.assertEqual(after[0, 2], before[0, 2])
                self.assertTrue(np.array_equal(np.delete(after[0], 2), np.delete(before[0], 2) - np.float32(0.01)))
                self.assertEqual(self.status(zero).nonfinite_pushes, 1)
            finally:
                client.close()
            # A worker that declares another table is refused at its join, naming both.
            other = summa.Client(server, rank=0, world_size=1, native=False)
            try:
                with self.assertRaises(summa.SummaError) as e:
                    other.join([("w", (2,))], None, tables=[pb.EmbeddingTableSpec(name="items", dim=8)])
                self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
                self.assertIn("embedding table 0", e.exception.message)
            finally:
                other.close()


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ARGS, rest = ap.parse_known_args()
    ARGS.server = os.path.join(ARGS.bin, "server", "summa-server")
    ARGS.python_path = os.path.join(ARGS.bin, "python")
    sys.path.insert(0, ARGS.python_path)
    unittest.main(argv=[sys.argv[0], *rest])


if __name__ == "__main__":
    main()
