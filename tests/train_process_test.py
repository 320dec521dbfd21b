"""Process tests: the real summa-server and summa-worker binaries, started on 127.0.0.1 with
OS-chosen ports, train LeNet on Fashion-MNIST; workers serve their status through reflection; bad
data files and a model unlike the server's are refused with clear messages; the launcher stops
every process it started."""
import argparse
import collections
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tools"))
from grpc_reflect import Reflector  # noqa: E402
from procs import ProcessGroup, alive  # noqa: E402

ARGS = None
DATA = "/usr/share/datasets/fashion-mnist"


def accuracies(text):
    return [float(a) for a in re.findall(r"test acc ([0-9.]+)", text)]


def started_status(reflector, seconds=60):
    """A worker's status once its trainer has started. The status service is up before the
    data is loaded ("starting"): wait for the event the worker reports, not for a time."""
    deadline = time.monotonic() + seconds
    status = reflector.call("summa.v1.Worker/GetStatus")
    while status.get("state") == "starting" and time.monotonic() < deadline:
        time.sleep(0.05)
        status = reflector.call("summa.v1.Worker/GetStatus")
    return status


class TrainProcessTest(unittest.TestCase):
    def test_two_worker_processes_train_and_serve_status(self):
        with ProcessGroup() as g:
            # Adam: it leaves LeNet's first-epoch plateau at once, on any CPU's float rounding.
            server, port = g.start_server(ARGS.server, "--workers=2", "--optimizer=adam", "--lr=0.001")
            workers = []
            for rank in range(2):
                status_file = os.path.join(g.dir, f"w{rank}.status")
                workers.append((g.start(f"worker{rank}", [
                    ARGS.worker, f"--server=127.0.0.1:{port}", f"--rank={rank}", "--world_size=2",
                    "--device=cpu", "--batch_size=64", "--epochs=3", "--train_limit=8000", "--test_limit=2000",
                    "--seed=1", "--status_address=127.0.0.1:0", f"--status_port_file={status_file}",
                    # Rank 0 holds each push back 5 ms (sync: both wait), so the job lasts 2 s
                    # or more and its status is asked mid-job, not after a fast CPU finished.
                    f"--fault_delay_push={5 if rank == 0 else 0}ms"]),
                    status_file))
            status_port = int(g.wait_for_file(workers[0][1], workers[0][0]))
            r = Reflector(f"127.0.0.1:{status_port}")
            self.assertIn("summa.v1.Worker", r.list_services())
            status = started_status(r)
            self.assertEqual(status.get("worldSize"), 2, status)
            self.assertEqual(status.get("device"), "cpu", status)
            self.assertEqual(status.get("model"), "lenet", status)
            self.assertIn(status.get("state"), ("joining", "training", "evaluating", "starting"), status)
            for proc, _ in workers:
                self.assertEqual(g.wait(proc, 240), 0, g.log(proc))
            out0, out1 = g.log(workers[0][0]), g.log(workers[1][0])
            print(out0)
            acc0, acc1 = accuracies(out0), accuracies(out1)
            self.assertEqual(len(acc0), 3, out0)
            self.assertEqual(acc0, acc1, "both workers hold the same weights")
            self.assertGreater(acc0[-1], 0.5, "well above chance (0.1)")
            self.assertIn("2 workers on [cpu, cpu]", out0)
            srv = Reflector(f"127.0.0.1:{port}").call("summa.v1.ParameterServer/GetStatus")
            self.assertEqual(int(srv["version"]), 3 * 8000 // 64, srv)
            self.assertEqual(len(srv["members"]), 2, srv)

    def test_mlp_workers_train_and_report_their_model(self):
        with ProcessGroup() as g:
            server, port = g.start_server(ARGS.server, "--workers=2", "--lr=0.5")
            workers = []
            for rank in range(2):
                status_file = os.path.join(g.dir, f"w{rank}.status")
                workers.append((g.start(f"worker{rank}", [
                    ARGS.worker, f"--server=127.0.0.1:{port}", f"--rank={rank}", "--world_size=2",
                    "--device=cpu", "--model=mlp", "--batch_size=64", "--epochs=3",
                    "--train_limit=8000", "--test_limit=2000", "--seed=1",
                    "--status_address=127.0.0.1:0", f"--status_port_file={status_file}",
                    # As above: the MLP's 375 steps would take well under a second.
                    f"--fault_delay_push={5 if rank == 0 else 0}ms"]),
                    status_file))
            status_port = int(g.wait_for_file(workers[0][1], workers[0][0]))
            status = started_status(Reflector(f"127.0.0.1:{status_port}"))
            self.assertEqual(status.get("model"), "mlp", status)
            for proc, _ in workers:
                self.assertEqual(g.wait(proc, 240), 0, g.log(proc))
            out0 = g.log(workers[0][0])
            print(out0)
            self.assertIn("rank 0 of 2 joined at step 0 (model mlp, sync mode)", out0)
            losses = [float(x) for x in re.findall(r"epoch \d+/\d+: loss ([0-9.]+)", out0)]
            self.assertEqual(len(losses), 3, out0)
            self.assertLess(losses[1], losses[0], "the loss falls epoch over epoch")
            self.assertLess(losses[2], losses[1], "the loss falls epoch over epoch")
            self.assertGreater(accuracies(out0)[-1], 0.5, "well above chance (0.1)")
            # An unknown model is refused before anything starts, naming the choices.
            bad = g.start("bad", [ARGS.worker, f"--server=127.0.0.1:{port}", "--model=vgg"])
            self.assertEqual(g.wait(bad, 60), 1)
            self.assertIn("unknown model 'vgg' (choose one of lenet, mlp)", g.log(bad))

    def test_model_parallel_worker_trains_beside_a_data_parallel_one(self):
        # Rank 0 splits LeNet across two CPU backends (--model_parallel=2), rank 1 computes it
        # whole: the server sees two ranks of one job, and the job learns.
        with ProcessGroup() as g:
            server, port = g.start_server(ARGS.server, "--workers=2", "--optimizer=adam", "--lr=0.001")
            common = [ARGS.worker, f"--server=127.0.0.1:{port}", "--world_size=2", "--batch_size=64",
                      "--epochs=2", "--train_limit=6400", "--test_limit=1000", "--seed=1",
                      "--status_address=127.0.0.1:0", "--progress=never"]
            split = g.start("split", common + ["--rank=0", "--devices=cpu,cpu", "--model_parallel=2",
                                               "--micro_batches=3"])
            whole = g.start("whole", common + ["--rank=1", "--device=cpu"])
            for proc in (split, whole):
                self.assertEqual(g.wait(proc, 240), 0, g.log(proc))
            out = g.log(split)
            print(out)
            self.assertIn("the model split across them, 3 micro-batches", out)
            self.assertIn("2 workers on [cpu x2, cpu]", out)
            losses = [float(x) for x in re.findall(r"epoch \d+/\d+: loss ([0-9.]+)", out)]
            self.assertEqual(len(losses), 2, out)
            self.assertLess(losses[1], losses[0], "the loss falls epoch over epoch")
            self.assertGreater(accuracies(out)[-1], 0.5, "well above chance (0.1)")
            srv = Reflector(f"127.0.0.1:{port}").call("summa.v1.ParameterServer/GetStatus")
            self.assertEqual(int(srv["version"]), 2 * 6400 // 64, srv)
            # --model_parallel=2 needs two devices, named; a model that cannot be split is refused.
            bad = g.start("bad", common + ["--rank=0", "--model_parallel=2"])
            self.assertEqual(g.wait(bad, 60), 2)
            self.assertIn("--model_parallel=2 splits the model across two devices: name them with --devices",
                          g.log(bad))

    def test_metrics_are_served_for_prometheus(self):
        import urllib.request

        def scrape(port):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                return r.read().decode()

        def scrape_while_alive(port, proc):
            """The page, or None once proc has exited and its endpoint with it."""
            try:
                return scrape(port)
            except OSError:
                if proc.poll() is None:
                    raise
                return None

        def value(text, name):
            m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
            self.assertIsNotNone(m, f"{name} missing from:\n{text}")
            return float(m.group(1))

        with ProcessGroup() as g:
            server_metrics = os.path.join(g.dir, "server.metrics")
            server, port = g.start_server(ARGS.server, "--workers=1",
                                          "--metrics_address=127.0.0.1:0",
                                          f"--metrics_port_file={server_metrics}")
            worker_metrics = os.path.join(g.dir, "worker.metrics")
            w = g.start("worker", [ARGS.worker, f"--server=127.0.0.1:{port}", "--rank=0",
                                   "--world_size=1", "--batch_size=64", "--epochs=1",
                                   "--train_limit=3200", "--test_limit=100",
                                   "--status_address=127.0.0.1:0",
                                   "--metrics_address=127.0.0.1:0",
                                   f"--metrics_port_file={worker_metrics}",
                                   # 50 steps take 2.5 s or more, so the scrapes below see
                                   # the worker mid-job (at full speed it finishes in 0.3 s).
                                   "--fault_delay_push=50ms"])
            wport = int(g.wait_for_file(worker_metrics, w))
            # The worker's own series, scraped while it trains.
            seen = None
            while w.poll() is None and seen is None:
                text = scrape_while_alive(wport, w)
                if text and re.search(r"^summa_worker_steps_total [1-9]", text, re.M):
                    seen = text
                time.sleep(0.05)
            self.assertIsNotNone(seen, "the worker finished before its metrics showed a step")
            for name in ["summa_worker_step_seconds_count", "summa_worker_epoch",
                         "summa_worker_examples_per_second", "summa_worker_loss",
                         "summa_worker_test_accuracy"]:
                value(seen, name)
            self.assertEqual(g.wait(w, 120), 0, g.log(w))
            # The server refreshes its series every tick (100 ms): poll until the last step shows,
            # with a deadline, instead of sleeping for a tick.
            sport = int(g.wait_for_file(server_metrics, server))
            deadline = time.monotonic() + 30
            text = scrape(sport)
            while value(text, "summa_server_members_alive") != 0 and time.monotonic() < deadline:
                time.sleep(0.05)
                text = scrape(sport)
            # LeNet: 20*9 + 20 + 50*20*25 + 50 + 800*128 + 128 + 128*10 + 10 parameters, one partition.
            params = 129068
            status = Reflector(f"127.0.0.1:{port}").call("summa.v1.ParameterServer/GetStatus")
            self.assertEqual(int(status["parameterCount"]), params)
            self.assertEqual(value(text, "summa_server_steps_total"), 50)
            self.assertEqual(value(text, "summa_server_version"), 50)
            self.assertEqual(value(text, "summa_server_pushes_total"), 50)
            self.assertEqual(value(text, "summa_server_step_seconds_count"), 50)
            self.assertEqual(value(text, "summa_server_received_bytes_total"), 50 * params * 4)
            # The first pull at join, then one reply per push-pull.
            self.assertEqual(value(text, "summa_server_pulls_total"), 51)
            self.assertEqual(value(text, "summa_server_sent_bytes_total"), 51 * params * 4)
            self.assertEqual(value(text, "summa_server_duplicate_pushes_total"), 0)
            self.assertEqual(value(text, "summa_server_nonfinite_pushes_total"), 0)
            # The device list at the start and the epoch's loss.
            self.assertEqual(value(text, "summa_server_allreduce_rounds_total"), 2)
            self.assertEqual(value(text, "summa_server_learning_rate"), 0.1)
            self.assertEqual(value(text, "summa_server_members_alive"), 0)  # it left when done
            self.assertEqual(value(text, "summa_server_checkpoint_age_seconds"), -1)

    def test_a_second_process_started_as_the_same_rank_fences_the_first(self):
        with ProcessGroup() as g:
            server, port = g.start_server(ARGS.server, "--workers=1", "--optimizer=adam", "--lr=0.001")
            common = [ARGS.worker, f"--server=127.0.0.1:{port}", "--rank=0", "--world_size=1", "--device=cpu",
                      "--batch_size=64", "--epochs=2", "--train_limit=8000", "--test_limit=500", "--seed=1",
                      "--status_address=127.0.0.1:0"]
            first_status = os.path.join(g.dir, "first.status")
            # The first process holds each push back 200 ms, so that it cannot finish its 250
            # steps (50 s) before the second has started and joined (a CPU worker takes 2 s for
            # all of them at full speed); the second trains at full speed.
            first = g.start("first", common + [f"--status_port_file={first_status}",
                                               "--fault_delay_push=200ms"])
            r = Reflector(f"127.0.0.1:{int(g.wait_for_file(first_status, first))}")
            status = started_status(r)
            deadline = time.monotonic() + 120
            while int(status.get("step", 0)) < 5 and time.monotonic() < deadline:
                time.sleep(0.05)
                status = r.call("summa.v1.Worker/GetStatus")
            self.assertGreaterEqual(int(status.get("step", 0)), 5, status)
            # The same rank again, from another process: its join fences the first one's session.
            second = g.start("second", common + [f"--status_port_file={os.path.join(g.dir, 'second.status')}"])
            self.assertEqual(g.wait(first, 120), 1, g.log(first))
            log = g.log(first)
            self.assertIn("FAILED_PRECONDITION", log)
            self.assertIn("rank 0 is held by a newer process", log)
            self.assertEqual(g.wait(second, 240), 0, g.log(second))
            srv = Reflector(f"127.0.0.1:{port}").call("summa.v1.ParameterServer/GetStatus")
            # Every step of the job was taken once: by the first process, then by the second.
            self.assertEqual(int(srv["version"]), 2 * 8000 // 64, srv)
            self.assertEqual(srv["members"][0]["joins"], 2, srv)

    def test_bad_data_files_are_named(self):
        with ProcessGroup() as g:
            bad = os.path.join(g.dir, "data")
            os.makedirs(bad)
            for name in os.listdir(DATA):
                shutil.copy(os.path.join(DATA, name), bad)
            # Truncate the training images: a valid gzip stream that ends early.
            path = os.path.join(bad, "train-images-idx3-ubyte.gz")
            with gzip.open(path, "rb") as f:
                head = f.read(10000)
            with gzip.open(path, "wb") as f:
                f.write(head)
            w = g.start("worker", [ARGS.worker, "--server=127.0.0.1:1", f"--data_dir={bad}",
                                   "--join_deadline=2s"])
            self.assertEqual(g.wait(w, 60), 1)
            log = g.log(w)
            self.assertIn("train-images-idx3-ubyte.gz: truncated", log)
            os.remove(os.path.join(bad, "t10k-labels-idx1-ubyte.gz"))
            w = g.start("worker2", [ARGS.worker, "--server=127.0.0.1:1", f"--data_dir={os.path.join(g.dir, 'none')}"])
            self.assertEqual(g.wait(w, 60), 1)
            self.assertIn("not found", g.log(w))

    def test_worker_whose_model_differs_is_refused(self):
        with ProcessGroup() as g:
            server, port = g.start_server(ARGS.server, "--workers=2")
            # Another job's model reaches the server first.
            r = Reflector(f"127.0.0.1:{port}")
            r.call("summa.v1.ParameterServer/Join",
                   '{"rank": 0, "worldSize": 2, "params": [{"name": "W1", "dtype": "DTYPE_FLOAT32",'
                   ' "shape": ["2"], "data": "AAAAAAAAAAA="}]}')
            w = g.start("worker", [ARGS.worker, f"--server=127.0.0.1:{port}", "--rank=1",
                                   "--world_size=2", "--test_limit=10", "--train_limit=100"])
            self.assertEqual(g.wait(w, 60), 1)
            log = g.log(w)
            self.assertIn("FAILED_PRECONDITION", log)
            self.assertIn("model mismatch", log)

    def test_launcher_trains_and_stops_everything_on_failure(self):
        run_dir = os.path.join(ProcessGroup().dir, "run")
        trace_dir = os.path.join(run_dir, "trace")
        ok = subprocess.run([ARGS.launch, "--workers", "2", "--epochs", "1", "--batch_size", "64",
                             "--lr", "0.5", "--bin", ARGS.bin, "--run_dir", run_dir,
                             "--trace_dir", trace_dir, "--", "--train_limit=1000", "--test_limit=500",
                             "--overlap=true"],
                            capture_output=True, text=True, timeout=240)
        self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
        self.assertIn("epoch 1/1", ok.stdout)
        self.assertIn("all 2 workers finished", ok.stdout)
        # The timelines: every step's stages on each worker, every push's sum and every step's
        # optimizer on the server (1000 examples in batches of 64: 16 steps; LeNet is one partition).
        steps = -(-1000 // 64)
        spans = {}
        for name in ("server", "worker0", "worker1"):
            with open(os.path.join(trace_dir, name + ".json")) as f:
                events = json.load(f)["traceEvents"]
            spans[name] = collections.Counter(e["name"] for e in events if e.get("ph") == "X")
        # The workers overlap (--overlap=true): the forward loads each layer's weights
        # as they come, inside compute, and exchange is the wait for the last step's first reply
        # (the steps after the first, and the epoch's end).
        self.assertIn("sync mode, overlapped)", ok.stdout)
        for worker in ("worker0", "worker1"):
            for stage in ("compute", "exchange", "pushpull"):
                self.assertEqual(spans[worker][stage], steps, (worker, stage, spans[worker]))
            self.assertEqual(spans[worker]["load"], 0, (worker, spans[worker]))
        self.assertEqual(spans["server"]["sum"], 2 * steps, spans["server"])
        self.assertEqual(spans["server"]["optimizer"], steps, spans["server"])
        # Every push-pull's wait, and each worker's first pull after its join.
        self.assertEqual(spans["server"]["wait"], 2 * steps + 2, spans["server"])
        summary = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "bench",
                                                               "trace_summary.py"),
                                  *[os.path.join(trace_dir, n + ".json") for n in ("server", "worker0", "worker1")]],
                                 capture_output=True, text=True, timeout=60)
        self.assertEqual(summary.returncode, 0, summary.stderr)
        self.assertIn(f"communication per step (the last worker's exchange, {steps} steps of 2 workers)",
                      summary.stdout)
        pids = [int(open(os.path.join(run_dir, f)).read()) for f in os.listdir(run_dir)
                if f.endswith(".pid")]
        self.assertEqual(len(pids), 3)
        self.assertFalse([p for p in pids if alive(p)], "no process left behind")

        # Worker 1 fails (no data): the launcher stops the server and worker 0 and fails.
        run_dir2 = run_dir + "2"
        bad = subprocess.run([ARGS.launch, "--workers", "2", "--epochs", "1", "--bin", ARGS.bin,
                              "--run_dir", run_dir2, "--", "--data_dir=/nonexistent"],
                             capture_output=True, text=True, timeout=120)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("failed", bad.stderr)
        pids = [int(open(os.path.join(run_dir2, f)).read()) for f in os.listdir(run_dir2)
                if f.endswith(".pid")]
        time.sleep(0.2)
        self.assertFalse([p for p in pids if alive(p)], "no process left behind")


    def test_launcher_runs_a_job_on_two_server_shards(self):
        # LeNet in 8 partitions of at most 64 KiB over two shards: each sums and steps its own 4
        # (balanced by bytes), every push of every step; the launcher stops all four processes.
        run_dir = os.path.join(ProcessGroup().dir, "run")
        trace_dir = os.path.join(run_dir, "trace")
        ckpt = os.path.join(run_dir, "ckpt")
        ok = subprocess.run([ARGS.launch, "--workers", "2", "--shards", "2", "--epochs", "1", "--batch_size", "64",
                             "--bin", ARGS.bin, "--run_dir", run_dir, "--trace_dir", trace_dir,
                             "--server_args", f"--partition_bytes=65536 --checkpoint_dir={ckpt}", "--",
                             "--train_limit=1000", "--test_limit=500"],
                            capture_output=True, text=True, timeout=240)
        self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
        self.assertIn("all 2 workers finished", ok.stdout)
        # One checkpoint directory given to both: each shard keeps its own (the last, on SIGTERM).
        self.assertEqual(sorted(os.listdir(ckpt)), ["shard-0-of-2", "shard-1-of-2"])
        for shard in os.listdir(ckpt):
            self.assertTrue([f for f in os.listdir(os.path.join(ckpt, shard)) if f.endswith(".summa")], shard)
        steps = -(-1000 // 64)
        for name in ("server", "shard1"):
            with open(os.path.join(trace_dir, name + ".json")) as f:
                spans = collections.Counter(e["name"] for e in json.load(f)["traceEvents"] if e.get("ph") == "X")
            self.assertEqual(spans["sum"], 2 * steps * 4, (name, spans))
            self.assertEqual(spans["optimizer"], steps * 4, (name, spans))
            with open(os.path.join(run_dir, name + ".log")) as f:
                self.assertIn(f"shard {0 if name == 'server' else 1} of 2", f.read())
        pids = [int(open(os.path.join(run_dir, f)).read()) for f in os.listdir(run_dir) if f.endswith(".pid")]
        self.assertEqual(len(pids), 4)
        self.assertFalse([p for p in pids if alive(p)], "no process left behind")

        # LeNet whole is one partition: two shards cannot split it, and the job says why.
        run_dir2 = run_dir + "2"
        bad = subprocess.run([ARGS.launch, "--workers", "1", "--shards", "2", "--epochs", "1", "--bin", ARGS.bin,
                              "--run_dir", run_dir2, "--", "--train_limit=100"],
                             capture_output=True, text=True, timeout=120)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("2 shards need at least 2", bad.stderr)
        pids = [int(open(os.path.join(run_dir2, f)).read()) for f in os.listdir(run_dir2) if f.endswith(".pid")]
        time.sleep(0.2)
        self.assertFalse([p for p in pids if alive(p)], "no process left behind")

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--launch", required=True)
    ARGS, rest = ap.parse_known_args()
    ARGS.server = os.path.join(ARGS.bin, "server/summa-server")
    ARGS.worker = os.path.join(ARGS.bin, "worker/summa-worker")
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
