"""Weights in and out as safetensors, with real processes on 127.0.0.1 (OS-chosen ports): a job
driven through the Python client (python/examples/pytorch_lenet.py's LeNet, gradients the test
draws from the step number, so that every run sees the same ones) is exported by the Export call
(through server reflection, as grpcurl would), by --export as the server stops, and by
summa-checkpoint export from its checkpoint; each file, read by the reader written below with json
and numpy alone, holds the names, shapes and bytes of the weights pulled from the server, and
PyTorch loads it (summa.load_safetensors) into a LeNet that answers as the pulled weights do.
--init_from refuses a model whose shape differs, naming the tensor, and a job started from an
exported file continues bit for bit: N steps, exported, M more from the file equal N + M steps."""
import argparse
import json
import os
import signal
import struct
import subprocess
import sys
import unittest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from procs import ProcessGroup  # noqa: E402

ARGS = None
LR = 0.1
# LeNet's 129068 floats in 6 partitions: an export assembles several.
SERVER = ["--workers=1", f"--lr={LR}", "--partition_bytes=100000", "--checkpoint_every=0"]


def independent_read(path):
    """(header without __metadata__, metadata, data start, data bytes): the format read with json
    and numpy alone, checked as the format says."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header past the file"
    text = raw[8:8 + n]
    assert text[:1] == b"{", "header does not begin with {"
    header = json.loads(text.decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in metadata.values())
    data = raw[8 + n:]
    covered = 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = e["data_offsets"]
        assert begin == covered, f"{name}: hole or overlap"
        assert e["dtype"] == "F32"
        assert end - begin == 4 * int(np.prod(e["shape"], dtype=np.int64))
        covered = end
    assert covered == len(data), "the data section is not covered exactly"
    return header, metadata, 8 + n, data


def lenet():
    sys.path.insert(0, os.path.dirname(ARGS.lenet))
    from pytorch_lenet import LeNet
    return LeNet(3)


def specs_and_values(model):
    named = list(model.named_parameters())
    specs = [(name, tuple(p.shape)) for name, p in named]
    flat = torch.cat([p.detach().reshape(-1) for _, p in named]).numpy().copy()
    return specs, flat


def gradient(step, size):
    """Step `step`'s gradient, the same in every run."""
    return np.random.default_rng(1000 + step).standard_normal(size).astype(np.float32)


def run_steps(client, size, first_gradient, count):
    """`count` sync steps from the server's version, with gradients first_gradient, ...; the weights
    after the last."""
    weights = np.zeros(size, dtype=np.float32)
    version = client.joined.version
    for k in range(count):
        client.push_pull(version + k, 1, gradient(first_gradient + k, size), weights)
    return weights


def pulled(client, version, size):
    weights = np.zeros(size, dtype=np.float32)
    client.pull(version, weights)
    return weights


def reflect(port, method, request):
    """grpc_reflect.py call (a grpcurl): (exit code, output)."""
    p = subprocess.run([sys.executable, ARGS.reflect, f"127.0.0.1:{port}", "call",
                        f"summa.v1.ParameterServer/{method}", json.dumps(request)],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


class SafetensorsProcessTest(unittest.TestCase):
    def assert_holds(self, path, specs, weights, step):
        header, metadata, start, data = independent_read(path)
        self.assertEqual(start % 8, 0, "the data section starts at a multiple of 8")
        by_offset = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
        self.assertEqual([(name, tuple(e["shape"])) for name, e in by_offset], specs)
        self.assertEqual(data, weights.tobytes(), f"{path} holds the pulled weights' bytes")
        self.assertEqual(metadata["format"], "pt")
        self.assertEqual(metadata["summa.step"], str(step))
        self.assertEqual(metadata["summa.mode"], "sync")
        self.assertEqual(metadata["summa.world_size"], "1")

    def stop(self, g, server):
        server.send_signal(signal.SIGTERM)
        self.assertEqual(g.wait(server, 60), 0, g.log(server))

    def test_export_call_export_flag_and_checkpoint_tool_hold_the_pulled_weights_and_torch_loads_them(self):
        model = lenet()
        specs, initial = specs_and_values(model)
        steps = 4
        with ProcessGroup() as g:
            ckpt = os.path.join(g.dir, "ckpt")
            exports = os.path.join(g.dir, "exports")
            final = os.path.join(g.dir, "final.safetensors")
            server, port = g.start_server(ARGS.server, *SERVER, f"--checkpoint_dir={ckpt}",
                                          f"--export_dir={exports}", f"--export={final}")
            # Before any model: refused with the reason.
            code, out = reflect(port, "Export", {})
            self.assertNotEqual(code, 0)
            self.assertIn("FAILED_PRECONDITION", out)
            self.assertIn("no model yet", out)
            client = summa.Client(f"127.0.0.1:{port}", rank=0, world_size=1)
            client.join(specs, initial)
            run_steps(client, initial.size, 0, steps)
            weights = pulled(client, steps, initial.size)
            self.assertGreater(float(np.abs(weights - initial).max()), 1e-2, "the steps moved the weights")

            code, out = reflect(port, "Export", {"file_name": "lenet.safetensors"})
            self.assertEqual(code, 0, out)
            answer = json.loads(out)
            path = os.path.join(exports, "lenet.safetensors")
            self.assertEqual(answer["path"], path)
            self.assertEqual(int(answer["version"]), steps)
            self.assertEqual(answer["tensors"], len(specs))
            self.assertEqual(int(answer["bytes"]), os.path.getsize(path))
            self.assert_holds(path, specs, weights, steps)
            # No name: model-<version>.safetensors; a path is refused, and nothing is written.
            code, out = reflect(port, "Export", {})
            self.assertEqual(code, 0, out)
            self.assertEqual(json.loads(out)["path"], os.path.join(exports, f"model-{steps}.safetensors"))
            for bad in ("../escape.safetensors", "/tmp/x.safetensors", ".."):
                code, out = reflect(port, "Export", {"file_name": bad})
                self.assertNotEqual(code, 0, bad)
                self.assertIn("INVALID_ARGUMENT", out)
                self.assertIn("not a plain name", out)
            self.assertFalse(os.path.exists(os.path.join(g.dir, "escape.safetensors")))

            # PyTorch: the file into a fresh LeNet answers as the pulled weights do.
            loaded, from_server = lenet(), lenet()
            with torch.no_grad():
                offset = 0
                for p in from_server.parameters():
                    p.copy_(torch.from_numpy(weights[offset:offset + p.numel()]).view_as(p))
                    offset += p.numel()
            self.assertEqual(summa.load_safetensors(loaded, path), ([], []))
            x = torch.from_numpy(np.random.default_rng(7).standard_normal((5, 1, 28, 28)).astype(np.float32))
            self.assertTrue(torch.equal(loaded(x), from_server(x)))
            self.assertFalse(torch.equal(lenet()(x), from_server(x)))

            client.leave()
            client.close()
            self.stop(g, server)  # writes the last checkpoint, then --export
            self.assertIn("final weights (version 4", g.log(server))
            self.assert_holds(final, specs, weights, steps)

            # summa-checkpoint: the checkpoint directory's newest, the same bytes.
            tool_out = os.path.join(g.dir, "from-ckpt.safetensors")
            p = subprocess.run([ARGS.tool, "export", ckpt, tool_out], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("version:    4", p.stdout)
            self.assertIn("job:        1 workers, sync mode", p.stdout)
            self.assertIn(f"tensors:    {len(specs)} ({initial.size} parameters", p.stdout)
            self.assertIn(f"wrote {tool_out}: version 4, {len(specs)} tensors", p.stdout)
            self.assert_holds(tool_out, specs, weights, steps)
            # Usage and failures: exit 2 and 1, with a message.
            p = subprocess.run([ARGS.tool, "export", ckpt], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2)
            self.assertIn("usage:", p.stderr)
            p = subprocess.run([ARGS.tool, "show", os.path.join(g.dir, "absent")], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(p.returncode, 1)
            self.assertIn("summa-checkpoint: ", p.stderr)

    def test_init_from_refuses_another_shape_by_name_and_a_job_started_from_an_export_continues_bit_for_bit(self):
        model = lenet()
        specs, initial = specs_and_values(model)
        n, m = 3, 3
        with ProcessGroup() as g:
            # The whole run: N + M steps.
            server, port = g.start_server(ARGS.server, *SERVER, name="whole")
            client = summa.Client(f"127.0.0.1:{port}", rank=0, world_size=1)
            client.join(specs, initial)
            whole = run_steps(client, initial.size, 0, n + m)
            client.leave()
            client.close()
            self.stop(g, server)

            # N steps, exported as the server stops.
            exported = os.path.join(g.dir, "lenet-n.safetensors")
            server, port = g.start_server(ARGS.server, *SERVER, f"--export={exported}", name="first")
            client = summa.Client(f"127.0.0.1:{port}", rank=0, world_size=1)
            client.join(specs, initial)
            after_n = run_steps(client, initial.size, 0, n)
            client.leave()
            client.close()
            self.stop(g, server)
            self.assert_holds(exported, specs, after_n, n)

            # A bad file fails the start with a clear message.
            bad = os.path.join(g.dir, "bad.safetensors")
            with open(bad, "wb") as f:
                f.write(struct.pack("<Q", 4) + b"[1] ")
            proc = g.start("bad-server", [ARGS.server, "--address=127.0.0.1:0", *SERVER, f"--init_from={bad}"])
            self.assertEqual(g.wait(proc, 60), 1)
            self.assertIn("--init_from: " + bad + ": the header does not begin with '{'", g.log(proc))

            # M more from the file: a model of another shape is refused by name; the right one
            # takes the file's values, whatever it sends (zeros here), at version 0.
            server, port = g.start_server(ARGS.server, *SERVER, f"--init_from={exported}", name="second")
            wrong = [(name, (20, 1, 5, 5) if name == "W1" else shape) for name, shape in specs]
            other = summa.Client(f"127.0.0.1:{port}", rank=0, world_size=1, join_timeout=10)
            with self.assertRaises(summa.SummaError) as refused:
                other.join(wrong, np.zeros(initial.size - 20 * 9 + 20 * 25, dtype=np.float32))
            self.assertEqual(refused.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn(f"W1: shape [20, 1, 3, 3] in {exported}, [20, 1, 5, 5] in the model",
                          str(refused.exception))
            other.close()
            client = summa.Client(f"127.0.0.1:{port}", rank=0, world_size=1)
            joined = client.join(specs, np.zeros(initial.size, dtype=np.float32))
            self.assertEqual(joined.version, 0)
            self.assertEqual(pulled(client, 0, initial.size).tobytes(), after_n.tobytes())
            resumed = run_steps(client, initial.size, n, m)
            client.leave()
            client.close()
            self.stop(g, server)
            self.assertIn(f"the initial values are {exported}'s (--init_from)", g.log(server))
            self.assertEqual(resumed.tobytes(), whole.tobytes(), "N steps + export + M steps = N + M steps")
            self.assertGreater(float(np.abs(whole - after_n).max()), 1e-2, "the last M steps moved the weights")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="the build tree (server/summa-server, server/summa-checkpoint, python/)")
    ap.add_argument("--source", help="the source tree (python/examples, tests/tools)")
    ARGS, rest = ap.parse_known_args()
    ARGS.server = os.path.join(ARGS.bin, "server/summa-server")
    ARGS.tool = os.path.join(ARGS.bin, "server/summa-checkpoint")
    ARGS.python_path = os.path.join(ARGS.bin, "python")
    ARGS.lenet = os.path.join(ARGS.source, "python/examples/pytorch_lenet.py")
    ARGS.reflect = os.path.join(ARGS.source, "tests/tools/grpc_reflect.py")
    sys.path.insert(0, ARGS.python_path)
    import grpc  # noqa: E402
    import numpy as np  # noqa: E402
    import torch  # noqa: E402
    import summa  # noqa: E402
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
