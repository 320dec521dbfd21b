"""Consistency modes side by side: the same LeNet job (2 CPU workers, batch 256, lr 0.2) in sync,
async and ssp modes, run one after another, each for the same number of epochs.

  /usr/bin/python3 bench/modes_bench.py [--epochs 10] [--staleness 2]

Prints a markdown table (seconds per epoch, final test accuracy) and checks that async and ssp
end within 0.02 of sync's accuracy; exits non-zero if not.
"""
import argparse
import shlex
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def run(mode, args):
    server_args = f"--mode={mode}" + (f" --staleness={args.staleness}" if mode == "ssp" else "")
    cmd = [os.path.join(ROOT, "scripts/launch.sh"), "--workers", "2", "--epochs", str(args.epochs),
           "--batch_size", "256", "--lr", "0.2", "--server_args", server_args, "--",
           "--progress=never"]
    if args.train_limit:
        cmd.append(f"--train_limit={args.train_limit}")
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV})
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    secs = [float(s) for s in re.findall(r"([0-9.]+) sec/epoch", p.stdout)]
    accs = [float(a) for a in re.findall(r"test acc ([0-9.]+)", p.stdout)]
    if len(accs) != args.epochs:
        raise RuntimeError(f"expected {args.epochs} epoch lines:\n{p.stdout}")
    shown = shlex.join(cmd).replace(ROOT + "/", "")
    return sum(secs) / len(secs), accs[-1], shown


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--staleness", type=int, default=2)
    ap.add_argument("--train_limit", type=int, default=0)
    args = ap.parse_args()
    rows = []
    for mode in ["sync", "async", "ssp"]:
        print(f"running: {mode} ...", file=sys.stderr, flush=True)
        sec, acc, cmd = run(mode, args)
        print(f"  {sec:.2f} s/epoch, test acc {acc:.3f}", file=sys.stderr, flush=True)
        rows.append((mode, sec, acc, cmd))
    print(f"Command: /usr/bin/python3 bench/modes_bench.py --epochs {args.epochs} "
          f"--staleness {args.staleness}" + (f" --train_limit {args.train_limit}" if args.train_limit else ""))
    print(f"2 CPU workers, LeNet, batch 256, lr 0.2, {args.epochs} epochs, "
          f"{' '.join(f'{k}={v}' for k, v in ENV.items())}\n")
    print("| mode | sec/epoch | test acc | command |")
    print("|---|---:|---:|---|")
    for mode, sec, acc, cmd in rows:
        print(f"| {mode} | {sec:.2f} | {acc:.3f} | `{cmd}` |")
    sync_acc = rows[0][2]
    ok = True
    print()
    for mode, _, acc, _ in rows[1:]:
        within = abs(acc - sync_acc) <= 0.02
        ok = ok and within
        print(f"- {'yes' if within else 'NO '}: {mode} within 0.02 of sync ({acc:.3f} vs {sync_acc:.3f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
