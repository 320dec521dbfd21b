"""The Python client (python/summa, imported from the build tree) against a real summa-server on
127.0.0.1 (OS-chosen ports): N processes through ParameterServerOptimizer and through
DistributedOptimizer follow one process on the whole batch, AllReduce sums torch tensors and
numpy arrays (one over 4 MiB in chunks), the server's refusals surface as SummaError with its
code and message, a SIGKILLed Python worker rejoins under --on_worker_loss=wait and the job ends
on the undisturbed run's weights, and the data path copies once per direction."""
import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
import unittest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from procs import ProcessGroup, wait_until  # noqa: E402

ARGS = None
# LeNet, 1024 examples in global batches of 64: 16 steps an epoch.
LENET = ["--batch_size=64", "--train_limit=1024", "--test_limit=200", "--seed=3"]


def child_env(rank=None, **extra):
    env = {"PYTHONPATH": ARGS.python_path, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if rank is not None:
        env["RANK"] = str(rank)
    env.update(extra)
    return env



class PythonClientTest(unittest.TestCase):
    def lenet(self, g, port, rank, world, *extra, name=None):
        return g.start(name or f"lenet{rank}-{time.monotonic_ns()}", [
            sys.executable, ARGS.lenet, f"--server=127.0.0.1:{port}", f"--world_size={world}",
            *LENET, *extra], env=child_env(rank))

    def reference(self, g, *extra):
        out = os.path.join(g.dir, "reference.npy")
        proc = g.start("reference", [sys.executable, ARGS.lenet, "--reference", *LENET,
                                     f"--dump_weights={out}", *extra], env=child_env())
        self.assertEqual(g.wait(proc, 120), 0, g.log(proc))
        return np.load(out)

    def initial_weights(self):
        sys.path.insert(0, os.path.dirname(ARGS.lenet))
        from pytorch_lenet import LeNet
        return torch.cat([p.detach().reshape(-1) for p in LeNet(3).parameters()]).numpy()

    def assert_matches_reference(self, got, reference):
        self.assertEqual(got.shape, reference.shape)
        self.assertLess(float(np.abs(got - reference).max()), 1e-5)
        # The steps moved the weights well past the tolerance, so a wrong step cannot pass.
        self.assertGreater(float(np.abs(reference - self.initial_weights()).max()), 1e-2)

    def test_two_processes_with_the_server_optimizer_match_one_process_on_the_whole_batch(self):
        steps = ["--steps=12", "--epochs=1", "--lr=0.5"]
        with ProcessGroup() as g:
            # LeNet's 129068 floats in 6 partitions: the flat buffer cut where the server says.
            server, port = g.start_server(ARGS.server, "--workers=2", "--lr=0.5",
                                          "--partition_bytes=100000")
            dumps = [os.path.join(g.dir, f"w{r}.npy") for r in range(2)]
            procs = [self.lenet(g, port, r, 2, *steps, f"--dump_weights={dumps[r]}") for r in range(2)]
            for p in procs:
                self.assertEqual(g.wait(p, 120), 0, g.log(p))
            client = summa.Client(f"127.0.0.1:{port}")
            status = client.status()
            client.close()
            self.assertEqual(status.version, 12)
            self.assertEqual(status.partition_count, 6)
            # 32 examples a step from each rank, counted with each of its 6 partitions' pushes.
            self.assertEqual([m.examples for m in status.members], [12 * 32 * 6, 12 * 32 * 6])
            w0, w1 = np.load(dumps[0]), np.load(dumps[1])
            self.assertTrue(np.array_equal(w0, w1), "both ranks hold the server's weights")
            self.assert_matches_reference(w0, self.reference(g, *steps))

    def test_two_processes_with_distributed_optimizer_match_one_process_on_the_whole_batch(self):
        steps = ["--steps=12", "--epochs=1", "--lr=0.5"]
        with ProcessGroup() as g:
            server, port = g.start_server(ARGS.server, "--workers=2")
            dumps = [os.path.join(g.dir, f"w{r}.npy") for r in range(2)]
            procs = [self.lenet(g, port, r, 2, *steps, "--optimizer=distributed",
                                f"--dump_weights={dumps[r]}") for r in range(2)]
            for p in procs:
                self.assertEqual(g.wait(p, 120), 0, g.log(p))
            w0, w1 = np.load(dumps[0]), np.load(dumps[1])
            self.assertTrue(np.array_equal(w0, w1))
            self.assert_matches_reference(w0, self.reference(g, *steps))

    def test_async_and_ssp_modes_apply_every_push(self):
        for mode in (["--mode=async"], ["--mode=ssp", "--staleness=1"]):
            with ProcessGroup() as g:
                server, port = g.start_server(ARGS.server, "--workers=2", "--lr=0.1",
                                              "--partition_bytes=100000", *mode)
                procs = [self.lenet(g, port, r, 2, "--steps=10", "--epochs=1") for r in range(2)]
                for p in procs:
                    self.assertEqual(g.wait(p, 120), 0, g.log(p))
                client = summa.Client(f"127.0.0.1:{port}")
                status = client.status()
                client.close()
                # Each of the 20 pushes (10 a rank) applied on its own to each of the 6 partitions.
                self.assertEqual(status.version, 20, mode)
                self.assertEqual([m.pushes for m in status.members], [60, 60], mode)
                self.assertEqual(status.duplicate_pushes, 0)

    def test_allreduce_sums_tensors_and_arrays_across_processes(self):
        with ProcessGroup() as g:
            # A 6 MiB tensor sent whole would be refused at 5 MiB: it must travel in chunks.
            server, port = g.start_server(ARGS.server, "--workers=2", "--max_message_bytes=5MiB")
            # Rank 0 from $RANK, rank 1 from $JOB_COMPLETION_INDEX (a Kubernetes indexed Job).
            envs = [child_env(0), child_env(None, JOB_COMPLETION_INDEX="1")]
            procs = [g.start(f"allreduce{r}", [sys.executable, __file__, "--child=allreduce",
                                               f"--server=127.0.0.1:{port}"], env=envs[r])
                     for r in range(2)]
            for p in procs:
                self.assertEqual(g.wait(p, 120), 0, g.log(p))
                self.assertIn("allreduce ok", g.log(p))
            client = summa.Client(f"127.0.0.1:{port}")
            status = client.status()
            client.close()
            # torch, torch in place, numpy, average: one round each; the 6 MiB tensor: 2 chunks
            # of one round each, once as torch and once as numpy; broadcast: one.
            self.assertEqual(status.allreduce_rounds, 4 + 2 * 2 + 1)

    def test_bad_input_surfaces_as_an_exception_with_the_servers_code_and_message(self):
        with ProcessGroup() as g:
            server, port = g.start_server(ARGS.server, "--workers=2")
            address = f"127.0.0.1:{port}"
            rank0 = summa.Client(address, rank=0, world_size=2, join_timeout=5)
            model = torch.nn.Linear(5, 3)
            opt = summa.ParameterServerOptimizer(model.named_parameters(), client=rank0)
            # A model that differs from the one the server holds.
            other = summa.Client(address, rank=1, world_size=2, join_timeout=5)
            with self.assertRaises(summa.SummaError) as caught:
                summa.ParameterServerOptimizer(torch.nn.Linear(5, 4).named_parameters(), client=other)
            self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            # The server's message whole, after the client's words on which call failed.
            self.assertTrue(caught.exception.message.endswith(
                "model mismatch at tensor 0: server has 'weight' [3, 5], this worker sent 'weight' [4, 5]"),
                caught.exception.message)
            # A world size other than the server's.
            with self.assertRaises(summa.SummaError) as caught:
                summa.Client(address, rank=1, world_size=3, join_timeout=5).join([("weight", (3, 5))])
            self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("expects 3 workers but the server was started for 2", caught.exception.message)
            # A gradient holding NaN (--nonfinite=reject): refused, naming rank, step and element.
            model.weight.grad = torch.full_like(model.weight, float("nan"))
            with self.assertRaises(summa.SummaError) as caught:
                opt.step(1)
            self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("rank 0 pushed a non-finite gradient for step 0, partition 0: element 0 is nan",
                          caught.exception.message)
            self.assertEqual(opt.next_step, 0, "a refused step is not counted")
            # A bad group size; and a dtype Summa does not sum, refused before any call.
            with self.assertRaises(summa.SummaError) as caught:
                summa.allreduce(np.ones(3, np.float32), name="x", client=rank0, group_size=0)
            self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("group size must be in [1,", caught.exception.message)
            with self.assertRaises(TypeError):
                summa.allreduce(np.ones(3), name="y", client=rank0)
            self.assertIsNone(server.poll(), "the server keeps running")
            rank0.close()
            other.close()

    def test_a_late_push_pull_is_refused_with_its_reason_not_a_guessed_version(self):
        # --backup_workers=1 of 2: a step completes with its first push. Rank 0 steps alone to
        # version 3; rank 1's push-pull of step 0 comes back late, past step 1, which a Python
        # caller counting its own steps cannot go on from: each client says so (LATE_PUSH).
        clients = [False] + ([True] if importlib.util.find_spec("summa._native") else [])
        for native in clients:
            with ProcessGroup() as g:
                server, port = g.start_server(ARGS.server, "--workers=2", "--backup_workers=1", "--lr=1")
                address = f"127.0.0.1:{port}"
                ranks = [summa.Client(address, rank=r, world_size=2, join_timeout=5, native=native)
                         for r in range(2)]
                ranks[0].join([("w", (4,))], np.zeros(4, np.float32))
                ranks[1].join([("w", (4,))])
                grad, weights = np.ones(4, np.float32), np.zeros(4, np.float32)
                for step in range(3):
                    ranks[0].push_pull(step, 1, grad, weights)
                np.testing.assert_array_equal(weights, np.full(4, -3, np.float32))
                with self.assertRaises(summa.SummaError) as caught:
                    ranks[1].push_pull(0, 1, grad, np.zeros(4, np.float32))
                self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION, native)
                self.assertEqual(caught.exception.reason, "LATE_PUSH", native)
                self.assertIn("--backup_workers", caught.exception.message)
                status = ranks[0].status()
                self.assertEqual(status.backup_workers, 1)
                self.assertEqual([m.late_pushes for m in status.members], [0, 1], native)
                for c in ranks:
                    c.close()

    # 160 steps: through the C++ client a step takes about 10 ms here, and the faults below are
    # made at version 10, found by polling the server every 50 ms.
    JOB = ["--epochs=10", "--lr=0.3"]
    JOB_SERVER = ["--workers=2", "--lr=0.3", "--lease=1s"]

    def run_job(self, g, server_flags=(), disturb=None):
        """A 2-process LeNet job; `disturb(g, port, client, procs)` acts mid-job. Returns rank 0's
        final weights, the processes' logs and the server's last status."""
        server, port = g.start_server(ARGS.server, *self.JOB_SERVER, *server_flags)
        dump = os.path.join(g.dir, f"w-{time.monotonic_ns()}.npy")
        procs = [self.lenet(g, port, 0, 2, *self.JOB, f"--dump_weights={dump}"),
                 self.lenet(g, port, 1, 2, *self.JOB)]
        if disturb:
            disturb(g, port, procs)
        for p in procs:
            self.assertEqual(g.wait(p, 180), 0, g.log(p))
        client = summa.Client(f"127.0.0.1:{port}")
        status = client.status()
        client.close()
        self.assertEqual(status.version, 160)
        return np.load(dump), [g.log(p) for p in procs], status

    def undisturbed(self):
        with ProcessGroup() as g:
            return self.run_job(g)[0]

    def test_killed_python_worker_rejoins_under_wait_and_the_job_matches_an_undisturbed_run(self):
        def kill_rank1(g, port, procs):
            client = summa.Client(f"127.0.0.1:{port}")
            wait_until("version 10", lambda: client.status().version >= 10)
            procs[1].send_signal(signal.SIGKILL)
            procs[1].wait()
            members = wait_until("rank 1 lapsed", lambda: (lambda m: m[1].state == "lapsed" and m)(
                {m.rank: m for m in client.status().members}))
            # Under wait no step completes without it.
            self.assertLessEqual(client.status().version, members[1].pushes)
            client.close()
            procs[1] = self.lenet(g, port, 1, 2, *self.JOB, name="lenet1-restarted")

        baseline = self.undisturbed()
        with ProcessGroup() as g:
            weights, logs, status = self.run_job(
                g, ["--on_worker_loss=wait", "--rejoin_deadline=60s"], kill_rank1)
        self.assertRegex(logs[1], r"rank 1 of 2 joined at step [1-9]", "the new process resumed mid-job")
        self.assertEqual({m.rank: m.joins for m in status.members}[1], 2)
        # Every update counted once: the undisturbed run's weights, bit for bit.
        self.assertTrue(np.array_equal(weights, baseline),
                        f"max difference {np.abs(weights - baseline).max()}")

    def test_server_killed_and_restarted_python_workers_rejoin_and_follow_its_checkpoint(self):
        def restart_server(g, port, procs):
            client = summa.Client(f"127.0.0.1:{port}")
            # Killed once a checkpoint is on disk (its writer runs on the server's tick: on a loaded
            # machine steps can outrun it), so that the restarted server has one to restore.
            wait_until("version 10 and a checkpoint", lambda: (lambda s: s.version >= 10 and
                                                               s.last_checkpoint_version >= 4)(client.status()))
            client.close()
            server = next(p for p in g.procs if p.name == "server")
            server.send_signal(signal.SIGKILL)
            server.wait()
            port_file = os.path.join(g.dir, "server2.port")
            again = g.start("server2", [ARGS.server, f"--address=127.0.0.1:{port}",
                                        f"--port_file={port_file}", *self.JOB_SERVER, *ckpt_flags])
            g.wait_for_file(port_file, again)

        baseline = self.undisturbed()
        with ProcessGroup() as g:
            ckpt_flags = [f"--checkpoint_dir={os.path.join(g.dir, 'ckpt')}", "--checkpoint_every=4"]
            weights, logs, status = self.run_job(g, ckpt_flags, restart_server)
            self.assertIn("restored", g.log(next(p for p in g.procs if p.name == "server2")).lower())
        for log in logs:
            self.assertIn("lost the server", log)
        # The workers went back to the checkpoint's step and its place in the data: the steps
        # redone give the undisturbed run's weights, bit for bit.
        self.assertTrue(np.array_equal(weights, baseline),
                        f"max difference {np.abs(weights - baseline).max()}")

    def launch(self, g, run_dir, *argv):
        proc = g.start(f"launch-{time.monotonic_ns()}", [
            "bash", ARGS.launch, "--bin", ARGS.bin, "--run_dir", run_dir, *argv],
            env={"PYTHONPATH": ""})
        return g.wait(proc, 240), g.log(proc)

    def test_launcher_runs_python_processes_and_the_10m_parameter_example(self):
        with ProcessGroup() as g:
            run_dir = os.path.join(g.dir, "lenet")
            code, out = self.launch(g, run_dir, "--python", ARGS.lenet, "--workers", "2",
                                    "--epochs", "1", "--batch_size", "64", "--",
                                    "--train_limit=512", "--test_limit=100")
            self.assertEqual(code, 0, out)
            self.assertIn("launch: all 2 workers finished", out)
            self.assertIn('"steps": 8}', out)  # 512 examples in batches of 64, rank 0's RESULT
            with open(os.path.join(run_dir, "worker1.log")) as f:
                self.assertIn("rank 1 of 2 joined at step 0", f.read())

            run_dir = os.path.join(g.dir, "resnet")
            code, out = self.launch(g, run_dir, "--python", ARGS.resnet, "--workers", "2",
                                    "--", "--steps=2", "--warmup=1", "--batch_size=2")
            self.assertEqual(code, 0, out)
            self.assertIn('"params": 11173962, "processes": 2, "how": "summa-ps"', out)
            with open(os.path.join(run_dir, "server.log")) as f:
                self.assertIn("11173962 parameters in 11 partitions", f.read())

            # A process that fails stops the job, and the launcher says which.
            code, out = self.launch(g, os.path.join(g.dir, "bad"), "--python", ARGS.lenet,
                                    "--workers", "2", "--", "--no_such_flag")
            self.assertEqual(code, 1, out)
            self.assertRegex(out, r"launch: worker [01] \(pid \d+\) failed with status 2")

    def sharded_servers(self, g):
        flags = ["--workers=2", "--shards=2", "--lr=0.5", "--partition_bytes=100000"]
        _, port0 = g.start_server(ARGS.server, *flags, "--shard=0", name="shard0")
        _, port1 = g.start_server(ARGS.server, *flags, "--shard=1", f"--coordinator=127.0.0.1:{port0}",
                                  name="shard1")
        return port0, port1

    def test_a_sharded_job_trains_through_every_shard_and_one_shard_alone_is_refused_by_name(self):
        with ProcessGroup() as g:
            port0, port1 = self.sharded_servers(g)
            alone = summa.Client(f"127.0.0.1:{port1}", rank=0, world_size=2, join_timeout=5)
            with self.assertRaises(summa.SummaError) as caught:
                alone.join([("w", (100000,))], np.zeros(100000, np.float32))
            self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("is shard 1 of 2; --server lists it as shard 0 of 1", caught.exception.message)
            alone.close()
        with ProcessGroup() as g:
            port0, port1 = self.sharded_servers(g)
            # Every shard's address, in shard order: the job trains as one server would.
            steps = ["--steps=6", "--epochs=1", "--lr=0.5"]
            dumps = [os.path.join(g.dir, f"w{r}.npy") for r in range(2)]
            procs = [g.start(f"lenet{r}", [sys.executable, ARGS.lenet, f"--server=127.0.0.1:{port0},127.0.0.1:{port1}",
                                           "--world_size=2", *LENET, *steps, f"--dump_weights={dumps[r]}"],
                             env=child_env(r)) for r in range(2)]
            for p in procs:
                self.assertEqual(g.wait(p, 120), 0, g.log(p))
            w0, w1 = np.load(dumps[0]), np.load(dumps[1])
            self.assertTrue(np.array_equal(w0, w1))
            self.assert_matches_reference(w0, self.reference(g, *steps))
            for port in (port0, port1):
                client = summa.Client(f"127.0.0.1:{port}")
                self.assertEqual(client.status().version, 6)
                client.close()

    def test_a_python_worker_joins_a_running_elastic_job_and_every_example_is_summed_once(self):
        child = os.path.join(os.path.dirname(__file__), "tools", "elastic_child.py")
        steps, batch = 30, 24
        with ProcessGroup() as g:
            server, port = g.start_server(ARGS.server, "--workers=2:3", "--lr=0.01")
            go, shards = os.path.join(g.dir, "go"), os.path.join(g.dir, "shards.jsonl")

            def worker(rank, *extra):
                return g.start(f"elastic{rank}-{time.monotonic_ns()}", [
                    sys.executable, child, f"--server=127.0.0.1:{port}", f"--rank={rank}", "--world=2",
                    f"--steps={steps}", f"--batch={batch}", f"--shards={shards}", *extra], env=child_env())

            procs = [worker(r, f"--pause=10:{go}") for r in range(2)]
            for p in procs:
                wait_until("a paused worker", lambda p=p: "pausing before step 10" in g.log(p) or p.poll() is not None)
                self.assertIn("pausing before step 10", g.log(p))
            client = summa.Client(f"127.0.0.1:{port}")
            procs.append(worker(-1))
            wait_until("the joiner", lambda: len(client.status().members) == 3)
            open(go, "w").close()
            for p in procs:
                self.assertEqual(g.wait(p, 120), 0, g.log(p))
            self.assertIn("rank 2 joined at step 11", g.log(procs[2]))
            status = client.status()
            client.close()
            self.assertEqual(status.version, steps)
            self.assertEqual([(c.from_step, list(c.ranks)) for c in status.group_changes], [(0, [0, 1]), (11, [0, 1, 2])])
            self.assertEqual(status.examples_applied, steps * batch)
            # Each step's batch covered once, by the ranks of its group, each over that group.
            with open(shards) as f:
                lines = [json.loads(line) for line in f]
            for step in range(steps):
                group = [0, 1] if step < 11 else [0, 1, 2]
                got = sorted((s["begin"], s["end"], s["rank"], tuple(s["group"])) for s in lines if s["step"] == step)
                self.assertEqual([r for _, _, r, _ in sorted(got, key=lambda t: t[2])], group, step)
                self.assertEqual({gr for *_, gr in got}, {tuple(group)}, step)
                covered = [i for b, e, *_ in got for i in range(b, e)]
                self.assertEqual(covered, list(range(batch)), step)

    def test_two_diloco_processes_match_a_replay_of_the_algorithm(self):
        """summa.DiLoCo in two processes against summa-server --mode=diloco --sync_every=5: 4
        exchanges of 5 local steps, the inner optimizer torch's, the outer the server's Nesterov.
        tools/diloco_child.py --replay computes the same job in one process with no server (each
        rank's inner optimizer and its state across exchanges, the pseudo-gradients examples *
        (anchor - weights) summed, Sgd::Apply's Nesterov in numpy float32): bit for bit the same,
        since every operation is the same float32 operation in the same order (the server sums
        two pushes, and a + b == b + a; the build does not contract to FMA)."""
        child = os.path.join(os.path.dirname(__file__), "tools", "diloco_child.py")
        H, exchanges, batch, params = 5, 4, 24, 8 * 16 + 16 + 16 * 4 + 4
        for inner in ("sgd", "adam"):
            with ProcessGroup() as g:
                server, port = g.start_server(ARGS.server, "--workers=2", "--mode=diloco", f"--sync_every={H}",
                                              "--outer_optimizer=nesterov", "--outer_lr=0.7",
                                              "--outer_momentum=0.9")
                common = [f"--exchanges={exchanges}", f"--batch={batch}", f"--inner={inner}"]
                dumps = [os.path.join(g.dir, f"w{r}.npy") for r in range(2)]
                procs = [g.start(f"diloco{r}", [sys.executable, child, f"--server=127.0.0.1:{port}", f"--rank={r}",
                                                "--world=2", *common, f"--out={dumps[r]}"], env=child_env())
                         for r in range(2)]
                replay = os.path.join(g.dir, "replay.npy")
                procs.append(g.start("replay", [sys.executable, child, "--replay", "--world=2", f"--H={H}",
                                                *common, f"--out={replay}"], env=child_env()))
                for p in procs:
                    self.assertEqual(g.wait(p, 120), 0, g.log(p))
                for r in range(2):
                    self.assertIn(f"rank {r} joined at exchange 0, H={H}", g.log(procs[r]))
                client = summa.Client(f"127.0.0.1:{port}")
                status = client.status()
                client.close()
                # The version counts outer steps: one an exchange.
                self.assertEqual(status.version, exchanges, inner)
                self.assertEqual(status.sync_every, H)
                self.assertEqual((status.parameter_count, status.partition_count), (params, 1))
                # One push an exchange from each rank (one partition), each of its H shards' examples,
                # and nothing else on the wire: bytes_in counts the pushes' float32 values.
                self.assertEqual([m.pushes for m in status.members], [exchanges, exchanges], inner)
                self.assertEqual([m.examples for m in status.members], [exchanges * H * batch // 2] * 2, inner)
                self.assertEqual(status.examples_applied, exchanges * H * batch)
                self.assertEqual(status.bytes_in, 2 * exchanges * params * 4, inner)
                w0, w1, want = np.load(dumps[0]), np.load(dumps[1]), np.load(replay)
                self.assertTrue(np.array_equal(w0, w1), f"{inner}: both ranks hold the outer weights")
                self.assertTrue(np.array_equal(w0, want),
                                f"{inner}: {int((w0 != want).sum())} of {params} weights differ from the replay, "
                                f"by at most {np.abs(w0 - want).max()}")
                # The job moved the weights (an exchange that did nothing would not match either).
                torch.manual_seed(5)
                initial = torch.cat([p.detach().reshape(-1) for p in torch.nn.Sequential(
                    torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).parameters()]).numpy()
                self.assertGreater(float(np.abs(want - initial).max()), 0.05, inner)

    def test_diloco_and_the_server_optimizer_are_each_refused_by_the_others_server(self):
        """summa.DiLoCo needs a --mode=diloco server; ParameterServerOptimizer, whose pushes are
        gradients, is refused by one at its Join (a DiLoCo server takes each push as a
        pseudo-gradient): FAILED_PRECONDITION from the server, a ValueError from DiLoCo, each
        saying what to do; the job then runs with the right class."""
        model = lambda: torch.nn.Linear(3, 2)  # noqa: E731
        for diloco_server in (False, True):
            with ProcessGroup() as g:
                flags = ["--mode=diloco", "--sync_every=2"] if diloco_server else ["--lr=0.1"]
                server, port = g.start_server(ARGS.server, "--workers=1", *flags)
                address = f"127.0.0.1:{port}"
                refused = summa.Client(address, rank=0, world_size=1, join_timeout=5)
                m = model()
                with self.assertRaises(summa.SummaError if diloco_server else ValueError) as caught:
                    if diloco_server:
                        summa.ParameterServerOptimizer(m, client=refused)
                    else:
                        summa.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), client=refused)
                if diloco_server:
                    self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
                    self.assertIn("this is a DiLoCo job (summa-server --mode=diloco, 2 local steps", str(caught.exception))
                    self.assertIn("the Python summa.DiLoCo", str(caught.exception))
                else:
                    self.assertIn("is not a DiLoCo job (summa-server --mode=diloco)", str(caught.exception))
                    self.assertIn("use ParameterServerOptimizer", str(caught.exception))
                # The right class as the same rank: it trains, and the refused one pushed nothing.
                right = summa.Client(address, rank=0, world_size=1, join_timeout=5)
                m = model()
                x, y = torch.ones(4, 3), torch.zeros(4, 2)
                if diloco_server:
                    opt = summa.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), client=right)
                else:
                    opt = summa.ParameterServerOptimizer(m, client=right, overlap=False)
                for _ in range(2):  # two local steps and their exchange, or two steps
                    opt.zero_grad()
                    torch.nn.functional.mse_loss(m(x), y).backward()
                    opt.step(4)
                status = right.status()
                self.assertEqual(status.version, 1 if diloco_server else 2)
                self.assertEqual([(m.rank, m.pushes) for m in status.members], [(0, status.version)])
                refused.close()
                right.close()

    def test_a_newer_join_for_the_rank_fences_the_older_client(self):
        with ProcessGroup() as g:
            server, port = g.start_server(ARGS.server, "--workers=1")
            address = f"127.0.0.1:{port}"
            first = summa.Client(address, rank=0, world_size=1)
            old = summa.ParameterServerOptimizer([torch.nn.Parameter(torch.ones(3))], client=first)
            second = summa.Client(address, rank=0, world_size=1)
            new = summa.ParameterServerOptimizer([torch.nn.Parameter(torch.ones(3))], client=second)
            old.flat.params[0].grad = torch.ones(3)
            with self.assertRaises(summa.SummaError) as caught:
                old.step(1)  # refused, not retried: the newer process owns rank 0
            self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("rank 0 is held by a newer process: a later Join from", caught.exception.message)
            new.flat.params[0].grad = torch.ones(3)
            new.step(1)
            self.assertEqual(new.next_step, 1)
            first.close()
            second.close()

    def test_mutual_tls_and_tokens(self):
        with ProcessGroup() as g:
            certs = os.path.join(g.dir, "certs")
            subprocess.run(["bash", os.path.join(ARGS.source, "scripts/make-certs.sh"), certs],
                           check=True, stdout=subprocess.DEVNULL)
            c = lambda name: os.path.join(certs, name)
            server, port = g.start_server(ARGS.server, "--workers=1", f"--tls_cert={c('server.pem')}",
                                          f"--tls_key={c('server.key')}", f"--tls_ca={c('ca.pem')}",
                                          f"--token_file={c('worker.token')}", "--data_address=127.0.0.1:0")
            with open(c("worker.token")) as f:
                token = f.read().strip()
            mtls = summa.TLS(ca=c("ca.pem"), cert=c("client.pem"), key=c("client.key"))
            address = f"localhost:{port}"
            good = summa.Client(address, rank=0, world_size=1, token=token, tls=mtls)
            opt = summa.ParameterServerOptimizer([torch.nn.Parameter(torch.ones(3))], client=good)
            opt.flat.params[0].grad = torch.full((3,), 2.0)
            opt.step(2)  # sgd at the default lr 0.1: 1 - 0.1 * 2 / 2
            self.assertTrue(torch.equal(opt.flat.params[0].detach(), torch.full((3,), 0.9)))
            # The step went over the socket data plane, in TLS (the server's plane speaks it).
            self.assertTrue(good.on_socket_plane)
            self.assertIn("data plane: TLSv1.3", g.log(server))
            good.close()
            # No token: UNAUTHENTICATED, with the server's message.
            anonymous = summa.Client(address, rank=0, world_size=1, tls=mtls, join_timeout=5)
            with self.assertRaises(summa.SummaError) as caught:
                anonymous.join([("p0", (3,))])
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn("bearer token", caught.exception.message)
            anonymous.close()

    def test_a_token_file_is_read_again_when_it_changes(self):
        """A client given token_file= (the C++ client's and grpcio's) sends the file's new token
        once it changes: the server lists the old and new tokens, the clients' files are
        rewritten, then the server drops the old ones (no grace period) and both still step."""
        def write(path, text):
            with open(path + ".new", "w") as f:
                f.write(text)
            os.replace(path + ".new", path)
            return path
        with ProcessGroup() as g:
            server_tokens = write(os.path.join(g.dir, "server.tokens"), "old0 rank=0\nold1 rank=1\n")
            server, port = g.start_server(ARGS.server, "--workers=2", "--mode=async", f"--token_file={server_tokens}",
                                          "--token_grace_period=0s")
            files = [write(os.path.join(g.dir, f"rank{r}.token"), f"old{r}\n") for r in range(2)]
            clients = [summa.Client(f"127.0.0.1:{port}", rank=0, world_size=2, token_file=files[0]),
                       summa.Client(f"127.0.0.1:{port}", rank=1, world_size=2, token_file=files[1], native=False)]
            opts = [summa.ParameterServerOptimizer([torch.nn.Parameter(torch.ones(3))], client=c) for c in clients]

            def step_all():
                for opt in opts:
                    opt.flat.params[0].grad = torch.full((3,), 1.0)
                    opt.step(1)  # async: applied at once, whatever the other rank does

            step_all()
            write(server_tokens, "old0 rank=0\nold1 rank=1\nnew0 rank=0\nnew1 rank=1\n")
            g.wait_for_log(server, "token files reloaded", 30)
            for r in range(2):
                write(files[r], f"new{r}\n")
            time.sleep(summa.client.TOKEN_REFRESH_SECONDS + 0.5)  # the clients read their files again
            write(server_tokens, "new0 rank=0\nnew1 rank=1\n")
            wait_until("the server's second reload", lambda: g.log(server).count("token files reloaded") >= 2, 30)
            step_all()  # with the old tokens these are UNAUTHENTICATED
            self.assertEqual(int(clients[0].status().version), 4)
            for c in clients:
                c.close()

    def test_pip_installs_the_package_with_stubs_generated_from_the_proto(self):
        """pip install generates the stubs and builds summa._native through CMake (in this build
        tree, SUMMA_CMAKE_BUILD_DIR, where the target is up to date: a fresh configure and build
        of the client takes minutes); the installed extension joins and steps a real server."""
        with ProcessGroup() as g:
            server, port = g.start_server(ARGS.server, "--workers=1")
            # A copy of python/ and proto/, so that pip's in-place build leaves the checkout alone.
            src = os.path.join(g.dir, "src")
            shutil.copytree(os.path.join(ARGS.source, "python"), os.path.join(src, "python"),
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
            shutil.copytree(os.path.join(ARGS.source, "proto"), os.path.join(src, "proto"))
            venv = os.path.join(g.dir, "venv")
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True)
            pip = g.start("pip", [os.path.join(venv, "bin/pip"), "install", "--no-index",
                                  os.path.join(src, "python")],
                          env={"PYTHONPATH": "", "SUMMA_CMAKE_BUILD_DIR": ARGS.bin,
                               "SUMMA_REQUIRE_NATIVE": "1"})
            self.assertEqual(g.wait(pip, 240), 0, g.log(pip))
            probe = g.start("probe", [os.path.join(venv, "bin/python"), "-c", f"""
import numpy as np, summa, summa._native, summa.v1.summa_pb2 as pb
print('package:', summa.__file__)
print('methods:', ' '.join(m.name for m in pb.DESCRIPTOR.services_by_name['ParameterServer'].methods))
print('native:', summa._native.__file__)
client = summa.Client('127.0.0.1:{port}', rank=0, world_size=1)
assert client.native is not None
client.join([('w', (3,))], initial=np.ones(3, np.float32))
weights = np.zeros(3, np.float32)
client.push_pull(0, 2, np.full(3, 2.0, np.float32), weights)
print('weights:', weights.tolist())
client.close()
"""], env={"PYTHONPATH": ""})
            self.assertEqual(g.wait(probe, 60), 0, g.log(probe))
            # The C++ client logs to stderr, which shares the log: the probe's lines by their tags.
            got = dict(line.split(": ", 1) for line in g.log(probe).split("\n")
                       if line.split(":")[0] in ("package", "methods", "native", "weights"))
            self.assertTrue(got["package"].startswith(os.path.join(venv, "lib")), got)
            self.assertEqual(got["methods"], "Join Heartbeat Leave Push Pull PushPull AllReduce GetStatus "
                                             "Checkpoint Export Initialize RollBack Follow DataPlane SparsePull SparsePush")
            self.assertTrue(got["native"].startswith(os.path.join(venv, "lib")), got)
            # sgd at the default lr 0.1 from ones: 1 - 0.1 * 2 / 2, in float32.
            self.assertEqual(got["weights"], str(np.full(3, 0.9, np.float32).tolist()), got)

    def test_the_data_path_copies_once_each_way(self):
        """tracemalloc sees every bytes object and numpy buffer Python allocates: encoding a
        16 MiB push allocates the request (one copy of the gradient) and no more; decoding a
        16 MiB reply into the weights allocates nothing of its size (np.frombuffer on the reply,
        then one copy into the weights)."""
        from summa import _wire
        from summa.v1 import summa_pb2 as pb
        n = 4 << 20
        grads = np.arange(n, dtype=np.float32)
        weights = np.zeros(n, dtype=np.float32)
        header = pb.PushRequest(rank=1, step=2, partition=0, num_examples=3).SerializeToString()
        reply = pb.PullResponse(partition=0, version=3, data=grads.tobytes(), live_ranks=[0, 1]).SerializeToString()

        tracemalloc.start()
        request = _wire.with_data(header, 6, _wire.as_bytes_view(grads))
        encode_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        head, data = _wire.split_data(reply, 4)
        weights[:] = _wire.floats(data, n, "partition 0")
        decode_peak = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.stop()

        self.assertLess(encode_peak, 4 * n + (1 << 20))   # the request itself, 16 MiB
        self.assertLess(decode_peak, 1 << 20)               # no second copy of the reply's values
        parsed = pb.PushRequest.FromString(request)
        self.assertEqual((parsed.rank, parsed.step, parsed.num_examples), (1, 2, 3))
        self.assertEqual(parsed.data, grads.tobytes())
        self.assertTrue(np.array_equal(weights, grads))
        h = pb.PullResponse.FromString(head)
        self.assertEqual((h.version, list(h.live_ranks), h.data), (3, [0, 1], b""))


def allreduce_child(server):
    """One rank of test_allreduce_sums_tensors_and_arrays_across_processes: checks every sum
    exactly and prints "allreduce ok"."""
    summa.init(server, world_size=2)
    r = summa.rank()
    small = torch.arange(1000, dtype=torch.float32) * (r + 1)
    expected = torch.arange(1000, dtype=torch.float32) * 3
    assert torch.equal(summa.allreduce(small, name="small"), expected)
    assert torch.equal(small, torch.arange(1000, dtype=torch.float32) * (r + 1)), "not in place"
    summa.allreduce(small, name="small", inplace=True)
    assert torch.equal(small, expected)
    arr = np.full((7, 3), r + 1.0, np.float32)
    out = summa.allreduce(arr, name="array")
    assert isinstance(out, np.ndarray) and out.shape == (7, 3) and (out == 3).all(), out
    avg = summa.allreduce(np.full(5, 2.0 * (r + 1), np.float32), name="avg", op="average")
    assert (avg == 3).all(), avg
    # 1.5 M floats (6 MiB): two chunks, "big/0of2" and "big/1of2".
    n = 3 << 19
    big = (torch.arange(n, dtype=torch.float32) % 1000) * (r + 1)
    got = summa.allreduce(big, name="big")
    assert torch.equal(got, (torch.arange(n, dtype=torch.float32) % 1000) * 3)
    got = summa.allreduce(big.numpy(), name="big")
    assert np.array_equal(got, ((np.arange(n) % 1000) * 3).astype(np.float32))
    model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.fill_(r + 7.0)
        model.bias.fill_(-r - 1.0)
    summa.broadcast_parameters(model, root_rank=0)
    assert (model.weight == 7).all() and (model.bias == -1).all(), model.state_dict()
    summa.shutdown()
    print(f"rank {r}: allreduce ok", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="the build tree (server/summa-server, python/)")
    ap.add_argument("--source", help="the source tree (python/examples)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--server", help=argparse.SUPPRESS)
    ARGS, rest = ap.parse_known_args()
    if ARGS.child:
        import numpy as np  # noqa: E402
        import torch  # noqa: E402
        import summa  # noqa: E402  (from PYTHONPATH, set by the parent)
        allreduce_child(ARGS.server)
        sys.exit(0)
    ARGS.server = os.path.join(ARGS.bin, "server/summa-server")
    ARGS.python_path = os.path.join(ARGS.bin, "python")
    ARGS.lenet = os.path.join(ARGS.source, "python/examples/pytorch_lenet.py")
    ARGS.resnet = os.path.join(ARGS.source, "python/examples/synthetic_resnet.py")
    ARGS.launch = os.path.join(ARGS.source, "scripts/launch.sh")
    sys.path.insert(0, ARGS.python_path)
    import grpc  # noqa: E402
    import numpy as np  # noqa: E402
    import torch  # noqa: E402
    import summa  # noqa: E402
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
