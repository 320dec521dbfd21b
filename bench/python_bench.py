"""The Python client against PyTorch DDP (gloo), 2 processes each, every row in one run:

  /usr/bin/python3 bench/python_bench.py [--epochs 10] [--train_limit N] [--steps 10] [--out FILE]

1. LeNet on Fashion-MNIST (batch 256, lr 0.2, the seed's update): python/examples/pytorch_lenet.py
   through scripts/launch.sh --python (ParameterServerOptimizer: the server applies SGD) against
   bench/pytorch_lenet.py --ddp 2 (the same model, initial weights and data order; every gradient
   summed by gloo's allreduce). Seconds per epoch (mean) and test accuracy after the last epoch.
2. Per model, the ResNet-18 shape (python/examples/synthetic_resnet.py, 11.2 M parameters, batch
   16 per process) and the GPT (synthetic_gpt.py, 23.2 M, batch 2 sequences of 128 tokens per
   process), six runs of 2 processes: Summa with ParameterServerOptimizer and with
   DistributedOptimizer, each overlapped (the default) and with --no_overlap, through
   scripts/launch.sh --python (the socket data plane), DDP with gloo (--ddp 2), and
   ParameterServerOptimizer on a job whose server sends and takes bf16 (summa-server
   --wire_dtype=bf16: half the bytes each way, each partition encoded as it is ready; not the
   same weights as float32, so not DDP's job exactly). Each run:
   --steps steps (the first --warmup untimed), two traced steps, then --compute_steps steps of
   forward and backward alone in the same processes (synthetic_loop.py). Columns, from rank 0:
   step = wall time per timed step; compute alone = forward+backward with no exchange; exposed
   communication = step - compute alone; exchange busy = per step, the time any of its exchange
   calls was in flight (the union of the partitions' push-pulls, the buckets' AllReduce calls or
   DDP's bucket allreduces); exchange rate = model bytes x 2 (every gradient up, every new value
   down) / exchange busy.
3. The exchange alone, 2 processes: a 64 MiB model's push-pull through summa.Client (this
   script's --role=exchange under scripts/launch.sh, the socket data plane; zero gradients, so
   each call must give the weights back exactly) and the same 64 MiB through summa.Client's
   AllReduce, against the C++ client in the same run: summa-bench-allreduce's summa rows (the
   socket data plane) at 16 and 64 MiB and, where it is built, summa-bench-scale's 2 synthetic
   workers push-pulling a 64 MiB model. time = the median over the timed calls of the slower
   rank's; algbw = size / time (nccl-tests'); up+down = 2 x size / time, the training table's rate.
4. A Chrome trace (chrome://tracing, ui.perfetto.dev) of two steps of both processes of every run
   of 2: TRACE_DIR/<model>-<run>.json.

On a GPU (--device cuda; scripts/gpu-check.sh --python runs it): --processes 1,2 runs each model
with 1 and with 2 processes (both on cuda:0 where there is one GPU), --runs picks the rows, and
DDP uses NCCL, or gloo where 2 processes share one GPU (NCCL refuses two ranks on one device).
--python names the interpreter with torch (default $SUMMA_PYTHON, else /usr/bin/python3) and
--bin the binaries and built package (default build/).

Prints the report (command, environment, tables) and with --out writes it there too; checks that
every run finished, every exchange came back right and Summa's LeNet accuracy is within 0.01 of
DDP's (the two follow the same trajectory up to the order of float sums); exits non-zero if not.
Not a test: nothing here runs in CI.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
MODELS = [("ResNet-18 shape (11.2 M)", "resnet", "python/examples/synthetic_resnet.py"),
          ("GPT (23.2 M)", "gpt", "python/examples/synthetic_gpt.py")]
PYTHON = os.environ.get("SUMMA_PYTHON", "/usr/bin/python3")
# (row name, --runs key, the script's flags (None: DDP, no server), summa-server's extra flags)
# scripts/launch.sh serves the shared-memory plane, which the processes take; "--shm_socket=" keeps
# them on the socket data plane.
RUNS = [("Summa, ParameterServerOptimizer", "ps", ["--optimizer=ps"], ""),
        ("Summa, ParameterServerOptimizer, socket data plane", "ps-socket", ["--optimizer=ps"], "--shm_socket="),
        ("Summa, ParameterServerOptimizer, --no_overlap", "ps-no-overlap", ["--optimizer=ps", "--no_overlap"], ""),
        ("Summa, DistributedOptimizer", "distributed", ["--optimizer=distributed"], ""),
        ("Summa, DistributedOptimizer, --no_overlap", "distributed-no-overlap",
         ["--optimizer=distributed", "--no_overlap"], ""),
        ("PyTorch DDP", "ddp", None, ""),
        ("Summa, ParameterServerOptimizer, summa-server --wire_dtype=bf16", "ps-bf16", ["--optimizer=ps"],
         "--wire_dtype=bf16")]


def run(cmd, timeout=3600):
    """Runs cmd in the repository; its last RESULT line as a dict (RuntimeError if none)."""
    env = {**os.environ, **ENV, "SUMMA_PYTHON": PYTHON}
    # A session of its own, so that a run past its timeout is stopped with everything it started
    # (launch.sh's server and processes, DDP's children), not only its first process.
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                          start_new_session=True) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(child.pid, sig)
                    child.communicate(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break
            raise
    p = subprocess.CompletedProcess(cmd, child.returncode, out, err)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    lines = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} printed no RESULT line:\n{p.stdout[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def merge_traces(rank_dir, path):
    """The ranks' trace files (rank<r>.json, pid = rank) as one."""
    events = []
    for name in sorted(os.listdir(rank_dir)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(rank_dir, name)) as f:
                events += json.load(f)["traceEvents"]
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return path


def markdown_rows(path):
    """The rows of the markdown tables in `path`, each a list of its cells."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("| ") and not line.startswith("|---"):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


# --- 3. the exchange alone -----------------------------------------------------------------------

def exchange_role(args):
    """One of 2 processes (scripts/launch.sh --python): joins with a model of --model_bytes,
    times --iters push-pulls (after --warmup), then as many AllReduce calls of the same size,
    checking each result; rank 0 prints RESULT with every call's slower rank."""
    import numpy as np
    import summa
    client = summa.init(args.server, world_size=args.world_size)
    n = args.model_bytes // 4
    initial = (np.arange(n) % 1000).astype(np.float32)
    rank = client.rank
    joined = client.join([("w", (n,))], initial if rank <= 0 else None)
    rank = client.rank
    weights = np.empty(n, np.float32)
    client.pull(joined.version, weights)
    # On the shared-memory plane the gradients live where the server sums them (as
    # ParameterServerOptimizer's do): the push copies nothing.
    gradients = client.shared_floats(n)
    if gradients is None:
        gradients = np.zeros(n, np.float32)
    correct, times = {"push_pull": True, "allreduce": True}, {"push_pull": [], "allreduce": []}
    for k in range(args.warmup + args.iters):
        weights.fill(-1)  # so that a call that writes nothing is caught
        start = time.perf_counter()
        client.push_pull(joined.next_step + k, 1, gradients, weights)
        elapsed = time.perf_counter() - start
        correct["push_pull"] &= bool(np.array_equal(weights, initial))  # the server's SGD of zeros
        if k >= args.warmup:
            times["push_pull"].append(elapsed)
    values = initial * (rank + 1)
    out = np.empty(n, np.float32)
    for k in range(args.warmup + args.iters):
        out.fill(-1)
        start = time.perf_counter()
        client.allreduce(values, out, "python-bench")
        elapsed = time.perf_counter() - start
        correct["allreduce"] &= bool(np.array_equal(out, initial * 3))  # ranks 0 and 1: 1 + 2
        if k >= args.warmup:
            times["allreduce"].append(elapsed)
    # Every rank's times and checks to rank 0, through the server's AllReduce.
    gathered = np.zeros((2, args.world_size, args.iters + 1), np.float32)
    for i, what in enumerate(("push_pull", "allreduce")):
        gathered[i, rank, :args.iters] = times[what]
        gathered[i, rank, args.iters] = 1 if correct[what] else 0
    client.allreduce(gathered, gathered, "python-bench.times")
    if rank == 0:
        result = {}
        for i, what in enumerate(("push_pull", "allreduce")):
            slowest = gathered[i, :, :args.iters].max(axis=0)
            result[what] = {"seconds": float(np.median(slowest)),
                            "correct": bool(gathered[i, :, args.iters].min() == 1)}
        result["on_socket_plane"] = client.on_socket_plane
        result["on_shm_plane"] = client.on_shm_plane
        print("RESULT " + json.dumps(result), flush=True)
    summa.shutdown()
    return 0


def exchange_rows(args, work):
    """Section 3's rows: (what, client, size, seconds, correct, command)."""
    mib = 64
    rows = []
    iters = [f"--iters={args.exchange_iters}", f"--warmup={args.exchange_warmup}"]
    cmd = ["scripts/launch.sh", "--bin", args.bin, "--python", "bench/python_bench.py", "--workers", "2",
           "--run_dir", os.path.join(work, "exchange"), "--", "--role=exchange",
           f"--model_bytes={mib << 20}", *iters]
    r = run(cmd)
    plane = ("shared-memory plane" if r.get("on_shm_plane") else
             "socket data plane" if r["on_socket_plane"] else "gRPC")
    rows.append((f"push-pull of the whole model ({plane})", "Python, summa.Client", mib << 20,
                 r["push_pull"]["seconds"], r["push_pull"]["correct"], cmd))
    rows.append((f"AllReduce ({plane})", "Python, summa.Client", mib << 20,
                 r["allreduce"]["seconds"], r["allreduce"]["correct"], cmd))

    report = os.path.join(work, "allreduce.md")
    cmd = [os.path.join(args.bin, "bench/summa-bench-allreduce"), "--sizes=16MiB,64MiB", "--ranks=2",
           "--impls=summa-shm,summa,memcpy", *iters, f"--out={report}"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=1800)
    labels = {"summa-shm": ("AllReduce (shared-memory plane)", "C++, summa-bench-allreduce"),
              "summa": ("AllReduce (socket data plane)", "C++, summa-bench-allreduce"),
              "memcpy (1 thread)": ("memcpy of the tensor, one thread: the host's copy rate", "C++, memcpy")}
    for cells in markdown_rows(report):
        if cells[0] in labels and cells[2] != "size":
            size = int(cells[2][:-3]) << 20  # "16MiB"
            what, client = labels[cells[0]]
            rows.append((what, client, size, float(cells[3]) / 1e6, cells[6] == "yes", cmd))

    scale = os.path.join(args.bin, "bench/summa-bench-scale")
    if os.path.exists(scale):
        report = os.path.join(work, "scale.md")
        cmd = [scale, "--workers=2", f"--model_bytes={mib}MiB",
               f"--steps={max(3, args.exchange_iters + 1)}", f"--out={report}"]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=1800)
        for cells in markdown_rows(report):
            if cells[0] == "2":
                rows.append(("push-pull of the whole model (socket data plane)",
                             "C++, summa-bench-scale (2 summa-worker --synthetic)", mib << 20,
                             float(cells[3]) / 1e3, cells[-1] == "yes", cmd))
    return rows


# --- the report --------------------------------------------------------------------------------

def main():
    global PYTHON
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10, help="LeNet")
    ap.add_argument("--train_limit", type=int, default=0, help="LeNet: the first N examples")
    ap.add_argument("--steps", type=int, default=10, help="per ResNet and GPT run")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compute_steps", type=int, default=3)
    ap.add_argument("--exchange_iters", type=int, default=10)
    ap.add_argument("--exchange_warmup", type=int, default=3)
    ap.add_argument("--models", default="resnet,gpt")
    ap.add_argument("--no_lenet", action="store_true")
    ap.add_argument("--trace_dir", default=None, help="default: the work directory")
    ap.add_argument("--out", default=None, help="also write the report here")
    ap.add_argument("--device", default="cpu", help="the models' --device (cpu, cuda)")
    ap.add_argument("--processes", default="2", help="comma-separated process counts per model run")
    ap.add_argument("--runs", default=",".join(r[1] for r in RUNS),
                    help="which model runs: " + ",".join(r[1] for r in RUNS))
    ap.add_argument("--batch_size", type=int, default=0, help="per process (default: each model's own)")
    ap.add_argument("--no_exchange", action="store_true", help="leave out the exchange alone (section 3)")
    ap.add_argument("--python", default=PYTHON, help="the interpreter with torch")
    ap.add_argument("--run_timeout", type=float, default=3600, help="seconds for each model run")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build"), help="the binaries and built package")
    # --role=exchange: one process of section 3 (launch.sh passes --server and --world_size).
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--server", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--world_size", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model_bytes", type=int, default=64 << 20, help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, default=10, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "exchange":
        return exchange_role(args)
    PYTHON = args.python
    args.bin = os.path.abspath(args.bin)
    unknown = set(args.runs.split(",")) - {r[1] for r in RUNS}
    if unknown:
        ap.error(f"--runs: unknown {sorted(unknown)}")
    counts = [int(n) for n in args.processes.split(",")]

    work = tempfile.mkdtemp(prefix="python-bench.")
    trace_dir = args.trace_dir or os.path.join(work, "traces")
    os.makedirs(trace_dir, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_at_start = os.getloadavg()[0]
    lines = [f"Command: {shlex.join([PYTHON, 'bench/python_bench.py', *sys.argv[1:]])}", ""]
    lines += [f"Environment: {' '.join(f'{k}={v}' for k, v in ENV.items())}; {os.cpu_count()} CPUs (nproc), "
              f"{platform.system()} {platform.release()} {platform.machine()}, Python {platform.python_version()}, "
              f"load average {load_at_start:.2f} at start, {started:%Y-%m-%d %H:%M:%S} UTC; "
              f"logs and traces in {work}", ""]
    checks = []

    if not args.no_lenet:
        limit = [f"--train_limit={args.train_limit}"] if args.train_limit else []
        lenet = ["--epochs", str(args.epochs), "--batch_size", "256"]
        rows = []
        cmd = ["scripts/launch.sh", "--bin", args.bin, "--python", "python/examples/pytorch_lenet.py", "--workers", "2",
               *lenet, "--lr", "0.2", "--", *limit]
        load = os.getloadavg()[0]
        summa_lenet = run(cmd)
        rows.append(("Summa (ParameterServerOptimizer)", summa_lenet, load, cmd))
        cmd = [PYTHON, "bench/pytorch_lenet.py", "--ddp", "2", *lenet, "--lr", "0.2", *limit]
        load = os.getloadavg()[0]
        ddp_lenet = run(cmd)
        rows.append(("PyTorch DDP (gloo)", ddp_lenet, load, cmd))
        lines += [f"### LeNet, 2 processes: batch 256, lr 0.2, {args.epochs} epochs"
                  f"{f', first {args.train_limit} examples' if args.train_limit else ''}", "",
                  "| run | sec/epoch | test acc | load avg at start | command |", "|---|---:|---:|---:|---|"]
        for name, r, load, cmd in rows:
            lines.append(f"| {name} | {r['sec_per_epoch']:.2f} | {r['test_acc']:.3f} | {load:.1f} | `{' '.join(cmd)}` |")
        lines.append("")
        checks.append(("Summa's LeNet accuracy within 0.01 of DDP's",
                       abs(summa_lenet["test_acc"] - ddp_lenet["test_acc"]) <= 0.01))

    steps = [f"--steps={args.steps}", f"--warmup={args.warmup}", f"--compute_steps={args.compute_steps}",
             f"--device={args.device}"] + ([f"--batch_size={args.batch_size}"] if args.batch_size else [])
    wanted = args.models.split(",")
    for title, key, script in [m for m in MODELS if m[1] in wanted]:
        for n in counts:
            rows = []
            for name, how, flags, server_args in [r for r in RUNS if r[1] in args.runs.split(",")]:
                tag = f"{key}-{how}-{n}"
                traces = os.path.join(work, tag)
                if flags is None:
                    cmd = [PYTHON, script, "--ddp", str(n), *steps, f"--trace_dir={traces}"]
                else:
                    server = ["--server_args", server_args] if server_args else []
                    cmd = ["scripts/launch.sh", "--bin", args.bin, "--python", script, "--workers", str(n),
                           "--lr", "0.05", *server, "--run_dir", os.path.join(work, f"{tag}-run"), "--", *flags,
                           *steps, f"--trace_dir={traces}"]
                load = os.getloadavg()[0]
                try:
                    r = run(cmd, timeout=args.run_timeout)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"{tag} failed: {e}", file=sys.stderr, flush=True)
                    checks.append((f"{title}, {n} process(es), {name} finished", False))
                    continue
                if flags is None:
                    name = f"{name} ({r['how'].split('-', 1)[1]})"
                trace = merge_traces(traces, os.path.join(trace_dir, f"{tag}.json"))
                rows.append((name, r, load, trace, cmd))
            if not rows:
                continue
            first = rows[0][1]
            lines += [f"### {title}, {n} process{'es' if n > 1 else ''} on {first.get('device', 'cpu')}, batch "
                      f"{first['batch_size']} per process, {first['model_bytes'] / 2**20:.1f} MiB of float32, "
                      f"{first['timed_steps']} timed steps", "",
                      "| run | step (s) | compute alone (s) | exposed communication (s) | exchange busy (s/step) "
                      "| exchange rate (MB/s, 2 x model / busy) | load avg at start | trace | command |",
                      "|---|---:|---:|---:|---:|---:|---:|---|---|"]
            for name, r, load, trace, cmd in rows:
                busy, rate = r["exchange_busy_seconds"], r["exchange_bytes_per_second"]
                lines.append(f"| {name} | {r['step_seconds']:.4f} | {r['compute_alone_seconds']:.4f} | "
                             f"{r['exposed_seconds']:.4f} | {busy or 0:.4f} | {(rate or 0) / 1e6:.0f} | {load:.1f} | "
                             f"{os.path.relpath(trace, ROOT) if trace.startswith(ROOT) else trace} | `{' '.join(cmd)}` |")
            lines.append("")
            print("\n".join(lines[-len(rows) - 5:]), flush=True)

    if args.no_exchange:
        return finish(lines, checks, args.out)

    load = os.getloadavg()[0]
    try:
        rows = exchange_rows(args, work)
    except (RuntimeError, subprocess.SubprocessError) as e:
        print(f"the exchange alone failed: {e}", file=sys.stderr, flush=True)
        checks.append(("the exchange alone ran", False))
        rows = []
    lines += [f"### The exchange alone, 2 processes ({args.exchange_iters} timed calls after "
              f"{args.exchange_warmup} untimed; load avg {load:.1f} at start)", "",
              "| exchange | client | size | time (ms, median of the slower rank) | algbw (GB/s) "
              "| up+down per rank (GB/s) | correct | command |", "|---|---|---:|---:|---:|---:|---|---|"]
    for what, client, size, seconds, ok, cmd in rows:
        lines.append(f"| {what} | {client} | {size >> 20}MiB | {seconds * 1e3:.1f} | {size / seconds / 1e9:.3f} | "
                     f"{2 * size / seconds / 1e9:.3f} | {'yes' if ok else 'NO'} | `{' '.join(cmd)}` |")
        checks.append((f"{client}'s {what} at {size >> 20}MiB came back right", ok))
    lines.append("")
    return finish(lines, checks, args.out)


def finish(lines, checks, out):
    """Prints the report (and writes it to `out`) with each check's line; the exit status."""
    lines = lines + [f"- {'yes' if ok else 'NO '}: {what}" for what, ok in checks]
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if out:
        with open(out, "w") as f:
            f.write(report)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
