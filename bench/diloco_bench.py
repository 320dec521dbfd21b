"""DiLoCo against the sync job (issue 34, part 3): LeNet and the MLP on Fashion-MNIST, each trained
in one run as the sync job (the repo's main job: sgd, lr 0.2, batch 256) and as DiLoCo with H=10
and H=50 (the same sgd as the inner optimizer, the paper's outer Nesterov, lr 0.7, momentum 0.9),
with the same workers, global batch, epochs and seed. One job after another, through
scripts/launch.sh.

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 bench/diloco_bench.py \\
      [--workers 4] [--epochs 10] [--H 10,50] [--models lenet,mlp]

Prints one markdown table: bytes moved per epoch (the server's value bytes in + out, from its
stop line "stopped: N pushes (B bytes in), M replies with weights (B bytes out)"), exchanges per
epoch, bytes against sync, test accuracy after every epoch (the full test set, every row) and
seconds per epoch (information only: noisy on a shared machine). Exits non-zero unless every job
exited 0, each ran what it was asked (mode, H, optimizers, from the join lines), its pushes are
workers x epochs x ceil(batches/H) (the sync job: every batch), its bytes are its pushes and
replies times the model's fp32 bytes (the replies: one a push, and each worker's first pull at
its join), each DiLoCo row's exchange bytes (less those first pulls) are exactly
ceil(batches/H)/batches of sync's and its total bytes within --bytes_tolerance of that, and each
DiLoCo row's last test accuracy is at least the sync job's less --acc_tolerance.
"""
import argparse
import gzip
import math
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
DATA = "/usr/share/datasets/fashion-mnist"
STOP = re.compile(r"stopped: (\d+) pushes \((\d+) bytes in\), (\d+) replies with weights \((\d+) bytes out\)")
EPOCH = re.compile(r"epoch (\d+)/(\d+): loss ([0-9.naif]+), test acc ([0-9.]+), ([0-9.]+) sec/epoch")


class BenchError(Exception):
    pass


def train_count(train_limit):
    """Training examples a worker uses: the IDX labels file's count, or --train_limit below it."""
    path = os.path.join(DATA, "train-labels-idx1-ubyte.gz")
    with gzip.open(path, "rb") as f:
        magic, count = struct.unpack(">II", f.read(8))
    if magic != 0x801:
        raise BenchError(f"{path}: not an IDX labels file (magic {magic:#x})")
    return min(count, train_limit) if train_limit else count


def run_job(model, h, args, run_dir):
    """One job through scripts/launch.sh; h=0 is the sync job. Returns its measured row."""
    cmd = [os.path.join(ROOT, "scripts/launch.sh"), "--workers", str(args.workers), "--epochs",
           str(args.epochs), "--batch_size", str(args.batch_size), "--lr", str(args.lr),
           "--run_dir", run_dir]
    worker = ["--progress=never", f"--model={model}", f"--seed={args.seed}"]
    if h:
        cmd += ["--server_args", f"--mode=diloco --sync_every={h} --outer_optimizer=nesterov "
                f"--outer_lr={args.outer_lr} --outer_momentum={args.outer_momentum}"]
        # launch.sh gives a DiLoCo job's --lr to the workers as --inner_lr.
        worker += ["--inner_optimizer=sgd", f"--inner_momentum={args.inner_momentum}"]
        if args.inner_lr is not None:
            worker.append(f"--inner_lr={args.inner_lr}")
    if args.train_limit:
        worker.append(f"--train_limit={args.train_limit}")
    cmd += ["--"] + worker
    shown = shlex.join(cmd).replace(ROOT + "/", "").replace(" --run_dir " + run_dir, "")
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV},
                           timeout=args.job_timeout)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{shown}: still running after {args.job_timeout} s (logs in {run_dir})") from e
    wall = time.monotonic() - start
    if p.returncode != 0:
        raise BenchError(f"{shown} exited {p.returncode} (logs in {run_dir}):\n{p.stdout}\n{p.stderr}")
    if f"launch: all {args.workers} workers finished" not in p.stdout:
        raise BenchError(f"{shown}: no 'all workers finished' line:\n{p.stdout}")
    log = p.stdout  # rank 0's stdout: its join line and epoch lines (its stderr: worker0.log)
    server = open(os.path.join(run_dir, "server.log")).read()

    # What ran is what was asked for.
    joined = re.search(r"rank 0 of (\d+) joined at step 0 \(model (\w+), ([^)]*)\)", log)
    if not joined or int(joined[1]) != args.workers or joined[2] != model:
        raise BenchError(f"{shown}: no join line for {model} with {args.workers} workers:\n{log}")
    inner_lr = args.lr if args.inner_lr is None else args.inner_lr
    if h:
        want = f"diloco mode, {h} local steps of sgd(lr={inner_lr:g}, momentum={args.inner_momentum:g}"
        outer = (f"diloco mode ({h} local steps between exchanges), sgd(lr={args.outer_lr:g}, "
                 f"momentum={args.outer_momentum:g}, nesterov")
        if outer not in server:
            raise BenchError(f"{shown}: the server did not start '{outer}':\n{server[:600]}")
    else:
        want = "sync mode"
        if f"sync mode, sgd(lr={args.lr:g}, momentum=0," not in server:
            raise BenchError(f"{shown}: the server did not start sync sgd lr {args.lr:g}:\n{server[:600]}")
    if not joined[3].startswith(want):
        raise BenchError(f"{shown}: joined as '{joined[3]}', expected '{want}...'")

    epochs = [m for m in EPOCH.finditer(log)]
    if [int(m[1]) for m in epochs] != list(range(1, args.epochs + 1)):
        raise BenchError(f"{shown}: expected epoch lines 1..{args.epochs}:\n{log}")
    stop = STOP.search(server)
    params = re.search(r"(\d+) parameters in (\d+) partitions", server)
    if not stop or not params:
        raise BenchError(f"{shown}: no stop line or model line in the server's log:\n{server[-2000:]}")
    pushes, bytes_in, replies, bytes_out = (int(x) for x in stop.groups())
    model_bytes = 4 * int(params[1])
    if int(params[2]) != 1:
        raise BenchError(f"{shown}: the model is in {params[2]} partitions; the byte checks assume 1")
    return {
        "model": model, "h": h, "cmd": shown, "wall": wall,
        "accs": [float(m[4]) for m in epochs], "secs": [float(m[5]) for m in epochs],
        "pushes": pushes, "replies": replies, "bytes_in": bytes_in, "bytes_out": bytes_out,
        "model_bytes": model_bytes,
    }


def check(rows, args, batches):
    """The checks, as (ok, line) pairs."""
    out = []
    w, e = args.workers, args.epochs
    for r in rows:
        name = f"{r['model']} {'sync' if not r['h'] else 'H=' + str(r['h'])}"
        exchanges = math.ceil(batches / r["h"]) if r["h"] else batches
        want = w * e * exchanges
        out.append((r["pushes"] == want,
                    f"{name}: {r['pushes']} pushes = {w} workers x {e} epochs x {exchanges} exchanges ({want})"))
        ok = r["bytes_in"] == r["pushes"] * r["model_bytes"] and r["bytes_out"] == r["replies"] * r["model_bytes"]
        out.append((ok, f"{name}: bytes in/out = pushes/replies ({r['pushes']}/{r['replies']}) x "
                        f"{r['model_bytes']} (the model in fp32)"))
        out.append((r["replies"] == r["pushes"] + w,
                    f"{name}: replies = pushes + {w} (one reply to each push, and each worker's pull at its join)"))
    for model in args.models:
        sync = next(r for r in rows if r["model"] == model and not r["h"])
        for r in rows:
            if r["model"] != model or not r["h"]:
                continue
            exchanges = math.ceil(batches / r["h"])
            expected = exchanges / batches
            # The exchanges' bytes alone (less the joins' first pulls) are exactly ceil(batches/H)
            # of every batch's; the totals differ from that by the joins' w pulls.
            moved = r["bytes_in"] + r["bytes_out"] - w * r["model_bytes"]
            base = sync["bytes_in"] + sync["bytes_out"] - w * sync["model_bytes"]
            out.append((moved * batches == base * exchanges,
                        f"{model} H={r['h']}: the exchanges' bytes (less the joins' pulls) are exactly "
                        f"ceil({batches}/{r['h']})/{batches} = {expected:.4f} of sync's (1/H = {1 / r['h']:.4f})"))
            ratio = r["bytes_epoch"] / sync["bytes_epoch"]
            out.append((abs(ratio / expected - 1) <= args.bytes_tolerance,
                        f"{model} H={r['h']}: all bytes {ratio:.4f} of sync's, within {args.bytes_tolerance:.0%} "
                        f"of {expected:.4f}"))
            acc, base = r["accs"][-1], sync["accs"][-1]
            out.append((acc >= base - args.acc_tolerance,
                        f"{model} H={r['h']}: last test acc {acc:.3f} >= sync's {base:.3f} - {args.acc_tolerance}"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch_size", type=int, default=256, help="global batch (every job)")
    ap.add_argument("--lr", type=float, default=0.2, help="sync: the server's sgd lr; DiLoCo: the inner sgd lr")
    ap.add_argument("--H", default="10,50", help="DiLoCo's sync_every values, comma-separated")
    ap.add_argument("--models", default="lenet,mlp")
    ap.add_argument("--inner_lr", type=float, default=None, help="DiLoCo's inner lr if not --lr")
    ap.add_argument("--inner_momentum", type=float, default=0.0, help="0: the sync job's plain sgd")
    ap.add_argument("--outer_lr", type=float, default=0.7)
    ap.add_argument("--outer_momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train_limit", type=int, default=0, help="0: the full training set")
    ap.add_argument("--acc_tolerance", type=float, default=0.02)
    ap.add_argument("--bytes_tolerance", type=float, default=0.02)
    ap.add_argument("--job_timeout", type=int, default=900)
    args = ap.parse_args(sys.argv[1:])
    args.models = [m for m in args.models.split(",") if m]
    hs = [int(h) for h in args.H.split(",") if h]
    n = train_count(args.train_limit)
    batches = math.ceil(n / args.batch_size)

    rows = []
    keep = tempfile.mkdtemp(prefix="diloco-bench.")
    began = time.monotonic()
    try:
        for model in args.models:
            for h in [0] + hs:
                label = f"{model} {'sync' if not h else f'diloco H={h}'}"
                print(f"running: {label} ...", file=sys.stderr, flush=True)
                r = run_job(model, h, args, os.path.join(keep, f"{model}-{h or 'sync'}"))
                r["bytes_epoch"] = (r["bytes_in"] + r["bytes_out"]) / args.epochs
                print(f"  {r['wall']:.0f} s, test acc {' '.join(f'{a:.3f}' for a in r['accs'])}",
                      file=sys.stderr, flush=True)
                rows.append(r)
    except BenchError as e:
        print(f"diloco_bench: {e}", file=sys.stderr)
        return 1
    total = time.monotonic() - began

    inner_lr = args.lr if args.inner_lr is None else args.inner_lr
    argv = shlex.join(sys.argv[1:])
    print(f"Command: {' '.join(f'{k}={v}' for k, v in ENV.items())} /usr/bin/python3 bench/diloco_bench.py"
          + (f" {argv}" if argv else ""))
    print(f"{args.workers} CPU workers, global batch {args.batch_size}, {args.epochs} epochs of {n} "
          f"Fashion-MNIST examples ({batches} batches), seed {args.seed}, test accuracy on the 10000 "
          f"test examples after each epoch. sync: server sgd lr {args.lr:g}, momentum 0. DiLoCo: inner "
          f"sgd lr {inner_lr:g}, momentum {args.inner_momentum:g} on each worker; outer Nesterov lr "
          f"{args.outer_lr:g}, momentum {args.outer_momentum:g} on the server. {total:.0f} s in all.\n")
    print("| model | mode | H | bytes/epoch | exchanges/epoch | bytes vs sync | test acc after epoch 1.."
          f"{args.epochs} | last acc | s/epoch |")
    print("|---|---|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        sync = next(s for s in rows if s["model"] == r["model"] and not s["h"])
        exchanges = r["pushes"] / (args.workers * args.epochs)
        print(f"| {r['model']} | {'diloco' if r['h'] else 'sync'} | {r['h'] or 1} | "
              f"{r['bytes_epoch'] / 1e6:.1f} MB | {exchanges:g} | {r['bytes_epoch'] / sync['bytes_epoch']:.4f} | "
              f"{' '.join(f'{a:.3f}' for a in r['accs'])} | {r['accs'][-1]:.3f} | "
              f"{sum(r['secs']) / len(r['secs']):.2f} |")
    print("\nbytes/epoch: (bytes in + bytes out) / epochs from the server's stop line (value bytes, "
          "1 MB = 1e6; no framing), including each worker's first pull at its join. s/epoch: rank 0's "
          "mean, on a shared 2-core machine.\n")
    print("Jobs:")
    for r in rows:
        print(f"- `{r['cmd']}`")
    ok = True
    print("\nChecks:")
    for good, line in check(rows, args, batches):
        ok = ok and good
        print(f"- {'yes' if good else 'NO '}: {line}")
    print(f"\nlogs: {keep}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
