"""The shared-memory plane with real processes on one host: summa-server with --shm_socket serves
it beside the socket data plane, and summa-workers with --data_plane=shm send the data path's
calls there with their bytes in memory segments shared with the server.

- Over a whole job, through a worker SIGKILLed mid-job (which rejoins) and a server SIGKILLed
  mid-job (restarted from its checkpoint, handing out new segments), the workers on shm end on
  the weights of an undisturbed job on the socket plane, bit for bit; with --deterministic and
  three workers, one of them always last, the same.
- A process of another user cannot open a segment, the server's or a worker's (through
  /proc/PID/fd or /proc/PID/map_files, the only names a memfd has).
- A worker whose host cannot see the socket (another network namespace and another mount of the
  socket's directory: another host, as far as the worker can tell) takes the socket plane under
  --data_plane=auto, beside a worker on the shared-memory plane, and both finish.

  shm_plane_process_test.py --bin BUILD_DIR [unittest args]
"""
import os
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from fault_job import STEPS, Job, JobCases, accuracies, configure  # noqa: E402
import fault_job  # noqa: E402
from procs import ProcessGroup, wait_until  # noqa: E402

SHM_LOG = "the data path goes over the shared-memory plane"
# A worker on the CPU pushes its gradients where they lie (its flat buffer in the values
# segment); one on a GPU (--device=auto where there is one) keeps its pinned host buffer.
VALUES_LOG = "gradients are pushed where they lie, in the shared-memory plane's values segment"
ON_CPU = not os.path.exists("/dev/nvidia0")


def memfds(pid, name):
    """The names under /proc/PID of the memfds called `name` (memfd:NAME) that process `pid`
    holds: its descriptors (fd/N) and its mappings (map_files/RANGE; a segment read or sent once
    keeps no descriptor, only its mapping)."""
    found = []
    for where in ("fd", "map_files"):
        for entry in os.listdir(f"/proc/{pid}/{where}"):
            try:
                target = os.readlink(f"/proc/{pid}/{where}/{entry}")
            except OSError:
                continue
            if target.startswith(f"/memfd:{name}"):
                found.append(f"/proc/{pid}/{where}/{entry}")
    return found


def opens_as(uid, path):
    """Whether a process running as `uid` can open `path` for reading: the child's exit status
    says (0 opened, 13 refused, anything else an error of the test's own)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            fd = os.open(path, os.O_RDONLY)
            os.close(fd)
            os._exit(0)
        except PermissionError:
            os._exit(13)
        except BaseException:  # noqa: BLE001 - reported through the status
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


class ShmPlaneProcessTest(JobCases, unittest.TestCase):
    def shm_job(self, g, world, flags=()):
        return Job(g, world, [f"--shm_socket={os.path.join(g.dir, 'shm.sock')}", *flags])

    def test_workers_on_shm_end_on_the_socket_planes_weights_through_a_killed_worker_and_a_killed_server(self):
        baseline_acc, baseline_weights = self.undisturbed()  # the socket plane
        # A worker SIGKILLed mid-job: whatever it had placed in its segment or sent, the step it
        # was in is summed once, when its new process pushes again.
        with ProcessGroup() as g:
            job = self.shm_job(g, 2, ["--on_worker_loss=wait", "--rejoin_deadline=60s"])
            for r in range(2):
                job.start_worker(r, "--data_plane=shm")
            job.wait_version(100)
            job.workers[1].send_signal(signal.SIGKILL)
            job.workers[1].wait()
            wait_until("rank 1's lease to lapse",
                       lambda: {m.get("rank", 0): m for m in job.status()["members"]}[1]["state"] == "lapsed")
            job.start_worker(1, "--data_plane=shm")
            outs = self.finish(g, job)
            for log in outs.values():
                self.assertIn(SHM_LOG, log)
                if ON_CPU:
                    self.assertIn(VALUES_LOG, log)
            self.assertRegex(outs[1], r"joined at step [1-9]")
            self.assertEqual(int(job.status()["version"]), STEPS)
            self.assertEqual(job.weights(), baseline_weights, "a killed worker on shm changed the job's weights")
            self.assertEqual(accuracies(outs[0])[-1], baseline_acc[-1])
        # The server SIGKILLed mid-job: a new one restores its checkpoint and hands out new
        # segments; the steps after the checkpoint are done again from the same state.
        with ProcessGroup() as g:
            ckpt = os.path.join(g.dir, "ckpt")
            job = self.shm_job(g, 2, [f"--checkpoint_dir={ckpt}", "--checkpoint_every=25"])
            for r in range(2):
                job.start_worker(r, "--data_plane=shm")
            self.assertIn(f"restored {ckpt}", job.restart_server_after_checkpoint(150))
            outs = self.finish(g, job)
            self.assertIn("rejoined at step", outs[0])
            for log in outs.values():
                self.assertIn(SHM_LOG, log)
            self.assertEqual(int(job.status()["version"]), STEPS)
            self.assertEqual(job.weights(), baseline_weights, "a killed server on shm changed the job's weights")

    def test_three_workers_with_deterministic_sums_match_across_planes(self):
        weights = {}
        for plane in ("socket", "shm"):
            with ProcessGroup() as g:
                job = self.shm_job(g, 3, ["--deterministic"]) if plane == "shm" else Job(g, 3, ["--deterministic"])
                outs = self.thirty_steps_one_late(g, job, late_rank=0)
                for log in outs.values():
                    self.assertEqual(SHM_LOG in log, plane == "shm", log)
                weights[plane] = job.weights()
        self.assertEqual(weights["shm"], weights["socket"])

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run a process as another user")
    def test_another_users_process_cannot_open_a_segment(self):
        with ProcessGroup() as g:
            job = self.shm_job(g, 1)
            worker = job.start_worker(0, "--data_plane=shm", "--epochs=30")
            wait_until("the worker's segments", lambda: memfds(worker.pid, "summa-requests"))
            job.wait_version(2)
            for pid, name in ((job.server.pid, "summa-replies"), (job.server.pid, "summa-requests"),
                              (job.server.pid, "summa-weights"), (worker.pid, "summa-requests"),
                              (worker.pid, "summa-replies"), (worker.pid, "summa-weights")):
                paths = memfds(pid, name)
                self.assertTrue(paths, f"no {name} segment in process {pid}")
                for path in paths:
                    self.assertEqual(opens_as(0, path), 0, f"root cannot open {path}: the test looks in the wrong place")
                    self.assertEqual(opens_as(65534, path), 13, f"user 65534 opened {path}")

    @unittest.skipUnless(os.geteuid() == 0, "needs root to make a network namespace")
    def test_a_worker_on_another_host_falls_back_to_the_socket_plane(self):
        ns = f"summa-shm-{os.getpid()}"
        host, guest = "198.18.254.1", "198.18.254.2"
        veth = f"sshm{os.getpid() % 100000}"

        def ip(*args):
            subprocess.run(["ip", *args], check=True, capture_output=True)

        try:
            ip("netns", "add", ns)
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("addr", "add", f"{host}/30", "dev", veth)
            ip("link", "set", veth, "up")
            ip("-n", ns, "addr", "add", f"{guest}/30", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            with ProcessGroup() as g:
                sock_dir = os.path.join(g.dir, "run")
                os.mkdir(sock_dir)
                port_file = os.path.join(g.dir, "server.port")
                server = g.start("server", [fault_job.ARGS.server, f"--address={host}:0", f"--port_file={port_file}",
                                            "--workers=2", f"--data_address={host}:0",
                                            f"--shm_socket={sock_dir}/shm.sock"])
                port = int(g.wait_for_file(port_file, server))
                job = ["--world_size=2", "--progress=never", "--epochs=1", "--train_limit=640", "--test_limit=100",
                       "--batch_size=64", f"--server={host}:{port}", "--data_plane=auto"]
                near = g.start("near", [fault_job.ARGS.worker, "--rank=0", *job])
                # The far worker's host has no such socket: its own mount of the directory.
                far = g.start("far", ["ip", "netns", "exec", ns, "unshare", "--mount", "sh", "-c",
                                      f'mount -t tmpfs none "$0" && exec "$@"', sock_dir,
                                      fault_job.ARGS.worker, "--rank=1", *job])
                self.assertEqual(g.wait(near, 120), 0, g.log(near))
                self.assertEqual(g.wait(far, 120), 0, g.log(far))
                self.assertIn(SHM_LOG, g.log(near))
                self.assertIn("the data path goes over the socket data plane", g.log(far))
                self.assertIn("shard 0's calls take its socket data plane", g.log(far))
                server.send_signal(signal.SIGTERM)
                self.assertEqual(g.wait(server, 30), 0, g.log(server))
        finally:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["ip", "link", "del", veth], capture_output=True)


if __name__ == "__main__":
    rest = configure(sys.argv[1:])
    unittest.main(argv=[sys.argv[0], *rest])
