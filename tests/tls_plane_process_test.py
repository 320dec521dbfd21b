"""TLS on the socket data plane with real processes on 127.0.0.1 (OS-chosen ports): summa-server
with --tls_cert, --tls_key, --tls_ca (mutual TLS), a worker token and --data_address serves the
plane in TLS 1.3; two summa-workers with --data_plane=socket and their certificates train LeNet
through it and end on the same weights, bit for bit, as the same job on the plaintext plane (each
server writes its final weights with --export; their tensors are compared byte for byte).

  tls_plane_process_test.py --bin BUILD_DIR --source SOURCE_DIR [unittest args]
"""
import argparse
import json
import os
import signal
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from procs import ProcessGroup  # noqa: E402

ARGS = None
# A short job: 2000 examples in batches of 64, one epoch (32 steps), two workers.
JOB = ["--batch_size=64", "--epochs=1", "--train_limit=2000", "--test_limit=200", "--seed=1"]


def tensors(raw):
    """A safetensors file's tensor entries (its header without __metadata__, which holds the time
    of the export) and its data section."""
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    return header, raw[8 + n:]


class TlsPlaneProcessTest(unittest.TestCase):
    def run_job(self, g, label, tls):
        """The job on the plaintext plane, or (tls) on the TLS one: the exported weights' bytes,
        with the server's and the workers' logs."""
        certs = os.path.join(g.dir, "certs")
        token = ["--token_file=" + os.path.join(certs, "worker.token")]
        server_tls = [f"--tls_cert={certs}/server.pem", f"--tls_key={certs}/server.key",
                      f"--tls_ca={certs}/ca.pem"] if tls else []
        worker_tls = [f"--tls_cert={certs}/client.pem", f"--tls_key={certs}/client.key",
                      f"--tls_ca={certs}/ca.pem"] if tls else []
        exported = os.path.join(g.dir, f"{label}.safetensors")
        server, port = g.start_server(ARGS.server, "--workers=2", "--optimizer=adam", "--lr=0.001",
                                      "--data_address=127.0.0.1:0", f"--export={exported}", *token,
                                      *server_tls, name=f"{label}-server")
        workers = [g.start(f"{label}-worker{r}", [
            ARGS.worker, f"--server=127.0.0.1:{port}", f"--rank={r}", "--world_size=2", "--progress=never",
            "--data_plane=socket", *token, *worker_tls, *JOB]) for r in range(2)]
        for w in workers:
            self.assertEqual(g.wait(w, 240), 0, g.log(w))
        server.send_signal(signal.SIGTERM)
        self.assertEqual(g.wait(server, 60), 0, g.log(server))
        with open(exported, "rb") as f:
            return f.read(), g.log(server), [g.log(w) for w in workers]

    def test_workers_train_through_the_tls_plane_to_the_plaintext_planes_weights_bit_for_bit(self):
        with ProcessGroup() as g:
            subprocess.run(["bash", os.path.join(ARGS.source, "scripts/make-certs.sh"),
                            os.path.join(g.dir, "certs")], check=True, capture_output=True)
            plain, plain_server, _ = self.run_job(g, "plain", tls=False)
            tls, tls_server, tls_workers = self.run_job(g, "tls", tls=True)
            self.assertNotIn("data plane: TLS", plain_server)
            self.assertIn("data plane: TLSv1.3 TLS_AES_128_GCM_SHA256", tls_server)
            for log in tls_workers:
                self.assertIn("the data path goes over the socket data plane", log)
                self.assertRegex(log, r"test acc 0\.[1-9]")  # trained: above LeNet's 0.1 of chance
            tls_header, tls_data = tensors(tls)
            plain_header, plain_data = tensors(plain)
            self.assertEqual(tls_header, plain_header)
            self.assertGreater(len(tls_data), 400_000)  # LeNet's weights, not an empty file
            self.assertEqual(tls_data, plain_data, "the TLS job's weights differ from the plaintext job's")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--source", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.server = os.path.join(ARGS.bin, "server", "summa-server")
    ARGS.worker = os.path.join(ARGS.bin, "worker", "summa-worker")
    unittest.main(argv=[sys.argv[0], *rest])
