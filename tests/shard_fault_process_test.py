"""Fault tests with real processes on server shards: the harness (tools/fault_job.py) starts two
summa-server shards (shard 1 following shard 0) and their summa-workers on 127.0.0.1, and checks
that the shards give one server's weights bit for bit whatever order pushes arrive in, that a
shard restored from an older checkpoint rolls the other back to its version (the job ending with
an undisturbed run's weights), that a job restarted on 4 shards and then on one server from the
checkpoints of the shards before ends with the weights of a run never stopped, and that the
shards follow shard 0's view when a worker is SIGKILLed. The faults of one server's jobs are in
fault_process_test.py.

  shard_fault_process_test.py --bin BUILD_DIR [unittest args]
"""
import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from fault_job import STEPS, Job, JobCases, configure  # noqa: E402
from grpc_reflect import Reflector  # noqa: E402
from procs import ProcessGroup  # noqa: E402


class ShardFaultProcessTest(JobCases, unittest.TestCase):
    def test_two_shards_give_the_weights_of_one_server_whatever_order_pushes_arrive_in(self):
        # LeNet in 8 partitions of at most 64 KiB, --deterministic, three workers: one server,
        # then two shards (4 partitions each, by bytes) with rank 0's pushes arriving last, then
        # with rank 2's. Each partition's sum and step are the same arithmetic wherever it is
        # held: the weights agree bit for bit.
        def run(shards, late_rank):
            with ProcessGroup() as g:
                job = Job(g, 3, server_flags=("--deterministic", "--partition_bytes=65536"), shards=shards)
                outs = self.thirty_steps_one_late(g, job, late_rank)
                self.assertIn("epoch 1/1", outs[0])
                counts = []
                for i, port in enumerate(job.ports):
                    status = Reflector(f"127.0.0.1:{port}", timeout=5).call("summa.v1.ParameterServer/GetStatus")
                    self.assertEqual(int(status.get("version", 0)), 30)
                    self.assertEqual((int(status.get("shard", 0)), int(status.get("shards", 0))), (i, shards))
                    counts.append(int(status.get("partitionCount", 0)))
                self.assertEqual(counts, [8] if shards == 1 else [4, 4])
                return job.weights()

        one = run(1, late_rank=0)
        self.assertEqual(len(one), 129068 * 4)
        self.assertEqual(run(2, late_rank=0), one)
        self.assertEqual(run(2, late_rank=2), one)

    def test_shard_killed_and_restored_from_an_older_checkpoint_rolls_the_other_back(self):
        # Two shards, two workers, sync under `wait`, a checkpoint every 5 steps (every shard
        # writes the same versions). Both workers are frozen mid-epoch, shard 1 is SIGKILLed and
        # its newest checkpoints lost, so that it restarts 10 or more steps behind shard 0. The
        # workers rejoin, find the shards apart, and roll shard 0 back to the version shard 1
        # restored (a version both keep); the steps are redone and the job ends with an
        # undisturbed run's weights, bit for bit.
        flags = ["--partition_bytes=65536"]
        _, baseline_weights = self.undisturbed(flags, shards=2)
        with ProcessGroup() as g:
            ckpt = os.path.join(g.dir, "ckpt")
            job = Job(g, 2, [*flags, f"--checkpoint_dir={ckpt}", "--checkpoint_every=5", "--keep_checkpoints=20",
                             "--lease=60s"], shards=2)
            job.start_and_freeze(150)
            try:
                dirs = [os.path.join(ckpt, f"shard-{i}-of-2") for i in range(2)]

                def versions(d):
                    return sorted(int(f[5:17]) for f in os.listdir(d) if f.startswith("ckpt-") and f.endswith(".summa"))

                # The shards write the multiples of 5 they reach: wait for the frozen ones.
                deadline = time.monotonic() + 30
                while True:
                    at = [int(job.shard_status(i).get("version", 0)) for i in range(2)]
                    kept = [versions(d) for d in dirs]
                    if all(k and k[-1] == v - v % 5 for k, v in zip(kept, at)):
                        break
                    self.assertLess(time.monotonic(), deadline, f"shards at {at} keep {kept}")
                    time.sleep(0.05)
                common = sorted(set(kept[0]) & set(kept[1]))
                self.assertGreaterEqual(len(common), 3, kept)
                older = common[-3]  # at least 10 steps behind shard 0
                job.shards[1].send_signal(signal.SIGKILL)
                job.shards[1].wait()
                for v in kept[1]:
                    if v > older:
                        os.remove(os.path.join(dirs[1], "ckpt-%012d.summa" % v))
                job.restart_shard(1)
                self.assertIn(f"at version {older}", g.log(job.shards[1]))
            finally:
                job.thaw()
            outs = self.finish(g, job)
            for out in outs.values():
                rejoined = [int(s) for s in re.findall(r"rejoined at step (\d+) ", out)]
                self.assertTrue(rejoined, out)
                self.assertEqual(set(rejoined), {older}, out)
            zero, one = job.shard_status(0), job.shard_status(1)
            self.assertEqual((int(zero["version"]), int(one["version"])), (STEPS, STEPS))
            self.assertEqual((int(zero.get("rollbacks", 0)), int(zero.get("lastRollbackVersion", 0))), (1, older))
            self.assertEqual(int(one.get("rollbacks", 0)), 0)
            rolled = [int(v) for v in re.findall(rf"rolled back from version (\d+) to version {older} ", g.log(job.shards[0]))]
            self.assertEqual(len(rolled), 1, g.log(job.shards[0]))
            self.assertGreaterEqual(rolled[0], older + 10)
            self.assertEqual(job.weights(), baseline_weights)

    def test_a_job_restarted_on_other_shard_counts_ends_with_the_weights_of_one_never_stopped(self):
        # LeNet in 8 partitions of at most 64 KiB, two workers, a checkpoint every 25 steps. The
        # job runs on 2 shards past version 100 and stops (workers SIGKILLed, shards SIGTERMed:
        # each writes a last checkpoint); it starts again on 4 shards, each taking its 2
        # partitions, Adam's state with them, from the newest version both old shards keep; past
        # version 220 it stops again and ends on one server, which takes all 8 from the 4 shards'
        # files. The weights are those of a run on 2 shards that never stopped, bit for bit.
        _, baseline_weights = self.undisturbed(["--partition_bytes=65536"], shards=2)
        with ProcessGroup() as g:
            ckpt = os.path.join(g.dir, "ckpt")
            flags = ["--partition_bytes=65536", f"--checkpoint_dir={ckpt}", "--checkpoint_every=25"]

            def versions(shards):
                dirs = [ckpt] if shards == 1 else [os.path.join(ckpt, f"shard-{i}-of-{shards}") for i in range(shards)]
                return [{int(f[5:17]) for f in os.listdir(d) if f.startswith("ckpt-") and f.endswith(".summa")}
                        for d in dirs]

            def start(shards, label):
                job = Job(g, 2, flags, shards=shards, label=label)
                for r in range(2):
                    job.start_worker(r)
                return job

            def stop(job):
                for w in job.workers.values():
                    w.send_signal(signal.SIGKILL)
                    w.wait()
                for s in job.servers():
                    s.send_signal(signal.SIGTERM)
                for s in job.servers():
                    self.assertEqual(g.wait(s, 60), 0, g.log(s))

            def restored(job, old_shards):
                # Every new server restored the newest version every old shard keeps, and wrote
                # it as its own checkpoint at once; the workers joined at it.
                common = max(set.intersection(*versions(old_shards)))
                for s in job.servers():
                    log = g.log(s)
                    self.assertIn(f"restored version {common} from the checkpoints of {old_shards} shards", log)
                    self.assertRegex(log, rf"checkpoint at version {common} written to {re.escape(ckpt)}")
                for rank, w in job.workers.items():
                    self.assertIn(f"rank {rank} of 2 joined at step {common} ", g.log(w))
                return common

            two = start(2, "two-")
            two.wait_version(100)
            stop(two)
            four = start(4, "four-")
            four.wait_version(220)
            stop(four)
            # A last checkpoint at SIGTERM may be some shards' only (a worker killed mid-step
            # leaves partitions between versions): the newest multiple of 25 all keep is used.
            at_four = restored(four, 2)
            self.assertGreater(at_four, 0)
            one = start(1, "one-")
            outs = self.finish(g, one)
            self.assertGreater(restored(one, 4), at_four)
            self.assertIn("epoch 3/3", outs[0])
            status = one.status()
            self.assertEqual((int(status["version"]), int(status["partitionCount"])), (STEPS, 8))
            self.assertEqual(one.weights(), baseline_weights)

    def test_shards_follow_shard_zeros_view_and_shard_zero_shows_every_shard(self):
        # Two shards under shrink, two workers; rank 1 is SIGKILLed mid-run. Shard 0 drops it
        # when its lease lapses; shard 1 leaves that to shard 0 and drops it when shard 0's view
        # says so. Rank 0 finishes alone; shard 0's status shows both shards, healthy, 4
        # partitions each.
        with ProcessGroup() as g:
            job = Job(g, 2, ["--partition_bytes=65536", "--on_worker_loss=shrink"], shards=2)
            job.start_worker(0)
            job.start_worker(1)
            job.wait_version(60)
            job.workers[1].send_signal(signal.SIGKILL)
            job.workers[1].wait()
            self.assertEqual(g.wait(job.workers[0], 240), 0, g.log(job.workers[0]))
            zero, one = job.shard_status(0), job.shard_status(1)
            self.assertEqual((int(zero["version"]), int(one["version"])), (STEPS, STEPS))
            self.assertEqual(int(zero.get("view", 0)), 2, "rank 1 dropped, then rank 0 left")
            deadline = time.monotonic() + 20
            while int(one.get("view", 0)) != 2:  # shard 1 reports every half second
                self.assertLess(time.monotonic(), deadline, one)
                time.sleep(0.1)
                one = job.shard_status(1)
            states = {int(m.get("rank", 0)): m["state"] for m in one["members"]}
            self.assertEqual(states[1], "dropped")
            log = g.log(job.shards[1])
            self.assertIn("rank 1 is out of the group in shard 0's view 1; dropping it here too", log)
            self.assertNotIn("dropping it and going on without it", log)
            while True:  # shard 1's report of the last step reaches shard 0 within half a second
                shards = job.shard_status(0)["shardStatuses"]
                if len(shards) == 2 and int(shards[1].get("version", 0)) == STEPS:
                    break
                self.assertLess(time.monotonic(), deadline, shards)
                time.sleep(0.1)
            self.assertEqual([int(s.get("shard", 0)) for s in shards], [0, 1])
            self.assertTrue(all(s.get("healthy") for s in shards), shards)
            self.assertEqual([int(s["partitionCount"]) for s in shards], [4, 4])
            self.assertEqual(sum(int(s["partitionBytesHeld"]) for s in shards), 129068 * 4)
            self.assertEqual([int(s["version"]) for s in shards], [STEPS, STEPS])


if __name__ == "__main__":
    rest = configure(sys.argv[1:])
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
