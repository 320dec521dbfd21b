"""Fault tests with real processes on one server: the harness (tools/fault_job.py) starts
summa-server and summa-worker on 127.0.0.1 (OS-chosen ports), kills them with SIGKILL mid-epoch,
restarts them, and checks that training finishes in the accuracy band of an undisturbed run, that
no update is lost or counted twice, and that no process is left behind. The faults of jobs on
server shards are in shard_fault_process_test.py.

  fault_process_test.py --bin BUILD_DIR [unittest args]
"""
import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from fault_job import STEPS, Job, JobCases, accuracies, configure  # noqa: E402
from procs import ProcessGroup, alive  # noqa: E402


class FaultProcessTest(JobCases, unittest.TestCase):
    def test_worker_killed_under_wait_rejoins_and_the_job_matches_an_undisturbed_run(self):
        baseline_acc, baseline_weights = self.undisturbed()
        with ProcessGroup() as g:
            job = Job(g, 2, ["--on_worker_loss=wait", "--rejoin_deadline=60s"])
            for r in range(2):
                job.start_worker(r)
            job.wait_version(100)
            job.workers[1].send_signal(signal.SIGKILL)
            job.workers[1].wait()
            # An explicit event, not a sleep against the 1 s lease: the server marks it lapsed.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                members = {m.get("rank", 0): m for m in job.status()["members"]}
                if members[1]["state"] == "lapsed":
                    break
                time.sleep(0.05)
            self.assertEqual(members[1]["state"], "lapsed", members)
            # Under wait the step waits for the lost worker: no step it has not pushed completes.
            status = job.status()
            pushed = int({m.get("rank", 0): m for m in status["members"]}[1]["pushes"])
            self.assertLessEqual(int(status["version"]), pushed)
            job.start_worker(1)
            outs = self.finish(g, job)
            self.assertRegex(outs[1], r"joined at step [1-9]", "the new process resumed mid-job")
            self.assertEqual(int(job.status()["version"]), STEPS)
            # Every update counted once: the same weights as the undisturbed run, bit for bit.
            self.assertEqual(job.weights(), baseline_weights)
            self.assertEqual(accuracies(outs[0])[-1], baseline_acc[-1])

    def test_worker_killed_under_shrink_leaves_the_rest_to_finish(self):
        with ProcessGroup() as g:
            job = Job(g, 2, ["--on_worker_loss=shrink"])
            for r in range(2):
                job.start_worker(r)
            job.wait_version(100)
            job.workers[1].send_signal(signal.SIGKILL)
            job.workers[1].wait()
            self.assertEqual(g.wait(job.workers[0], 240), 0, g.log(job.workers[0]))
            out = g.log(job.workers[0])
            self.assertIn("1 worker on [cpu]\n", out, "the epoch line names the members left")
            status = job.status()
            members = {m.get("rank", 0): m for m in status["members"]}
            self.assertEqual(members[1]["state"], "dropped", members)
            self.assertEqual(int(status["version"]), STEPS)
            # Every step completed, and every example of every step was summed once: the step
            # under way when rank 1 was lost started again over rank 0 alone, which computed
            # the whole batch of it (its pushes count that step twice: the dropped one and the
            # one summed). Which step that is depends on when the kill lands; so does the
            # accuracy: LeNet at lr 0.5 is chaotic on its first-epoch plateau (a sweep of the
            # drop step over 95..140 ended between 0.097 and 0.763), so none is asserted.
            self.assertEqual(int(status["examplesApplied"]), 64 * STEPS, members)
            # (Rank 0 pushes the step under way long before the 1 s lease lapses, so it restarts
            # one step; each restart is one push more.)
            restarts = int(status.get("stepsRestarted", 0))
            self.assertLessEqual(restarts, 1, status)
            self.assertEqual(int(members[0]["pushes"]), STEPS + restarts)

    def test_server_killed_and_restarted_resumes_from_its_checkpoint(self):
        baseline_acc, baseline_weights = self.undisturbed()
        with ProcessGroup() as g:
            ckpt = os.path.join(g.dir, "ckpt")
            job = Job(g, 2, [f"--checkpoint_dir={ckpt}", "--checkpoint_every=25"])
            for r in range(2):
                job.start_worker(r)
            self.assertIn(f"restored {ckpt}", job.restart_server_after_checkpoint(150))
            outs = self.finish(g, job)
            self.assertIn("rejoined at step", outs[0])
            self.assertEqual(int(job.status()["version"]), STEPS)
            # Nothing lost and nothing applied twice: the steps after the checkpoint are redone
            # on the same shards from the restored weights and Adam state, so the job ends with
            # the undisturbed run's weights, bit for bit.
            self.assertEqual(job.weights(), baseline_weights)
            self.assertEqual(accuracies(outs[0])[-1], baseline_acc[-1])
            self.assertGreater(accuracies(outs[0])[-1], 0.5)

    def test_push_whose_reply_is_cut_is_counted_once(self):
        baseline_acc, baseline_weights = self.undisturbed()
        with ProcessGroup() as g:
            job = Job(g, 2, ["--on_worker_loss=wait", "--rejoin_deadline=60s"])
            job.start_worker(0)
            crashing = job.start_worker(1, "--fault_exit_after_push=100")
            self.assertEqual(g.wait(crashing, 120), 137, g.log(crashing))
            job.start_worker(1)
            self.finish(g, job)
            status = job.status()
            members = {m.get("rank", 0): m for m in status["members"]}
            self.assertEqual(members[1]["joins"], 2, status)
            self.assertEqual(int(status["version"]), STEPS)
            # The push whose reply was cut counted exactly once (whether the restarted worker
            # found its step done or pushed it again and was told ALREADY_EXISTS): the weights
            # equal the undisturbed run's bit for bit. A step counted twice, or lost, differs.
            self.assertEqual(job.weights(), baseline_weights)

    def test_push_pull_whose_reply_is_lost_and_resent_is_counted_once(self):
        # A real retry: at step 100 rank 1 sends its push-pull, drops the reply and sends it
        # again, on each of 8 partitions. Counted once: 8 duplicates, and weights bit for bit
        # those of the undisturbed run (whose layout is one partition: the update is elementwise).
        _, baseline_weights = self.undisturbed()
        with ProcessGroup() as g:
            job = Job(g, 2, ["--partition_bytes=65536"])
            job.start_worker(0)
            job.start_worker(1, "--fault_repeat_pushpull_at=100")
            outs = self.finish(g, job)
            self.assertIn("dropping the reply to the push-pull of step 100", outs[1])
            status = job.status()
            self.assertEqual(int(status["partitionCount"]), 8)
            self.assertEqual(int(status["duplicatePushes"]), 8)
            self.assertEqual(int(status["version"]), STEPS)
            self.assertEqual(job.weights(), baseline_weights)

    def test_compressed_push_resent_after_a_lost_reply_carries_the_same_bytes(self):
        # bf16 on the wire and top-k 5% with error feedback: a resent push must be the bytes of
        # the first (encoding the step again would add its gradient to the residual twice). The
        # weights are bit for bit those of an undisturbed run in the same format, and the server
        # counted exactly the format's bytes.
        flags = ["--wire_dtype=bf16", "--compress=topk:0.05"]
        _, baseline_weights = self.undisturbed(flags)
        with ProcessGroup() as g:
            job = Job(g, 2, flags)
            job.start_worker(0)
            job.start_worker(1, "--fault_repeat_pushpull_at=100")
            outs = self.finish(g, job)
            self.assertIn("dropping the reply to the push-pull of step 100", outs[1])
            self.assertIn("joined at step 0 (model lenet, sync mode, bf16 on the wire, topk:0.05)", outs[0])
            status = job.status()
            self.assertEqual(status["wireDtype"], "bf16")
            self.assertEqual(status["compress"], "topk:0.05")
            self.assertEqual(int(status["duplicatePushes"]), 1)
            self.assertEqual(int(status["version"]), STEPS)
            # LeNet's 129068 values, one partition: k = ceil(0.05 * 129068) = 6454 positions and
            # bf16 values a push (6 bytes each; the duplicate is not counted); each reply is the
            # weights in bf16. Replies: each worker's first pull, one per push-pull, and the
            # resent one's.
            self.assertEqual(int(status["bytesIn"]), 2 * STEPS * 6454 * 6)
            self.assertEqual(int(status["bytesOut"]), (2 * (STEPS + 1) + 1) * 129068 * 2)
            self.assertEqual(job.weights(), baseline_weights)

    def test_server_restored_under_topk_resumes_with_each_workers_residuals(self):
        # bf16 and top-k 5%: both workers are frozen (SIGSTOP) mid-run, the server checkpoints
        # the version they froze at (v) and is killed, and the restarted server restores v. Each
        # worker had encoded step v-1 (which the server has: its residuals stand) or step v (the
        # server lacks it: the encoding is taken back, residuals included, and made again from
        # the gradient recomputed on the restored weights). Either way the job ends with an
        # undisturbed run's weights, bit for bit, and no worker drops its residuals.
        flags = ["--wire_dtype=bf16", "--compress=topk:0.05"]
        _, baseline_weights = self.undisturbed(flags)
        with ProcessGroup() as g:
            ckpt = os.path.join(g.dir, "ckpt")
            # A lease that outlasts the freeze; a checkpoint of every version.
            job = Job(g, 2, [*flags, f"--checkpoint_dir={ckpt}", "--checkpoint_every=1", "--lease=60s"])
            job.start_and_freeze(150)
            try:
                deadline = time.monotonic() + 30
                while True:
                    status = job.status()
                    if int(status.get("lastCheckpointVersion", 0)) == int(status["version"]):
                        break
                    self.assertLess(time.monotonic(), deadline, f"no checkpoint of the frozen version: {status}")
                    time.sleep(0.05)
                frozen_at = int(status["version"])
                job.server.send_signal(signal.SIGKILL)
                job.server.wait()
                time.sleep(1)
                job.start_server(job.port)
                self.assertIn(f"restored {ckpt}", g.log(job.server))
            finally:
                job.thaw()
            outs = self.finish(g, job)
            for out in outs.values():
                # v, or v + 1 where both pushes of step v were on their way as the workers froze.
                rejoined = [int(s) for s in re.findall(r"rejoined at step (\d+) ", out)]
                self.assertEqual(len(rejoined), 1, out)
                self.assertIn(rejoined[0], (frozen_at, frozen_at + 1), out)
                self.assertNotIn("residuals", out)
            self.assertEqual(int(job.status()["version"]), STEPS)
            self.assertEqual(job.weights(), baseline_weights)

    def test_worker_lost_before_the_epoch_end_collective_under_wait_is_waited_for(self):
        # Rank 1 dies after the last push of epoch 1, before the loss collective that rank 0 is
        # already in. Rank 0 waits (not the 10-minute barrier deadline: the test allows 240 s),
        # the restarted rank 1 rejoins at step 125, catches up on that round, and the job ends
        # with the undisturbed run's weights.
        _, baseline_weights = self.undisturbed()
        with ProcessGroup() as g:
            job = Job(g, 2, ["--on_worker_loss=wait", "--rejoin_deadline=60s"])
            job.start_worker(0)
            lost = job.start_worker(1, "--fault_exit_before_epoch_end=0")
            self.assertEqual(g.wait(lost, 120), 137, g.log(lost))
            self.assertIn("exiting before round 0 of 'summa.train.loss'", g.log(lost))
            self.assertEqual(int(job.status()["version"]), 125)
            job.start_worker(1)
            outs = self.finish(g, job)
            self.assertRegex(outs[1], r"joined at step 125 ")
            self.assertEqual(len(accuracies(outs[0])), 3)
            self.assertEqual(int(job.status()["version"]), STEPS)
            self.assertEqual(job.weights(), baseline_weights)

    def test_worker_lost_before_the_epoch_end_collective_under_shrink_is_left_out(self):
        with ProcessGroup() as g:
            job = Job(g, 2, ["--on_worker_loss=shrink"])
            job.start_worker(0)
            lost = job.start_worker(1, "--fault_exit_before_epoch_end=0")
            self.assertEqual(g.wait(lost, 120), 137, g.log(lost))
            self.assertEqual(g.wait(job.workers[0], 240), 0, g.log(job.workers[0]))
            out = g.log(job.workers[0])
            self.assertEqual(len(accuracies(out)), 3)
            self.assertIn("epoch 3/3", out)
            status = job.status()
            members = {m.get("rank", 0): m for m in status["members"]}
            self.assertEqual(members[1]["state"], "dropped", members)
            self.assertEqual(int(status["version"]), STEPS)
            self.assertEqual(int(members[1]["pushes"]), 125)
            self.assertEqual(int(members[0]["pushes"]), STEPS)

    def test_async_and_ssp_workers_train_in_small_partitions(self):
        # LeNet (0.5 MB) cut into partitions of 64 KiB (8 of them): every offset of the flat buffer is
        # exercised. Async and ssp apply each push alone, so each partition takes exactly one
        # update per worker per step.
        for mode in (["--mode=async"], ["--mode=ssp", "--staleness=1"]):
            with self.subTest(mode=mode[0]), ProcessGroup() as g:
                job = Job(g, 2, [*mode, "--partition_bytes=65536"])
                for r in range(2):
                    job.start_worker(r, "--epochs=1")
                outs = self.finish(g, job)
                status = job.status()
                self.assertIn(mode[0][len("--mode="):] + " mode", outs[0])
                self.assertEqual(int(status["partitionCount"]), 8)
                self.assertEqual(int(status["version"]), 2 * 125)
                self.assertEqual(int(status["pushesServed"]), 2 * 125 * 8)
                self.assertEqual(int(status.get("duplicatePushes", 0)), 0)

    def test_sigterm_writes_a_last_checkpoint_that_a_new_server_restores(self):
        with ProcessGroup() as g:
            ckpt = os.path.join(g.dir, "ckpt")
            job = Job(g, 2, [f"--checkpoint_dir={ckpt}", "--checkpoint_every=0", "--partition_bytes=65536"])
            for r in range(2):
                job.start_worker(r)
            job.wait_version(30)
            self.assertEqual(os.listdir(ckpt) if os.path.isdir(ckpt) else [], [], "none before SIGTERM")
            job.server.send_signal(signal.SIGTERM)
            self.assertEqual(g.wait(job.server, 60), 0, g.log(job.server))
            files = sorted(os.listdir(ckpt))
            self.assertEqual(len(files), 1, files)
            saved = int(re.match(r"ckpt-0*(\d+)\.summa", files[0]).group(1))
            self.assertGreaterEqual(saved, 30)
            job.start_server(job.port)
            self.assertIn(f"restored {ckpt}", g.log(job.server))
            self.assertGreaterEqual(int(job.status()["version"]), saved)

    def test_rejoin_deadline_ends_the_job_with_an_error(self):
        with ProcessGroup() as g:
            job = Job(g, 2, ["--on_worker_loss=wait", "--rejoin_deadline=2s"])
            for r in range(2):
                job.start_worker(r)
            job.wait_version(20)
            job.workers[1].send_signal(signal.SIGKILL)
            job.workers[1].wait()
            self.assertEqual(g.wait(job.server, 60), 1, g.log(job.server))
            self.assertIn("did not rejoin within --rejoin_deadline=2s", g.log(job.server))
            code = g.wait(job.workers[0], 60)
            self.assertNotEqual(code, 0, g.log(job.workers[0]))
            self.assertIn("the job has ended", g.log(job.workers[0]))

    def test_deterministic_sums_give_the_same_weights_whatever_order_pushes_arrive_in(self):
        # Three workers (from three on, the order of a sum's additions shows in its last bits),
        # summa-server --deterministic: one run with rank 0's pushes held back 20 ms each, so that
        # they arrive last, one with rank 2's. The weights agree bit for bit.
        def run(late_rank):
            with ProcessGroup() as g:
                job = Job(g, 3, server_flags=("--deterministic",))
                outs = self.thirty_steps_one_late(g, job, late_rank)
                self.assertIn("epoch 1/1", outs[0])
                self.assertEqual(int(job.status().get("version", 0)), 30)
                return job.weights()

        self.assertEqual(run(late_rank=0), run(late_rank=2))

    def test_two_processes_started_as_one_rank_leave_the_later_one_to_finish_the_job(self):
        # Issue 33 item 4: a pod replaced while the old one still runs. The earlier rank 0 joins,
        # defines the model, and gathers the group's devices with rank 1 (both print their join
        # line once that round is complete); it holds its first push until the later rank 0's
        # join fences it (a test-only hook: the order of a race that went wrong 2 tries in 8).
        # The later process joins at step 0 after that round, as a member that comes late to
        # it; it must train at once, not wait on a round no one else will enter while rank 1
        # waits for its push (the job sat at version 0 until the 10-minute barrier deadline).
        _, baseline_weights = self.undisturbed()
        with ProcessGroup() as g:
            job = Job(g, 2)
            earlier = job.start_worker(0, "--fault_hold_push_until_fenced")
            job.start_worker(1)
            g.wait_for_log(earlier, "joined at step 0")
            g.wait_for_log(job.workers[1], "joined at step 0")
            later = job.start_worker(0)
            self.assertEqual(g.wait(earlier, 120), 1, g.log(earlier))
            self.assertIn("FAILED_PRECONDITION", g.log(earlier))
            self.assertIn("rank 0 is held by a newer process", g.log(earlier))
            # Far inside the barrier deadline (10 minutes) that a stranded wait would end at.
            g.wait_for_log(later, "rank 0 of 2 joined at step 0", 60)
            outs = self.finish(g, job)
            self.assertIs(job.workers[0], later)
            # The later process has the group's devices: the round's sum, not "[cpu ...]".
            self.assertRegex(outs[0], r"epoch 3/3: .* 2 workers on \[[^.\]]+, [^.\]]+\]")
            status = job.status()
            members = {m.get("rank", 0): m for m in status["members"]}
            self.assertEqual(members[0]["joins"], 2, status)
            self.assertEqual(int(status["version"]), STEPS)
            # The earlier process pushed nothing that counted: the undisturbed run's weights.
            self.assertEqual(job.weights(), baseline_weights)

    def test_no_process_left_behind(self):
        with ProcessGroup() as g:
            job = Job(g, 1)
            job.start_worker(0, "--epochs=1", "--train_limit=640")
            self.assertEqual(g.wait(job.workers[0], 120), 0)
            pids = [job.server.pid, job.workers[0].pid]
        self.assertFalse([p for p in pids if alive(p)])


if __name__ == "__main__":
    rest = configure(sys.argv[1:])
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
