#!/usr/bin/env python3
"""The overlapped step side by side: the same LeNet job (batch 256, lr 0.2, sync) with
summa-worker --overlap=true and --overlap=false: 2 CPU workers in LeNet's default single
partition (4 MiB: nothing can overlap) and cut into 8 partitions of 64 KiB
(--partition_bytes=65536: each goes as backward finishes its layers, and the next forward waits
per layer); and 1 worker in 8 partitions, which leaves the server and the exchange a core of
their own. The runs alternate, round after round (every other round in reverse order), so that
this VM's drift (up to 2x between minutes) falls on all of them alike.

  /usr/bin/python3 bench/overlap_bench.py [--epochs 1] [--rounds 4] [--train_limit N]

Prints a markdown table: seconds per epoch (the median over every epoch of every round, and
their range); from the workers' timelines (--trace_dir), a step's compute and the exchange it
leaves exposed (the spans the trainer's thread spends on it: exchange and load, or with overlap
exchange and the forward's per-layer waits), in ms per step, the median of the runs' means over
both workers; and each run's final test accuracy. Checks what it times: in sync mode overlapped
and blocking steps give the same weights bit for bit, so every round's accuracies must agree
exactly between --overlap=true and --overlap=false at the same partitioning; exits non-zero if
not.
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
RUNS = [  # (name, workers, partition bytes, --overlap)
    ("2 workers, 1 partition (4 MiB), blocking", 2, 4 << 20, False),
    ("2 workers, 1 partition (4 MiB), overlapped", 2, 4 << 20, True),
    ("2 workers, 8 partitions (64 KiB), blocking", 2, 65536, False),
    ("2 workers, 8 partitions (64 KiB), overlapped", 2, 65536, True),
    ("1 worker, 8 partitions (64 KiB), blocking", 1, 65536, False),
    ("1 worker, 8 partitions (64 KiB), overlapped", 1, 65536, True),
]
PAIRS = [(RUNS[i][0], RUNS[i + 1][0]) for i in range(0, len(RUNS), 2)]  # (blocking, overlapped)


def per_step(trace_dir, workers):
    """(compute, exposed exchange) in ms per step, the mean over the workers' timelines."""
    compute, exposed = [], []
    for r in range(workers):
        with open(os.path.join(trace_dir, f"worker{r}.json")) as f:
            events = json.load(f)["traceEvents"]
        total = {}
        for e in events:
            if e.get("ph") == "X":
                total[e["name"]] = total.get(e["name"], 0.0) + e["dur"] / 1000.0
        steps = sum(1 for e in events if e.get("name") == "compute")
        waited = total.get("wait", 0.0)  # overlapped: inside compute
        compute.append((total["compute"] - waited) / steps)
        exposed.append((total.get("exchange", 0.0) + total.get("load", 0.0) + waited) / steps)
    return statistics.mean(compute), statistics.mean(exposed)


def run(workers, partition_bytes, overlap, args):
    trace_dir = tempfile.mkdtemp(prefix="overlap-bench.")
    cmd = [os.path.join(ROOT, "scripts/launch.sh"), "--workers", str(workers), "--epochs", str(args.epochs),
           "--batch_size", "256", "--lr", "0.2", "--server_args", f"--partition_bytes={partition_bytes}",
           "--trace_dir", trace_dir, "--", "--progress=never", f"--overlap={'true' if overlap else 'false'}"]
    if args.train_limit:
        cmd.append(f"--train_limit={args.train_limit}")
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV})
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    secs = [float(s) for s in re.findall(r"([0-9.]+) sec/epoch", p.stdout)]
    accs = [float(a) for a in re.findall(r"test acc ([0-9.]+)", p.stdout)]
    if len(secs) != args.epochs or len(accs) != args.epochs:
        raise RuntimeError(f"expected {args.epochs} epoch lines:\n{p.stdout}")
    if ("overlapped)" in p.stdout) != overlap:
        raise RuntimeError(f"the join line does not say whether the worker overlaps:\n{p.stdout}")
    shown = shlex.join(cmd).replace(ROOT + "/", "").replace(trace_dir, "DIR")
    return secs, accs[-1], per_step(trace_dir, workers), shown


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--train_limit", type=int, default=0)
    args = ap.parse_args()
    secs = {run_[0]: [] for run_ in RUNS}
    accs = {run_[0]: [] for run_ in RUNS}
    steps = {run_[0]: [] for run_ in RUNS}
    cmds = {}
    start = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    load = os.getloadavg()[1]  # what else ran on the VM: its 5-minute load, before and after
    for r in range(args.rounds):
        for name, workers, partition_bytes, overlap in (RUNS if r % 2 == 0 else RUNS[::-1]):
            print(f"round {r + 1}/{args.rounds}: {name} ...", file=sys.stderr, flush=True)
            s, acc, step, cmds[name] = run(workers, partition_bytes, overlap, args)
            secs[name] += s
            accs[name].append(acc)
            steps[name].append(step)
            print(f"  {' '.join(f'{x:.2f}' for x in s)} s/epoch, compute {step[0]:.1f} ms and exchange "
                  f"{step[1]:.1f} ms a step, test acc {acc:.3f}", file=sys.stderr, flush=True)
    end = time.strftime("%H:%M", time.gmtime())

    print(f"Command: /usr/bin/python3 bench/overlap_bench.py --epochs {args.epochs} --rounds {args.rounds}"
          + (f" --train_limit {args.train_limit}" if args.train_limit else ""))
    print(f"Sync mode, LeNet, batch 256, lr 0.2, {args.epochs} epochs x {args.rounds} rounds, "
          f"{' '.join(f'{k}={v}' for k, v in ENV.items())}; {os.cpu_count()} CPUs; {start}-{end} UTC; "
          f"load average (5 min) {load:.1f} before, {os.getloadavg()[1]:.1f} after\n")
    print("| run | sec/epoch (median) | epochs' range | compute (ms/step) | exchange exposed (ms/step) "
          "| test acc (each round) | command |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, *_ in RUNS:
        s = secs[name]
        compute = statistics.median(c for c, _ in steps[name])
        exposed = statistics.median(e for _, e in steps[name])
        print(f"| {name} | {statistics.median(s):.2f} | {min(s):.2f}-{max(s):.2f} | {compute:.1f} | {exposed:.1f} | "
              f"{' '.join(f'{a:.3f}' for a in accs[name])} | `{cmds[name]}` |")
    print()
    ok = True
    for blocking, overlapped in PAIRS:
        same = accs[blocking] == accs[overlapped]
        ok &= same
        print(f"- {'yes' if same else 'NO '}: {overlapped} reaches the blocking run's accuracy exactly "
              f"(the same weights)")
    for blocking, overlapped in PAIRS:
        b, o = statistics.median(secs[blocking]), statistics.median(secs[overlapped])
        eb = statistics.median(e for _, e in steps[blocking])
        eo = statistics.median(e for _, e in steps[overlapped])
        print(f"- {overlapped}: {o / b:.2f}x the blocking run's epoch, {eo / eb:.2f}x its exposed exchange")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
