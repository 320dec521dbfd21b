"""Elastic jobs with real processes (summa-server --workers=MIN:MAX): a worker joins a running job
with --rank=-1 and another is killed under shrink; the job's group log names the group of every
step, the workers' --example_log shows that each epoch's examples were each covered once, and
the weights are those of one process replaying the same splits (a device per rank, summed in
rank order: --fault_replay_groups), bit for bit. A joiner of an async and an ssp job trains to
the end beside the others.

Run: elastic_process_test.py --bin BUILD_DIR [unittest args]"""
import os
import re
import signal
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from fault_job import Job, JobCases, configure  # noqa: E402
from procs import ProcessGroup, wait_until  # noqa: E402

# Two epochs of 3840 examples in batches of 64: 60 steps an epoch.
EXAMPLES, BATCH, EPOCHS = 3840, 64, 2
SMALL = [f"--train_limit={EXAMPLES}", f"--batch_size={BATCH}", f"--epochs={EPOCHS}"]
STEPS_PER_EPOCH = EXAMPLES // BATCH
STEPS = EPOCHS * STEPS_PER_EPOCH


def group_log(status):
    """[(from_step, [ranks])], oldest first, from GetStatus."""
    return [(int(c.get("fromStep", 0)), [int(r) for r in c.get("ranks", [])]) for c in status["groupChanges"]]


def group_at(log, step):
    group = None
    for from_step, ranks in log:
        if from_step <= step:
            group = ranks
    return group


def example_lines(path):
    """{(step, rank): (index, size, group, begin, end)} from one worker's --example_log; the
    last attempt at a step wins (a step started again is written again)."""
    out = {}
    if not os.path.exists(path):
        return out
    pattern = re.compile(r"step (\d+) epoch (\d+) rank (\d+) index (\d+) of (\d+) group ([\d,]+) begin (\d+) end (\d+)")
    with open(path) as f:
        for line in f:
            m = pattern.match(line)
            assert m, line
            step, _, rank, index, size, group, begin, end = m.groups()
            out[(int(step), int(rank))] = (int(index), int(size), [int(r) for r in group.split(",")],
                                           int(begin), int(end))
    return out


class ElasticProcessTest(JobCases, unittest.TestCase):
    def test_a_worker_joins_and_one_is_killed_and_every_example_is_seen_once(self):
        with ProcessGroup() as g:
            job = Job(g, 2, ["--workers=2:3", "--on_worker_loss=shrink", "--deterministic"])
            go, never = os.path.join(g.dir, "go"), os.path.join(g.dir, "never")
            logs = {}

            def start(rank, key, *extra):
                logs[key] = os.path.join(g.dir, f"examples-{key}.log")
                job.start_worker(rank, *SMALL, f"--example_log={logs[key]}", *extra)
                job.workers[key] = job.workers.pop(rank)

            # Ranks 0 and 1 stop before step 20 until the joiner is in; rank 1 stops again before
            # step 40, and is killed there.
            start(0, 0, f"--fault_pause=20:{go}")
            start(1, 1, f"--fault_pause=20:{go},40:{never}")
            for key in (0, 1):
                g.wait_for_log(job.workers[key], "pausing before the push of step 20", 120)
            start(-1, "joiner")

            def admitted():
                members = {int(m.get("rank", 0)): m for m in job.status()["members"]}
                return int(members[2].get("fromStep", 0)) if 2 in members else 0

            # Step 20 may be under way over {0, 1} (nobody pushed it, but both may have computed
            # it): the joiner is in from step 21.
            self.assertEqual(wait_until("the joiner's admission", admitted), 21)
            open(go, "w").close()
            g.wait_for_log(job.workers[1], "pausing before the push of step 40", 120)

            def pushed_step_40():  # one partition: a member's pushes are its steps
                members = {int(m.get("rank", 0)): m for m in job.status()["members"]}
                return int(members[0].get("pushes", 0)) >= 41 and int(members[2].get("pushes", 0)) >= 40 - 21 + 1

            # Ranks 0 and 2 have pushed step 40 when rank 1 is lost: the step starts again.
            wait_until("ranks 0 and 2's pushes of step 40", pushed_step_40)
            job.workers[1].send_signal(signal.SIGKILL)
            job.workers[1].wait()
            for key in (0, "joiner"):
                self.assertEqual(g.wait(job.workers[key], 240), 0, g.log(job.workers[key]))
            self.assertIn("rank 2 of 2 joined at step 21", g.log(job.workers["joiner"]))
            self.assertIn("the group changed under a step it had pushed (a member left during it)", g.log(job.workers[0]))
            status = job.status()
            self.assertEqual(int(status["version"]), STEPS)
            self.assertEqual(int(status["minWorkers"]), 2)
            self.assertEqual(int(status["worldSize"]), 3)
            # 2 -> 3 -> 2: the joiner from its step boundary; rank 1 out from the step it was lost
            # before, which started again over ranks 0 and 2 when its lease lapsed.
            log = group_log(status)
            self.assertEqual(log, [(0, [0, 1]), (21, [0, 1, 2]), (40, [0, 2])])
            self.assertGreaterEqual(int(status["stepsRestarted"]), 1)
            # Every step's whole batch was summed once: none of rank 1's shard of step 40 lost.
            self.assertEqual(int(status["examplesApplied"]), EXAMPLES * EPOCHS)
            elastic_weights = job.weights()

        # Each step's shards, from the ranks of its group: every worker split the batch over
            # exactly the group the server summed, so each example of each epoch is covered once.
            lines = {}
            for path in logs.values():
                lines.update(example_lines(path))
            for epoch in range(EPOCHS):
                covered = []
                for step in range(epoch * STEPS_PER_EPOCH, (epoch + 1) * STEPS_PER_EPOCH):
                    group = group_at(log, step)
                    for index, rank in enumerate(group):
                        self.assertIn((step, rank), lines, f"rank {rank} wrote no line for step {step}")
                        i, size, split_over, begin, end = lines[(step, rank)]
                        self.assertEqual((i, size, split_over), (index, len(group), group), (step, rank))
                        covered.extend(range(begin, end))
                self.assertEqual(sorted(covered), list(range(EXAMPLES)), f"epoch {epoch}")

        # One process replays the same splits: a device per rank of each step's group, their
        # gradients summed in rank order (as --deterministic sums the ranks'), each step divided
        # by the whole batch. The same weights, bit for bit.
        replay = ",".join(f"{from_step}:{len(ranks)}" for from_step, ranks in log)
        with ProcessGroup() as g:
            job = Job(g, 1, ["--deterministic"])
            job.start_worker(0, *SMALL, "--devices=cpu,cpu,cpu", f"--fault_replay_groups={replay}")
            self.finish(g, job)
            self.assertEqual(job.weights(), elastic_weights)

    def test_a_joiner_of_an_async_or_ssp_job_trains_beside_the_others(self):
        for mode in (["--mode=async"], ["--mode=ssp", "--staleness=2"]):
            with ProcessGroup() as g:
                job = Job(g, 2, ["--workers=2:3", *mode])
                go = os.path.join(g.dir, "go")
                for r in range(2):
                    job.start_worker(r, *SMALL, f"--fault_pause=20:{go}")
                for r in range(2):
                    g.wait_for_log(job.workers[r], "pausing before the push of step 20", 120)
                job.start_worker(-1, *SMALL)
                wait_until("the joiner", lambda: len(job.status()["members"]) == 3)
                open(go, "w").close()
                outs = self.finish(g, job)
                # Where the slowest member was: both stopped before their step 20.
                self.assertIn("rank 2 of 2 joined at step 20", outs[-1], mode)
                members = {int(m.get("rank", 0)): m for m in job.status()["members"]}
                self.assertEqual(sorted(members), [0, 1, 2], mode)
                self.assertEqual(int(members[2]["pushes"]), STEPS - 20, mode)
                self.assertEqual([m["state"] for m in members.values()], ["left"] * 3, mode)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], *configure(sys.argv[1:])])
