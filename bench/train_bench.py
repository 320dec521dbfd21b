"""Side-by-side benchmark: Summa (1 and 2 CPU workers, and 1 worker with 2 threads) against
PyTorch training the same LeNet
from scratch with the same settings (Debian's python3-torch): one process with 1 thread, one
with as many threads as Summa's 2 workers use, and torch.distributed with gloo, 2 processes of 1
thread. All runs share one environment (below) and run one after another in this process.

  /usr/bin/python3 bench/train_bench.py [--epochs 10] [--train_limit N]

Prints a markdown table: seconds per epoch (the median of the epochs, and their range: this VM's
speed drifts by up to 2x between minutes, and a median shrugs off the epochs a drift caught) and
the final test accuracy,
then checks that every run finished and reached its accuracy (Summa's within 0.02 of PyTorch's
single-process run after the same epochs, issue 15's bound) and the speed targets (issue 15: Summa 1 worker at most
0.4x, 2 workers at most 0.25x PyTorch's 1-thread epoch; 2 threads at least 1.7x 1); exits
non-zero if not.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:"
                      "glibc.malloc.trim_threshold=17179869184",
}


def run(cmd, env_extra=None):
    env = {**os.environ, **ENV, **(env_extra or {})}
    start = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout, time.monotonic() - start


def summa(workers, args, threads=1):
    cmd = [os.path.join(ROOT, "scripts/launch.sh"), "--workers", str(workers), "--epochs",
           str(args.epochs), "--batch_size", "256", "--lr", "0.2", "--", "--progress=never",
           f"--threads={threads}"]
    if args.train_limit:
        cmd.append(f"--train_limit={args.train_limit}")
    out, _ = run(cmd)
    accs = [float(a) for a in re.findall(r"test acc ([0-9.]+)", out)]
    return epoch_seconds(out, args), accs[-1], " ".join(cmd).replace(ROOT + "/", "")


def epoch_seconds(out, args):
    """Every epoch line's seconds, checked to be one per epoch."""
    secs = [float(s) for s in re.findall(r"([0-9.]+) sec/epoch", out)]
    if len(secs) != args.epochs:
        raise RuntimeError(f"expected {args.epochs} epoch lines:\n{out}")
    return secs


def torch_run(mode, threads, args):
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "bench/pytorch_lenet.py"), "--epochs",
           str(args.epochs), "--batch_size", "256", "--lr", "0.2"]
    cmd += ["--ddp", "2"] if mode == "ddp" else ["--threads", str(threads)]
    if args.train_limit:
        cmd.append(f"--train_limit={args.train_limit}")
    env = {"OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    out, _ = run(cmd, env)
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    shown = " ".join(cmd[1:]).replace(ROOT + "/", "")
    return epoch_seconds(out, args), result["test_acc"], f"OPENBLAS_NUM_THREADS={threads} {shown}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--train_limit", type=int, default=0)
    args = ap.parse_args()
    rows = []
    plan = [
        ("PyTorch, 1 process x 1 thread", lambda: torch_run("single", 1, args)),
        ("PyTorch, 1 process x 2 threads", lambda: torch_run("single", 2, args)),
        ("PyTorch DDP (gloo), 2 processes x 1 thread", lambda: torch_run("ddp", 1, args)),
        ("Summa, 1 CPU worker", lambda: summa(1, args)),
        ("Summa, 2 CPU workers", lambda: summa(2, args)),
        ("Summa, 1 CPU worker x 2 threads", lambda: summa(1, args, threads=2)),
    ]
    for name, fn in plan:
        print(f"running: {name} ...", file=sys.stderr, flush=True)
        secs, acc, cmd = fn()
        sec = statistics.median(secs)
        rows.append((name, sec, acc, cmd, secs))
        print(f"  {sec:.2f} s/epoch (median; {min(secs):.2f}-{max(secs):.2f}), test acc {acc:.3f}",
              file=sys.stderr, flush=True)

    print(f"Command: /usr/bin/python3 bench/train_bench.py --epochs {args.epochs}"
          + (f" --train_limit {args.train_limit}" if args.train_limit else ""))
    print(f"Environment (all runs): {' '.join(f'{k}={v}' for k, v in ENV.items())}; "
          f"{os.cpu_count()} CPUs; LeNet, batch 256, lr 0.2, {args.epochs} epochs\n")
    print("| run | sec/epoch (median) | epochs' range | test acc | command |")
    print("|---|---:|---:|---:|---|")
    for name, sec, acc, cmd, secs in rows:
        print(f"| {name} | {sec:.2f} | {min(secs):.2f}-{max(secs):.2f} | {acc:.3f} | `{cmd}` |")

    by = {name: (sec, acc) for name, sec, acc, _, _ in rows}
    torch1 = by["PyTorch, 1 process x 1 thread"]
    torch2 = by["PyTorch, 1 process x 2 threads"]
    ddp = by["PyTorch DDP (gloo), 2 processes x 1 thread"]
    s1, s2 = by["Summa, 1 CPU worker"], by["Summa, 2 CPU workers"]
    s1t2 = by["Summa, 1 CPU worker x 2 threads"]
    checks = [
        ("Summa 1 worker faster than PyTorch 1 thread", s1[0] < torch1[0]),
        ("Summa 2 workers faster than PyTorch 2 threads", s2[0] < torch2[0]),
        ("Summa 2 workers faster than PyTorch DDP 2x1", s2[0] < ddp[0]),
        ("Summa 2 workers at most half of PyTorch 1 thread", s2[0] <= torch1[0] / 2),
        ("Summa 1 worker accuracy within 0.02 of PyTorch (issue 15)", abs(s1[1] - torch1[1]) <= 0.02),
        ("Summa 2 workers accuracy within 0.02 of PyTorch (issue 15)", abs(s2[1] - torch1[1]) <= 0.02),
        ("Summa 1 worker at most 0.4x PyTorch 1 thread (issue 15)", s1[0] <= 0.4 * torch1[0]),
        ("Summa 2 workers at most 0.25x PyTorch 1 thread (issue 15)", s2[0] <= 0.25 * torch1[0]),
        ("Summa 1 worker x 2 threads at least 1.7x 1 thread (issue 15)", s1[0] >= 1.7 * s1t2[0]),
        ("Summa 1 worker x 2 threads accuracy within 0.02 of PyTorch", abs(s1t2[1] - torch1[1]) <= 0.02),
    ]
    print()
    for what, ok in checks:
        print(f"- {'yes' if ok else 'NO '}: {what}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
