"""summa-worker --overlap with real processes (the harness of tools/fault_job.py): LeNet cut into
8 partitions of 64 KiB, so that each step's pushes go partition by partition during backward and
the next forward waits per layer. Overlapped, blocking and mixed jobs end with the same weights, bit
for bit, and an overlapped job whose server is killed and restarted from its checkpoint ends with
the undisturbed run's.

  overlap_process_test.py --bin BUILD_DIR [unittest args]
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from fault_job import STEPS, Job, JobCases, accuracies, configure  # noqa: E402
from procs import ProcessGroup  # noqa: E402

SMALL_PARTITIONS = ["--partition_bytes=65536"]  # LeNet's 129068 floats: 8 partitions


class OverlapProcessTest(JobCases, unittest.TestCase):
    def job(self, overlap):
        """A job of two workers, rank r with --overlap=overlap[r]; their logs and the weights."""
        with ProcessGroup() as g:
            job = Job(g, 2, SMALL_PARTITIONS)
            for r in range(2):
                job.start_worker(r, "--overlap=%s" % ("true" if overlap[r] else "false"))
            outs = self.finish(g, job)
            status = job.status()
            self.assertEqual(int(status["partitionCount"]), 8)
            self.assertEqual(int(status["version"]), STEPS)
            for r in range(2):
                self.assertEqual("sync mode, overlapped)" in outs[r], overlap[r], outs[r])
            return outs, job.weights()

    def test_overlapped_blocking_and_mixed_workers_end_with_the_same_weights(self):
        _, blocking = self.job((False, False))
        outs, overlapped = self.job((True, True))
        self.assertEqual(overlapped, blocking, "overlapped and blocking jobs differ")
        self.assertGreater(accuracies(outs[0])[-1], 0.5)
        _, mixed = self.job((True, False))
        self.assertEqual(mixed, blocking, "a job of one overlapped and one blocking worker differs")

    def test_server_killed_and_restarted_under_overlap_resumes_bit_for_bit(self):
        # The workers' next forward waits on replies the killed server never sends: the error
        # comes out of a wait mid-forward or at the step's end, the worker rejoins the restarted
        # server and redoes the steps after its checkpoint.
        baseline_acc, baseline_weights = self.undisturbed(SMALL_PARTITIONS)
        with ProcessGroup() as g:
            ckpt = os.path.join(g.dir, "ckpt")
            job = Job(g, 2, [*SMALL_PARTITIONS, f"--checkpoint_dir={ckpt}", "--checkpoint_every=25"])
            for r in range(2):
                job.start_worker(r, "--overlap=true")
            self.assertIn(f"restored {ckpt}", job.restart_server_after_checkpoint(150))
            outs = self.finish(g, job)
            for out in outs.values():
                self.assertIn("overlapped)", out)
                self.assertIn("rejoined at step", out)
            self.assertEqual(int(job.status()["version"]), STEPS)
            self.assertEqual(job.weights(), baseline_weights)
            self.assertEqual(accuracies(outs[0])[-1], baseline_acc[-1])


if __name__ == "__main__":
    rest = configure(sys.argv[1:])
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
