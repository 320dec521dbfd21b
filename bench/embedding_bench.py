"""Embedding tables through Summa against DDP (issue 36, part 7), in one run on this machine:

1. A DLRM-shaped model whose tables DDP can hold (python/examples/dlrm.py: 3 tables of --rows
   rows x 64 floats, Zipf ids, batch 512 per process): 2 processes through Summa (one server,
   summa.EmbeddingBag, tables stepped by row-wise adagrad on the server, the next batch's rows
   prefetched) against the same model with torch.nn.EmbeddingBag(sparse=True) under DDP (gloo,
   torch's sparse Adagrad on the tables). Step time, rows moved per second, peak memory per
   process.
2. A table DDP cannot hold twice: --big_rows x 64 floats (10 M: 2.4 GiB) over 2 server shards.
   Every row is created first by pulling it once (dlrm.py --populate: rows per second per
   shard), then 2 processes train the DLRM model on it; the workers' peak memory against the
   table's size, each shard's table memory (its status) and resident memory.
3. Rows moved at the shards' speed: on a populated table again, 2 processes pull and push the
   distinct ids of --raw_ids Zipf draws for --raw_steps sync steps through the client alone (no
   model, no torch): rows per second per shard.

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 bench/embedding_bench.py [--big_rows 10000000]

Prints a markdown table per part. Exits non-zero unless every process exited 0 and each job
trained (its last loss below its first) and every shard holds its share of the big table's rows.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
SERVER = os.path.join(BUILD, "server", "summa-server")
DLRM = os.path.join(ROOT, "python", "examples", "dlrm.py")
ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.path.join(BUILD, "python")}
sys.path.insert(0, os.path.join(BUILD, "python"))


class BenchError(Exception):
    pass


def start_shards(run_dir, shards, *flags):
    procs, ports = [], []
    for i in range(shards):
        port_file = os.path.join(run_dir, f"shard{i}-{time.monotonic_ns()}.port")
        shard = [f"--shards={shards}", f"--shard={i}", "--partition_bytes=16384"] if shards > 1 else []
        log = open(port_file + ".log", "w")
        procs.append(subprocess.Popen([SERVER, "--address=127.0.0.1:0", f"--port_file={port_file}", "--workers=2",
                                       *shard, *flags], stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.monotonic() > deadline or procs[-1].poll() is not None:
                raise BenchError(f"server {i} did not start: {open(port_file + '.log').read()}")
            time.sleep(0.05)
        ports.append(int(open(port_file).read()))
    return procs, ",".join(f"127.0.0.1:{p}" for p in ports)


def stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def shard_statuses(address):
    import summa
    out = []
    for a in address.split(","):
        c = summa.Client(a, native=False)
        try:
            out.append(c.status())
        finally:
            c.close()
    return out


def results(procs, what):
    rows = []
    for p, out in procs:
        text = out.read()
        if p.returncode != 0:
            raise BenchError(f"{what} exited {p.returncode}:\n{text[-3000:]}")
        rows += [json.loads(line[len("RESULT "):]) for line in text.splitlines() if line.startswith("RESULT ")]
    for r in rows:
        if not r["loss_last"] < r["loss_first"]:
            raise BenchError(f"{what}: rank {r['rank']} did not train (loss {r['loss_first']} -> {r['loss_last']})")
    return rows


def run_workers(argv_of_rank, what, n=2):
    procs = []
    for r in range(n):
        out = tempfile.TemporaryFile("w+")
        procs.append((subprocess.Popen(argv_of_rank(r), stdout=out, stderr=subprocess.STDOUT,
                                       env={**os.environ, **ENV}), out))
    for p, out in procs:
        p.wait(timeout=3600)
        out.seek(0)
    return results(procs, what)


def dlrm_summa(address, args, extra, what):
    return run_workers(lambda r: [sys.executable, DLRM, f"--server={address}", f"--rank={r}", "--world_size=2",
                                  f"--steps={args.steps}", f"--lr={args.lr}", *extra], what)


def dlrm_ddp(args, extra):
    out = tempfile.TemporaryFile("w+")
    p = subprocess.Popen([sys.executable, DLRM, "--ddp=2", f"--steps={args.steps}", f"--lr={args.lr}", *extra],
                         stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **ENV})
    p.wait(timeout=3600)
    out.seek(0)
    return results([(p, out)], "DDP")


def mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def part1(run_dir, args):
    extra = [f"--rows={args.rows}", "--tables=3", "--dim=64"]
    procs, address = start_shards(run_dir, 1, f"--lr={args.lr}")
    try:
        summa_rows = dlrm_summa(address, args, extra, "Summa")
    finally:
        stop(procs)
    ddp_rows = dlrm_ddp(args, extra)
    table_mib = summa_rows[0]["table_mib"]
    print(f"\n### 1. Tables DDP can hold: 3 x {args.rows:,} rows x 64 floats ({table_mib:.0f} MiB), 2 processes\n")
    print("| job | step (ms) | rows moved / s | peak memory per process (MiB) | loss first -> last |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, rows in (("Summa (summa.EmbeddingBag, adagrad on the server)", summa_rows),
                       ("DDP gloo (nn.EmbeddingBag sparse, torch Adagrad)", ddp_rows)):
        print(f"| {name} | {mean(rows, 'step_ms'):.1f} | {mean(rows, 'rows_per_s'):,.0f} | "
              f"{max(r['peak_mib'] for r in rows):.0f} | {mean(rows, 'loss_first'):.3f} -> {mean(rows, 'loss_last'):.3f} |")
    print(f"\nSumma's step is {mean(summa_rows, 'step_ms') / mean(ddp_rows, 'step_ms'):.2f}x DDP's.")


def part2_and_3(run_dir, args):
    table_mib = args.big_rows * 64 * 4 / 2**20
    flags = [f"--lr={args.lr}"]
    procs, address = start_shards(run_dir, 2, *flags)
    try:
        # Rank 0 creates every row first (--populate): the table is as large as declared.
        extra = [f"--rows={args.big_rows}", "--tables=1", "--dim=64", "--populate"]
        rows = dlrm_summa(address, args, extra, "Summa, the big table")
        statuses = shard_statuses(address)
        held = [s.tables[0].rows for s in statuses]
        if sum(held) != args.big_rows or min(held) == 0:
            raise BenchError(f"the shards hold {held} rows of {args.big_rows}")
        rate = max(r.get("populate_rows_per_s", 0) for r in rows)
        print(f"\n### 2. A table of {args.big_rows:,} rows x 64 floats ({table_mib:,.0f} MiB) over 2 shards\n")
        print(f"Populate (every row pulled once by one process, created from its initializer): {rate:,.0f} rows/s "
              f"in all, {rate / 2:,.0f} per shard.\n")
        print("| shard | rows held | table memory (status, MiB) | resident memory (MiB) |")
        print("| ---: | ---: | ---: | ---: |")
        for i, (s, p) in enumerate(zip(statuses, procs)):
            print(f"| {i} | {s.tables[0].rows:,} | {s.table_bytes / 2**20:,.0f} | {rss_mib(p.pid):,.0f} |")
        print(f"\nThe DLRM model on it (2 processes, batch 512 each): {mean(rows, 'step_ms'):.1f} ms/step, "
              f"{mean(rows, 'rows_per_s'):,.0f} rows moved/s per process. DDP would hold the whole "
              f"{table_mib:,.0f} MiB table (and its optimizer state) in each process: not run.\n")
        print("| process | peak memory (MiB) | of the table | of which training added (MiB) | of the table |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for r in sorted(rows, key=lambda r: r["rank"]):
            what = f"rank {r['rank']}" + (" (created every row first)" if "populate_rows_per_s" in r else "")
            print(f"| {what} | {r['peak_mib']:.0f} | {r['peak_mib'] / table_mib:.1%} | {r['growth_mib']:.0f} | "
                  f"{r['growth_mib'] / table_mib:.2%} |")
        print(f"\n`import torch` alone takes {torch_mib():.0f} MiB here: the floor of any PyTorch worker.")
    finally:
        stop(procs)
    procs, address = start_shards(run_dir, 2, *flags)
    try:
        raw = run_workers(lambda r: [sys.executable, __file__, "--raw_worker", f"--server={address}", f"--rank={r}",
                                     f"--big_rows={args.big_rows}", f"--raw_ids={args.raw_ids}",
                                     f"--raw_steps={args.raw_steps}"], "raw rows")
    finally:
        stop(procs)
    moved = sum(r["rows"] for r in raw)
    seconds = max(r["seconds"] for r in raw)
    print(f"\n### 3. Rows at the shards' speed: 2 processes, {args.raw_steps} sync steps of {args.raw_ids:,} Zipf "
          "draws each (their distinct ids pulled, then their gradients pushed), on the populated table\n")
    print("| rows pulled + pushed | seconds | rows / s in all | rows / s per shard |")
    print("| ---: | ---: | ---: | ---: |")
    print(f"| {moved:,} | {seconds:.2f} | {moved / seconds:,.0f} | {moved / seconds / 2:,.0f} |")


def torch_mib():
    """The peak memory of a Python that imports torch and nothing else."""
    code = "import resource, torch; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                env={**os.environ, **ENV}).stdout)


def raw_worker(args):
    """Rows through the client alone (no model): each sync step pulls a batch's distinct ids at the
    step's version, then pushes a gradient for each."""
    import numpy as np
    import summa
    from summa.v1 import summa_pb2 as pb
    spec = pb.EmbeddingTableSpec(name="table0", dim=64, num_embeddings=args.big_rows,
                                 initializer=pb.RowInitializer(kind="uniform", a=-0.05, b=0.05),
                                 optimizer=pb.RowOptimizer(name="adagrad", learning_rate=0.05))
    client = summa.Client(args.server, rank=args.rank, world_size=2)
    # A dense model that spans both shards (a job has one); only the table is timed.
    client.join([("dense", (8192,))], np.zeros(8192, np.float32), tables=[spec])
    chunk = np.empty((65536, 64), np.float32)
    if args.rank == 0:
        for first in range(0, args.big_rows, 65536):
            ids = np.arange(first, min(args.big_rows, first + 65536), dtype=np.uint64)
            client.sparse_pull(0, 0, ids, chunk[: len(ids)])
    summa.allreduce(np.zeros(1, np.float32), name="populated", client=client)  # both start with every row there
    rng = np.random.default_rng(args.rank)
    batches = [np.unique((rng.zipf(1.2, args.raw_ids) - 1) % args.big_rows).astype(np.uint64)
               for _ in range(args.raw_steps)]
    rows = [np.empty((len(b), 64), np.float32) for b in batches]
    moved = 0
    began = time.perf_counter()
    for step in range(args.raw_steps):
        client.sparse_pull(0, step, batches[step], rows[step])
        client.sparse_push(0, step, len(batches[step]), batches[step], rows[step])
        moved += 2 * len(batches[step])
    seconds = time.perf_counter() - began
    client.close()
    print("RESULT " + json.dumps({"rank": args.rank, "rows": moved, "seconds": seconds, "loss_first": 1, "loss_last": 0}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200000, help="part 1: rows per table")
    ap.add_argument("--big_rows", type=int, default=10_000_000, help="parts 2 and 3: the big table's rows")
    ap.add_argument("--steps", type=int, default=40, help="DLRM steps per job (5 of warm-up)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--raw_ids", type=int, default=65536, help="part 3: ids per process and step")
    ap.add_argument("--raw_steps", type=int, default=20)
    ap.add_argument("--parts", default="1,2", help="1: against DDP; 2: the big table (and part 3)")
    ap.add_argument("--raw_worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--server", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.raw_worker:
        return raw_worker(args)
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    with tempfile.TemporaryDirectory(prefix="summa-embedding-bench-") as run_dir:
        try:
            print(f"embedding_bench: {' '.join(sys.argv[1:]) or '(defaults)'}; {os.cpu_count()} CPUs", flush=True)
            if "1" in args.parts.split(","):
                part1(run_dir, args)
            if "2" in args.parts.split(","):
                part2_and_3(run_dir, args)
        except BenchError as e:
            print(f"embedding_bench: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
