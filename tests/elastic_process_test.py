"""Elastic jobs with real processes (summa-server --workers=MIN:MAX): a worker joins a running job
with --rank=-1 and another is killed under shrink; the job's group log names the group of every
step, the workers' --example_log shows that each epoch's examples were each covered once, and
the weights are those of one process replaying the same splits (a device per rank, summed in
rank order: --fault_replay_groups), bit for bit. A joiner of an async and an ssp job trains to
the end beside the others. With a backup worker (--backup_workers=1) the steps go on without a
stopped worker, which skips ahead when it comes back, and the weights are those of one process
replaying the pushes summed (--fault_replay_summed), bit for bit.

Run: elastic_process_test.py --bin BUILD_DIR [unittest args]"""
import os
import re
import signal
import sys
import unittest
import urllib.request

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

    def test_backup_workers_go_on_without_a_stopped_worker_which_then_skips_ahead(self):
        # Three workers, one backup: each step is summed from the first two pushes. One epoch of
        # 40 steps of 48 examples, 16 a rank. So that the ranks summed are known (not a race):
        # rank 2 is held before its first push, so steps 0-14 are ranks 0 and 1's; rank 1 is held
        # before its push of step 15 and SIGSTOPped, and rank 2, released, pushes step 0 late,
        # skips to 15 and sums steps 15-39 with rank 0 while rank 1 is stopped; rank 0 and 2 then
        # wait in the epoch's loss round for rank 1, whose push of step 15 comes late, and which
        # skips to the end. Which pushes each step summed follows from that alone.
        examples, batch, paused_at = 1920, 48, 15
        steps, shard = examples // batch, batch // 3
        small = [f"--train_limit={examples}", f"--batch_size={batch}", "--epochs=1"]
        server = ["--deterministic", "--partition_bytes=65536"]
        with ProcessGroup() as g:
            metrics_port = os.path.join(g.dir, "metrics.port")
            job = Job(g, 3, ["--backup_workers=1", *server, "--metrics_address=127.0.0.1:0",
                             f"--metrics_port_file={metrics_port}"])
            held, stopped = os.path.join(g.dir, "held"), os.path.join(g.dir, "stopped")
            job.start_worker(0, *small)
            job.start_worker(1, *small, f"--fault_pause={paused_at}:{stopped}")
            job.start_worker(2, *small, f"--fault_pause=0:{held}")
            g.wait_for_log(job.workers[2], "pausing before the push of step 0", 120)
            g.wait_for_log(job.workers[1], f"pausing before the push of step {paused_at}", 120)
            self.assertEqual(int(job.status()["version"]), paused_at)
            job.workers[1].send_signal(signal.SIGSTOP)
            open(held, "w").close()

            def member(rank):
                return {int(m.get("rank", 0)): m for m in job.status()["members"]}[rank]

            # Steps go on while rank 1 is stopped (its lease lapses; under wait it stays a member).
            job.wait_version(steps)
            wait_until("rank 1's lease to lapse", lambda: member(1)["state"] == "lapsed")
            self.assertIsNone(job.workers[1].poll())
            open(stopped, "w").close()
            job.workers[1].send_signal(signal.SIGCONT)
            outs = self.finish(g, job)
            self.assertIn(f"rank 2: its push of step 0 came late (the step completed without it; --backup_workers) "
                          f"and the job is at step {paused_at}: skipping {paused_at - 1} steps", outs[2])
            self.assertIn(f"rank 1: its push of step {paused_at} came late (the step completed without it; "
                          f"--backup_workers) and the job is at step {steps}: skipping {steps - paused_at - 1} steps",
                          outs[1])
            self.assertNotIn("came late", outs[0])
            self.assertIn("sync mode, 1 backup worker", outs[0])
            status = job.status()
            parts = int(status["partitionCount"])
            self.assertGreater(parts, 1)
            self.assertEqual(int(status["version"]), steps)
            self.assertEqual(int(status["backupWorkers"]), 1)
            members = {int(m.get("rank", 0)): m for m in status["members"]}
            # One late push a partition for each held rank, none for rank 0.
            late = {r: int(members[r].get("latePushes", 0)) for r in range(3)}
            self.assertEqual(late, {0: 0, 1: parts, 2: parts})
            self.assertEqual(int(status["latePushes"]), 2 * parts)
            self.assertEqual(int(members[1].get("stepsBehind", 0)), steps - paused_at)
            self.assertEqual(int(members[2].get("stepsBehind", 0)), 0)  # its last push was on time
            self.assertGreater(float(members[1].get("lastPushDelaySeconds", 0)), 0)
            # Every step summed two shards: the examples applied are those of the pushes summed.
            self.assertEqual(int(status["examplesApplied"]), steps * 2 * shard)
            weights = job.weights()
            # The same per member in the metrics (refreshed every tick of the server's).
            port = int(g.wait_for_file(metrics_port, job.server))
            want = {f'summa_server_member_late_pushes_total{{rank="{r}"}}': late[r] for r in range(3)}
            want['summa_server_member_steps_behind{rank="1"}'] = steps - paused_at
            want["summa_server_late_pushes_total"] = 2 * parts

            def scraped():
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    lines = dict(line.rsplit(" ", 1) for line in r.read().decode().splitlines()
                                 if line and not line.startswith("#"))
                return {name: float(lines.get(name, "nan")) for name in want}

            wait_until("the late pushes in the metrics", lambda: scraped() == want, 10)

        # One process replays the pushes summed: a device per rank of a 3-way split of each
        # batch, of which only ranks 0 and 1 (steps 0-14) and 0 and 2 (from 15) are summed, in
        # rank order as --deterministic sums them. The same weights, bit for bit.
        with ProcessGroup() as g:
            job = Job(g, 1, server)
            job.start_worker(0, *small, "--devices=cpu,cpu,cpu", "--fault_replay_groups=0:3",
                             f"--fault_replay_summed=0:0+1,{paused_at}:0+2")
            self.finish(g, job)
            self.assertEqual(int(job.status()["examplesApplied"]), steps * 2 * shard)
            self.assertEqual(job.weights(), weights)

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
