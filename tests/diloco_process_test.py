"""DiLoCo (summa-server --mode=diloco) with the real binaries on 127.0.0.1 (OS-chosen ports), on
the fault tests' small LeNet job (tools/fault_job.py: 8000 examples, batches of 64, 3 epochs):
workers take H local steps with their own Adam and exchange pseudo-gradients. A server killed
between two exchanges (every worker's local steps done, its push not yet sent) and restarted
from its checkpoint loses nothing: the job ends on the undisturbed run's weights, bit for bit,
every example summed once. A worker that joins an elastic DiLoCo job pulls the outer weights and
takes its share of the exchanges from the next one, and every example is still summed once.

  diloco_process_test.py --bin BUILD_DIR [unittest args]
"""
import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from fault_job import Job, JobCases, accuracies, configure  # noqa: E402
from procs import ProcessGroup, wait_until  # noqa: E402

H = 10
# 125 batches an epoch: 13 exchanges (12 of 10 local steps, one of 5), 3 epochs.
EXCHANGES = 3 * 13
EXAMPLES = 3 * 8000
DILOCO = ["--mode=diloco", f"--sync_every={H}"]
INNER = ["--inner_optimizer=adam", "--inner_lr=0.001"]


class DilocoProcessTest(JobCases, unittest.TestCase):
    def diloco_job(self, g, server_flags=(), workers=None):
        return Job(g, 2, [*DILOCO, *server_flags], optimizer=(), workers=workers)

    def undisturbed_diloco(self):
        with ProcessGroup() as g:
            job = self.diloco_job(g)
            for r in range(2):
                job.start_worker(r, *INNER)
            outs = self.finish(g, job)
            status = job.status()
            self.assertEqual(int(status["version"]), EXCHANGES, status)
            self.assertEqual(int(status["examplesApplied"]), EXAMPLES, status)
            return accuracies(outs[0]), job.weights()

    def test_a_server_killed_between_exchanges_and_restarted_loses_nothing(self):
        baseline_acc, baseline_weights = self.undisturbed_diloco()
        self.assertGreater(baseline_acc[-1], 0.5, "DiLoCo learns")
        with ProcessGroup() as g:
            ckpt = os.path.join(g.dir, "ckpt")
            job = self.diloco_job(g, [f"--checkpoint_dir={ckpt}", "--checkpoint_every=1"])
            go = os.path.join(g.dir, "go")
            # Each worker stops after exchange 20's local steps, before its push: the server is
            # killed between two exchanges, with both workers' H steps done and unsent.
            for r in range(2):
                job.start_worker(r, *INNER, f"--fault_pause=20:{go}")
            for w in job.workers.values():
                g.wait_for_log(w, "pausing before the push of step 20", seconds=120)
            wait_until("the checkpoint of version 20",
                       lambda: int(job.status().get("lastCheckpointVersion", 0)) >= 20)
            job.server.send_signal(signal.SIGKILL)
            job.server.wait()
            time.sleep(1)
            job.start_server(job.port)
            self.assertIn(f"restored {ckpt}", g.log(job.server))
            with open(go, "w"):
                pass
            outs = self.finish(g, job)
            status = job.status()
            weights = job.weights()
        for out in outs.values():
            self.assertIn("rejoined at step 20", out)
        self.assertEqual(int(status["version"]), EXCHANGES, status)
        # The restored server's count and the redone exchange's: every example summed once.
        self.assertEqual(int(status["examplesApplied"]), EXAMPLES, status)
        # The workers took exchange 20's steps again from the restored outer weights, their Adam
        # state rewound to where those steps began: the same pseudo-gradients, the same weights.
        self.assertEqual(weights, baseline_weights)
        self.assertEqual(accuracies(outs[0])[-1], baseline_acc[-1])

    def test_a_worker_joins_between_exchanges_and_every_example_is_summed_once(self):
        with ProcessGroup() as g:
            job = self.diloco_job(g, workers="1:2")
            go = os.path.join(g.dir, "go")
            # Rank 0 alone takes whole batches; it waits before exchange 6's push for the joiner.
            logs = [os.path.join(g.dir, f"examples{r}.log") for r in range(2)]
            job.start_worker(0, *INNER, f"--fault_pause=6:{go}", f"--example_log={logs[0]}")
            g.wait_for_log(job.workers[0], "pausing before the push of step 6", seconds=120)
            job.start_worker(1, *INNER, f"--example_log={logs[1]}")
            wait_until("rank 1 admitted", lambda: len(job.status().get("members", [])) == 2)
            with open(go, "w"):
                pass
            outs = self.finish(g, job)
            status = job.status()
            lines = []
            for path in logs:
                with open(path) as f:
                    lines += f.read().splitlines()
        # Admitted from the first exchange no worker can have begun: 7, after the one rank 0
        # holds; it pulled exchange 7's outer weights and took its H steps from them.
        self.assertIn("rank 1 of 2 joined at step 7", outs[1])
        self.assertIn("diloco mode, 10 local steps of adam", outs[1])
        changes = status["groupChanges"]
        self.assertEqual([(int(c.get("fromStep", 0)), c["ranks"]) for c in changes], [(0, [0]), (7, [0, 1])])
        self.assertEqual(int(status["version"]), EXCHANGES, status)
        self.assertEqual(int(status["examplesApplied"]), EXAMPLES, status)
        self.assertEqual(accuracies(outs[0]), accuracies(outs[1]), "both end each epoch on the outer weights")
        # Each local step's shard, from both logs: every epoch's order covered once, each batch
        # by the exchange's group (rank 0 alone before exchange 7, both from it).
        covered = {}
        for line in lines:
            m = re.match(r"step (\d+) batch (\d+) epoch (\d+) rank (\d+) index \d+ of (\d+) group \S+ "
                         r"begin (\d+) end (\d+)", line)
            self.assertIsNotNone(m, line)
            step, batch, epoch, rank, size, begin, end = map(int, m.groups())
            self.assertEqual(size, 1 if step < 7 else 2, line)
            self.assertEqual(batch // H, step % 13, line)
            covered.setdefault(epoch, []).append((begin, end))
        self.assertEqual(sorted(covered), [0, 1, 2])
        for epoch, ranges in covered.items():
            ranges.sort()
            self.assertEqual(ranges[0][0], 0, epoch)
            self.assertEqual(ranges[-1][1], 8000, epoch)
            for (_, end), (begin, _) in zip(ranges, ranges[1:]):
                self.assertEqual(end, begin, f"epoch {epoch}: a gap or an overlap at {end}")
        self.assertGreater(accuracies(outs[0])[-1], 0.5)


if __name__ == "__main__":
    rest = configure(sys.argv[1:])
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
