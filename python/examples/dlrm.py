"""A DLRM-shaped recommendation model on synthetic click data, its embedding tables held by row
on summa-server (summa.EmbeddingBag) or, for comparison, torch.nn.EmbeddingBag(sparse=True) in
every process under DDP (gloo).

The model: dense features through a bottom MLP to `dim`; each of `tables` sparse features looks
up `ids_per_field` ids (a Zipf-skewed draw over `rows` rows: a few ids are hot, most are rare, as
in click logs) and sums their rows; the bottom MLP's output and the pooled rows go, concatenated,
through a top MLP to one logit; the loss is the binary cross-entropy against a click drawn from a
hidden model of the same features, summed over the process's examples.

  scripts/launch.sh --python python/examples/dlrm.py --workers 2 --shards 2 -- --rows 1000000 --steps 50
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 python/examples/dlrm.py --ddp 2 --rows 1000000

Through Summa the dense layers train with the server's optimizer (ParameterServerOptimizer: its
--optimizer and --lr) and the tables with their row-wise one (--table_optimizer, --table_lr);
each step's rows for the next batch are prefetched while this one computes. Under DDP, SGD with
--table_lr steps the tables (sparse gradients) and --lr the dense layers. Prints each --log_every
steps and a RESULT {json}: the step time, rows pulled and pushed per second, and this process's
peak memory (ru_maxrss) and how much of it came after the first step began (the rows and the
batches: what the tables cost the worker, past Python, torch and the model).
"""
import argparse
import json
import os
import resource
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DLRM(torch.nn.Module):
    def __init__(self, tables, dense_features, dim):
        super().__init__()
        torch.manual_seed(5)
        self.bottom = mlp([dense_features, 64, dim])
        self.tables = torch.nn.ModuleList(tables)
        self.top = mlp([dim * (1 + len(tables)), 64, 1])

    def forward(self, dense, ids, offsets):
        pooled = [t(ids[i], offsets) for i, t in enumerate(self.tables)]
        return self.top(torch.cat([self.bottom(dense)] + pooled, dim=1)).squeeze(1)


class Clicks:
    """Synthetic examples: dense features N(0, 1), ids Zipf(alpha) over `rows` (folded into range),
    clicks from a hidden linear model of the dense features and of a per-id score."""

    def __init__(self, args, rank):
        self.args = args
        self.rng = np.random.default_rng(1234 + rank)
        self.weights = np.random.default_rng(99).standard_normal(args.dense_features).astype(np.float32)

    def batch(self, size):
        a = self.args
        dense = self.rng.standard_normal((size, a.dense_features)).astype(np.float32)
        ids = (self.rng.zipf(a.zipf, (a.tables, size * a.ids_per_field)) - 1) % a.rows
        score = dense @ self.weights + np.sin(ids.astype(np.float64) * 0.37).reshape(a.tables, size, -1).sum((0, 2))
        clicks = (self.rng.random(size) < 1 / (1 + np.exp(-score))).astype(np.float32)
        offsets = torch.arange(0, size * a.ids_per_field, a.ids_per_field)
        return torch.from_numpy(dense), torch.from_numpy(ids.astype(np.int64)), offsets, torch.from_numpy(clicks)


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(args, model, step_fn, rank, tables_pulled):
    data = Clicks(args, rank)
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="sum")
    batches = [data.batch(args.batch_size)]
    times, losses = [], []
    rows_before = tables_pulled()
    baseline = peak_mib()  # Python, torch, the model and the client, before any row
    start = None
    for step in range(args.steps):
        if step == args.warmup:
            start = time.perf_counter()
            rows_before = tables_pulled()
        began = time.perf_counter()
        batches.append(data.batch(args.batch_size))
        dense, ids, offsets, clicks = batches.pop(0)
        loss = step_fn(model, loss_fn, (dense, ids, offsets, clicks), batches[0])
        times.append(time.perf_counter() - began)
        losses.append(loss / args.batch_size)
        if rank == 0 and (step + 1) % args.log_every == 0:
            print(f"step {step + 1}/{args.steps}: loss {np.mean(losses[-args.log_every:]):.4f}, "
                  f"{np.mean(times[-args.log_every:]) * 1e3:.1f} ms/step, peak {peak_mib():.0f} MiB", flush=True)
    elapsed = time.perf_counter() - start if start is not None else float("nan")
    timed = max(1, args.steps - args.warmup)
    return {"step_ms": 1e3 * elapsed / timed, "rows_per_s": (tables_pulled() - rows_before) / elapsed,
            "peak_mib": peak_mib(), "growth_mib": peak_mib() - baseline, "loss_first": float(losses[0]), "loss_last": float(np.mean(losses[-5:]))}


def run_summa(args):
    import summa
    tables = [summa.EmbeddingBag(args.rows, args.dim, mode="sum", name=f"table{i}", optimizer=args.table_optimizer,
                                 lr=args.table_lr, init=("uniform", -0.05, 0.05), seed=i)
              for i in range(args.tables)]
    model = DLRM(tables, args.dense_features, args.dim)
    summa.init(args.server, rank=args.rank, world_size=args.world_size)
    opt = summa.ParameterServerOptimizer(model, num_examples=args.batch_size)
    rank = summa.rank()
    populated = populate(tables, args) if args.populate and rank == 0 else None

    def step(model, loss_fn, batch, next_batch):
        dense, ids, offsets, clicks = batch
        if args.prefetch:
            for i, t in enumerate(tables):
                t.prefetch(next_batch[1][i])
        model.zero_grad()
        loss = loss_fn(model(dense, ids, offsets), clicks)
        loss.backward()
        opt.step(len(clicks))
        return loss.item()

    result = train(args, model, step, rank, lambda: sum(t.rows_pulled + t.rows_pushed for t in tables))
    if populated is not None:
        result["populate_rows_per_s"] = populated
    summa.shutdown()
    return rank, result


def populate(tables, args, chunk=16384):
    """Creates every row of every table (pulls each once, in chunks), before the first step: the
    table is then as large as declared, not only the rows that batches touch. Rows per second."""
    began = time.perf_counter()
    for t in tables:
        for first in range(0, args.rows, chunk):
            t.pull(torch.arange(first, min(args.rows, first + chunk)), min_version=0)
            if first // chunk % 160 == 0:
                print(f"populate {t.spec.name}: {first:,} of {args.rows:,} rows", flush=True)
    rate = len(tables) * args.rows / (time.perf_counter() - began)
    print(f"populated {len(tables)} table(s) of {args.rows:,} rows: {rate:,.0f} rows/s", flush=True)
    return rate


def run_ddp(args, rank, world, port):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tables = [torch.nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=True) for _ in range(args.tables)]
    for t in tables:
        torch.nn.init.uniform_(t.weight, -0.05, 0.05)
    model = torch.nn.parallel.DistributedDataParallel(DLRM(tables, args.dense_features, args.dim))
    table_params = [t.weight for t in tables]
    dense_params = [p for p in model.parameters() if all(p is not q for q in table_params)]
    # The tables' optimizer as Summa's row-wise one (torch's sparse rules), the dense layers' SGD.
    sparse_opt = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad,
                  "adam": torch.optim.SparseAdam}[args.table_optimizer](table_params, lr=args.table_lr)
    dense_opt = torch.optim.SGD(dense_params, lr=args.lr)
    moved = [0]

    def step(model, loss_fn, batch, next_batch):
        dense, ids, offsets, clicks = batch
        dense_opt.zero_grad()
        sparse_opt.zero_grad()
        loss = loss_fn(model(dense, ids, offsets), clicks)
        # DDP averages the processes' gradients: each one's mean makes the global batch's mean,
        # what Summa's server takes (the summed gradient over the examples pushed).
        (loss / len(clicks)).backward()
        dense_opt.step()
        sparse_opt.step()
        moved[0] += 2 * sum(len(torch.unique(i)) for i in ids)  # rows read and written, as Summa counts them
        return loss.item()

    result = train(args, model, step, rank, lambda: moved[0])
    dist.destroy_process_group()
    return rank, result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=None, help="host:port of every shard, comma-separated (default $SUMMA_SERVER)")
    ap.add_argument("--rank", type=int, default=None, help="default $RANK")
    ap.add_argument("--world_size", type=int, default=None, help="default $WORLD_SIZE, else 1")
    ap.add_argument("--ddp", type=int, default=0, help="run this many processes under DDP (gloo) instead")
    ap.add_argument("--tables", type=int, default=3, help="sparse features, a table each")
    ap.add_argument("--rows", type=int, default=100000, help="rows per table")
    ap.add_argument("--dim", type=int, default=64, help="floats per row")
    ap.add_argument("--ids_per_field", type=int, default=4, help="ids each example looks up in each table")
    ap.add_argument("--zipf", type=float, default=1.2, help="the ids' Zipf exponent (> 1)")
    ap.add_argument("--dense_features", type=int, default=13)
    ap.add_argument("--batch_size", type=int, default=512, help="examples per process and step")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    ap.add_argument("--lr", type=float, default=0.05, help="the dense layers' SGD (DDP; Summa: the server's --lr)")
    ap.add_argument("--table_optimizer", default="adagrad", choices=["sgd", "adagrad", "adam"])
    ap.add_argument("--table_lr", type=float, default=0.05)
    ap.add_argument("--prefetch", type=int, default=1, help="pull the next batch's rows during this step")
    ap.add_argument("--populate", action="store_true",
                    help="Summa: rank 0 creates every row (pulls each once) before the first step")
    ap.add_argument("--log_every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.zipf <= 1:
        ap.error("--zipf must be above 1")
    torch.set_num_threads(args.threads)
    if args.ddp:
        if args.port == 0:
            import socket
            import subprocess
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            argv = [a for a in sys.argv[1:]]
            procs = [subprocess.Popen([sys.executable, __file__, *argv, f"--port={port}", f"--rank={r}"])
                     for r in range(args.ddp)]
            sys.exit(max(p.wait() for p in procs))
        rank, result = run_ddp(args, args.rank, args.ddp, args.port)
        mode = "ddp"
    else:
        rank, result = run_summa(args)
        mode = "summa"
    result.update(mode=mode, rank=rank, rows=args.rows, dim=args.dim, tables=args.tables,
                  table_mib=args.tables * args.rows * args.dim * 4 / 2**20)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
