"""Summa across an emulated cluster (bench/cluster/lab.py): 3 hosts (a server host and two worker
hosts, network namespaces on a bridge, each link shaped to 200 Mbit/s each way by tbf), a
2-worker synthetic job (summa-worker --synthetic, 4 MiB in 4 partitions, over the socket data
plane) across it ends on the exact expected weights and on the same weights, bit for bit, as the
same job on loopback (the server's --export, tensor by tensor, and the workers' synthetic_result
lines); the links' own counters (/sys/class/net/*/statistics of the switch's ports) show the job's
bytes crossed them. Every process is stopped by PID and every namespace deleted on every path
(the test checks that none is left). Needs root: elsewhere, or where namespaces cannot be made
(a container without CAP_SYS_ADMIN), it says why and exits 77 (skipped); any other error fails.

  cluster_process_test.py --bin BUILD_DIR --source SOURCE_DIR [unittest args]
"""
import argparse
import json
import os
import re
import signal
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from procs import ProcessGroup  # noqa: E402

ARGS = None
LR = 2.0 ** -10  # with gradients r + 1 and 4 examples a step, every weight is exact in float32
MODEL = 4 << 20
PARTITION = 1 << 20
STEPS = 5
WORKERS = 2


def tensors(raw):
    """A safetensors file's tensor entries (without __metadata__, which holds the export's time)
    and its data section."""
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    return header, raw[8 + n:]


def synthetic_result(log):
    """summa-worker --synthetic's last line as a dict of its fields (step_us left out: timings)."""
    lines = [line for line in log.splitlines() if line.startswith("synthetic_result ")]
    assert len(lines) == 1, f"one synthetic_result line expected:\n{log}"
    fields = dict(f.split("=", 1) for f in lines[0].split()[1:])
    fields.pop("step_us")
    fields.pop("median_step_us")
    return fields


def expected_first_weight(world, steps, lr):
    """Weight 0 starts at 0 (worker/synthetic.cc); each step takes lr * sum(r + 1) / P off it, P
    the examples a step pushes (the power of two >= world)."""
    p = 1
    while p < world:
        p *= 2
    return -steps * lr * (world * (world + 1) / 2) / p


def lab_unavailable():
    """Why this machine cannot make the lab's namespaces, or None."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, veth links, tc), and this test runs as uid %d" % os.geteuid()
    probe = f"slab{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        if "Operation not permitted" in made.stderr or "Permission denied" in made.stderr:
            return f"network namespaces cannot be made here: {made.stderr.strip()}"
        raise RuntimeError(f"ip netns add {probe} failed: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], check=True)
    from lab import clean_stale
    for ns in clean_stale():
        print(f"removed {ns}, left by a lab whose process is gone", file=sys.stderr)
    return None


class ClusterProcessTest(unittest.TestCase):
    def run_job(self, g, label, server_host=None, worker_hosts=(None, None)):
        """The job with its server on `server_host` and rank r on worker_hosts[r] (a lab Host, or
        None: this machine's namespace, on 127.0.0.1): the exported weights' bytes and each
        worker's synthetic_result fields."""
        def on(host, argv):
            return host.argv(argv) if host else argv

        ip = server_host.ip if server_host else "127.0.0.1"
        exported = os.path.join(g.dir, f"{label}.safetensors")
        port_file = os.path.join(g.dir, f"{label}.port")
        server = g.start(f"{label}-server", on(server_host, [
            ARGS.server, f"--address={ip}:0", f"--port_file={port_file}", f"--data_address={ip}:0",
            f"--workers={WORKERS}", f"--lr={LR!r}", f"--partition_bytes={PARTITION}", f"--export={exported}",
            "--checkpoint_every=0", "--barrier_deadline=60s"]))
        port = int(g.wait_for_file(port_file, server))
        workers = [g.start(f"{label}-worker{r}", on(host, [
            ARGS.worker, f"--server={ip}:{port}", f"--rank={r}", f"--world_size={WORKERS}",
            f"--synthetic={MODEL}", f"--steps={STEPS}", "--data_plane=socket", "--call_deadline=60s",
            "--join_deadline=30s"])) for r, host in enumerate(worker_hosts)]
        for w in workers:
            self.assertEqual(g.wait(w, 60), 0, g.log(w))
        server.send_signal(signal.SIGTERM)
        self.assertEqual(g.wait(server, 30), 0, g.log(server))
        for w in workers:
            self.assertIn("the data path goes over the socket data plane", g.log(w))
        with open(exported, "rb") as f:
            return f.read(), [synthetic_result(g.log(w)) for w in workers]

    def test_a_two_worker_job_across_the_lab_ends_on_the_loopback_jobs_weights_bit_for_bit(self):
        from lab import Lab, netns_list
        lab = Lab(workers=WORKERS, servers=1, rate="200mbit")
        try:
            with lab, ProcessGroup() as g:
                s0, w0, w1 = lab.servers[0], lab.workers[0], lab.workers[1]
                routes = subprocess.run(w0.argv(["ip", "route", "show"]), capture_output=True, text=True,
                                        check=True).stdout
                self.assertEqual(re.findall(r"^\S+", routes, re.M), ["198.18.0.0/24"], "no route out of a host")
                before = lab.link_bytes()
                across, across_results = self.run_job(g, "lab", s0, (w0, w1))
                moved = {h: (up - before[h][0], down - before[h][1]) for h, (up, down) in lab.link_bytes().items()}
                loopback, loopback_results = self.run_job(g, "loopback")
        finally:
            left = [ns for ns in netns_list() if ns.startswith(lab.tag + "-")]
            self.assertEqual(left, [], "the lab's namespaces are gone")

        # Weights: exact, and the lab's equal loopback's, bit for bit.
        for r, result in enumerate(across_results):
            self.assertEqual((result["rank"], result["world"], result["steps"], result["uniform"]),
                             (str(r), str(WORKERS), str(STEPS), "yes"), result)
            self.assertEqual(float(result["first_weight"]), expected_first_weight(WORKERS, STEPS, LR), result)
        self.assertEqual(across_results, loopback_results)
        across_header, across_data = tensors(across)
        loopback_header, loopback_data = tensors(loopback)
        self.assertEqual(across_header, loopback_header)
        self.assertEqual(len(across_data), MODEL)
        self.assertEqual(across_data, loopback_data, "the lab's job ended on other weights than loopback's")
        # The bytes crossed the links: each worker pushed and pulled the model every step (and
        # pulled it once after joining; rank 0 sent it once more to define it), the server's link
        # carried all of it.
        for w in ("w0", "w1"):
            self.assertGreaterEqual(min(moved[w]), STEPS * MODEL, f"{w}'s link (up, down): {moved[w]}")
        self.assertGreaterEqual(min(moved["s0"]), WORKERS * STEPS * MODEL, f"s0's link: {moved['s0']}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--source", required=True)
    ARGS, rest = ap.parse_known_args()
    ARGS.server = os.path.join(ARGS.bin, "server", "summa-server")
    ARGS.worker = os.path.join(ARGS.bin, "worker", "summa-worker")
    sys.path.insert(0, os.path.join(ARGS.source, "bench", "cluster"))
    # SIGTERM (ctest's timeout, a CI runner stopping) unwinds like a failure: processes stopped,
    # namespaces deleted. Namespaces a SIGKILLed run left go with the next run.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    reason = lab_unavailable()
    if reason:
        print(f"skipped: {reason}")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
