"""Tokens scoped to a rank, and rotated, with the real binaries: a summa-server whose --token_file
lists a token for each rank, and two summa-workers each with its own rank's token, train a short
job to the end (over the socket data plane, whose hellos carry the tokens); a worker started with
rank 0's token as rank 1 is refused, its exit status and message naming both ranks, while the
job's workers go on. Then a rotation: the server's token file is replaced mid-job, then (once the
server has read it) the workers' files; the workers send the new tokens from then on and finish
the job, and once --token_grace_period has passed a client with an old token is refused.

  token_process_test.py --bin BUILD_DIR [unittest args]
"""
import argparse
import os
import secrets
import sys
import time
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from grpc_reflect import Reflector  # noqa: E402
from procs import ProcessGroup, wait_until  # noqa: E402

ARGS = None

# 4000 examples in batches of 64: 63 steps an epoch.
JOB = ["--batch_size=64", "--train_limit=4000", "--test_limit=500", "--seed=1", "--device=cpu"]
STEPS_PER_EPOCH = 63


def write(path, text):
    """Writes `path` aside and renames it in, as a rotated Kubernetes secret is (never half a file)."""
    with open(path + ".new", "w") as f:
        f.write(text)
    os.replace(path + ".new", path)
    return path


class TokenProcessTest(unittest.TestCase):
    def start_job(self, g, tokens, epochs, delay_ms, *server_flags):
        """A server whose --token_file lists a bare token and tokens[r] for rank r, and a worker per
        rank with its own token's file; rank 0 holds each push back `delay_ms` (sync: both wait),
        so that the job lasts while the test acts on it."""
        lines = ["# the job's: operators, shard coordination", secrets.token_hex(16)]
        lines += [f"{t} rank={r}" for r, t in enumerate(tokens)]
        server_tokens = write(os.path.join(g.dir, "server.tokens"), "\n".join(lines) + "\n")
        server, port = g.start_server(ARGS.server, "--workers=2", "--optimizer=adam", "--lr=0.001",
                                      f"--token_file={server_tokens}", "--data_address=127.0.0.1:0",
                                      *server_flags)
        workers = []
        for r, t in enumerate(tokens):
            token_file = write(os.path.join(g.dir, f"worker{r}.token"), t + "\n")
            workers.append(g.start(f"worker{r}", [
                ARGS.worker, f"--server=127.0.0.1:{port}", f"--rank={r}", "--world_size=2",
                f"--token_file={token_file}", f"--epochs={epochs}", "--progress=never",
                f"--fault_delay_push={delay_ms if r == 0 else 0}ms", *JOB]))
        return server, port, server_tokens, workers

    def version(self, port):
        return int(Reflector(f"127.0.0.1:{port}").call("summa.v1.ParameterServer/GetStatus").get("version", 0))

    def test_each_worker_trains_with_its_ranks_token_and_another_ranks_token_is_refused(self):
        with ProcessGroup() as g:
            tokens = [secrets.token_hex(16) for _ in range(2)]
            # 3 epochs at 60 ms a step: about 11 s, past the intruder's start.
            server, port, _, workers = self.start_job(g, tokens, 3, 60)
            wait_until("the job's fifth step", lambda: self.version(port) >= 5, 120)
            # Rank 0's token, started as rank 1: its Join would fence rank 1's process.
            intruder_token = write(os.path.join(g.dir, "intruder.token"), tokens[0] + "\n")
            intruder = g.start("intruder", [
                ARGS.worker, f"--server=127.0.0.1:{port}", "--rank=1", "--world_size=2",
                f"--token_file={intruder_token}", "--epochs=1", *JOB])
            self.assertEqual(g.wait(intruder, 120), 1, g.log(intruder))
            for proc in workers:
                self.assertIsNone(proc.poll(), f"{proc.name} stopped while the intruder was refused:\n{g.log(proc)}")
            log = g.log(intruder)
            self.assertIn("PERMISSION_DENIED", log)
            self.assertIn("this token is rank 0's (--token_file); it cannot act as rank 1", log)
            # The job's workers were never disturbed: each joined once and trains to the end.
            for r, proc in enumerate(workers):
                self.assertEqual(g.wait(proc, 300), 0, g.log(proc))
                self.assertIn("epoch 3", g.log(proc))
            status = Reflector(f"127.0.0.1:{port}").call("summa.v1.ParameterServer/GetStatus")
            self.assertEqual(int(status["version"]), 3 * STEPS_PER_EPOCH, status)
            self.assertEqual([m["joins"] for m in status["members"]], [1, 1], status)
            self.assertIn("the data path goes over the socket data plane", g.log(workers[0]))

    def test_rotated_token_files_mid_job_and_the_old_tokens_refused_after_the_grace_period(self):
        grace = 8  # seconds: more than a client's 5 s between reads of its token file
        with ProcessGroup() as g:
            old = [secrets.token_hex(16) for _ in range(2)]
            new = [secrets.token_hex(16) for _ in range(2)]
            # 5 epochs at 80 ms a step: about 25 s, past the rotation and its grace period.
            server, port, server_tokens, workers = self.start_job(g, old, 5, 80, f"--token_grace_period={grace}s")
            wait_until("the job's fifth step", lambda: self.version(port) >= 5, 120)
            # The server's file first: the new tokens in, the old ones out (accepted for the grace
            # period); once the server has read it, the workers' files.
            write(server_tokens, "# rotated\n" + "".join(f"{t} rank={r}\n" for r, t in enumerate(new)))
            g.wait_for_log(server, "token files reloaded", 30)
            reloaded = time.monotonic()
            for r, t in enumerate(new):
                write(os.path.join(g.dir, f"worker{r}.token"), t + "\n")
            for proc in workers:
                g.wait_for_log(proc, "changed: calls carry its new token from now on", 30)
            # Past the grace period (counted from the reload, which came before `reloaded`), the
            # old tokens are refused while the job still runs on the new ones.
            time.sleep(max(0, reloaded + grace + 1 - time.monotonic()))
            heartbeat, HeartbeatRequest = Reflector(f"127.0.0.1:{port}").rpc("summa.v1.ParameterServer/Heartbeat")
            with self.assertRaises(grpc.RpcError) as refused:
                heartbeat(HeartbeatRequest(rank=0), timeout=10, metadata=(("authorization", f"Bearer {old[0]}"),))
            self.assertEqual(refused.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn("grace period (--token_grace_period) is over", refused.exception.details())
            # The new token passes (the heartbeat, without rank 0's session, is the core's to refuse).
            with self.assertRaises(grpc.RpcError) as passed:
                heartbeat(HeartbeatRequest(rank=0), timeout=10, metadata=(("authorization", f"Bearer {new[0]}"),))
            self.assertNotIn(passed.exception.code(),
                             (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED),
                             passed.exception.details())
            self.assertLess(self.version(port), 5 * STEPS_PER_EPOCH, "the job ended before the grace period did")
            for proc in workers:
                self.assertEqual(g.wait(proc, 300), 0, g.log(proc))
                self.assertIn("epoch 5", g.log(proc))
            self.assertEqual(self.version(port), 5 * STEPS_PER_EPOCH)
            self.assertNotIn(old[0], g.log(server))  # no token's value in a log
            self.assertNotIn(new[0], g.log(server))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.server = os.path.join(ARGS.bin, "server", "summa-server")
    ARGS.worker = os.path.join(ARGS.bin, "worker", "summa-worker")
    unittest.main(argv=[sys.argv[0], *rest])
