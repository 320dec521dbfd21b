"""Compressed gradients side by side: the same LeNet job (2 CPU workers, batch 256, lr 0.2) with
each wire format, run one after another for the same number of epochs:

  fp32 (the default), bf16, fp16, and top-k at a few ratios (fp32 and bf16 values).

  /usr/bin/python3 bench/wire_bench.py [--epochs 10] [--train_limit N]

For each it prints the bytes a step moved (from the server's own count, logged at shutdown: the
bytes of every push received and every reply with weights sent, over the steps taken), the
seconds per epoch and the final test accuracy. It checks that the server's byte counts are the
wire format's exact sizes, and that bf16 ends within 0.01 of fp32's accuracy; exits non-zero if
not. What top-k costs in accuracy is reported, not checked.
"""
import argparse
import math
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
# LeNet: 20*9 + 20 + 50*20*25 + 50 + 800*128 + 128 + 128*10 + 10 parameters, one partition.
PARAMS = 129068
WORKERS = 2
CHOICES = [
    ("fp32", "--wire_dtype=fp32 --compress=none"),
    ("bf16", "--wire_dtype=bf16"),
    ("fp16", "--wire_dtype=fp16"),
    ("top-k 10%", "--compress=topk:0.1"),
    ("top-k 1%", "--compress=topk:0.01"),
    ("bf16 + top-k 1%", "--wire_dtype=bf16 --compress=topk:0.01"),
]


def expected_bytes(server_args):
    """Bytes one worker's push and one reply carry under these flags."""
    value = 2 if ("bf16" in server_args or "fp16" in server_args) else 4
    m = re.search(r"topk:([0-9.]+)", server_args)
    if m:
        k = max(1, min(PARAMS, math.ceil(float(m.group(1)) * PARAMS)))  # as TopKCount rounds
        return k * (4 + value), PARAMS * value
    return PARAMS * value, PARAMS * value


def run(name, server_args, args):
    cmd = [os.path.join(ROOT, "scripts/launch.sh"), "--workers", str(WORKERS), "--epochs", str(args.epochs),
           "--batch_size", "256", "--lr", "0.2", "--server_args", server_args, "--", "--progress=never"]
    if args.train_limit:
        cmd.append(f"--train_limit={args.train_limit}")
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV})
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    out = p.stdout + p.stderr
    secs = [float(s) for s in re.findall(r"([0-9.]+) sec/epoch", out)]
    accs = [float(a) for a in re.findall(r"test acc ([0-9.]+)", out)]
    if len(accs) != args.epochs:
        raise RuntimeError(f"expected {args.epochs} epoch lines:\n{out}")
    run_dir = re.search(r"logs in (\S+)", out).group(1)
    with open(os.path.join(run_dir, "server.log")) as f:
        log = f.read()
    m = re.search(r"stopped: (\d+) pushes \((\d+) bytes in\), (\d+) replies with weights \((\d+) bytes out\)", log)
    if not m:
        raise RuntimeError(f"no totals in {run_dir}/server.log:\n{log}")
    pushes, bytes_in, replies, bytes_out = map(int, m.groups())
    steps = pushes // WORKERS  # sync: every worker pushes every step (one partition)
    shown = shlex.join(cmd).replace(ROOT + "/", "")
    # The first epoch pays for start-up (data loading, first touch): report the mean of the rest.
    sec = sum(secs[1:]) / max(1, len(secs) - 1) if len(secs) > 1 else secs[0]
    return dict(name=name, args=server_args, steps=steps, pushes=pushes, bytes_in=bytes_in, replies=replies,
                bytes_out=bytes_out, sec=sec, acc=accs[-1], cmd=shown)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--train_limit", type=int, default=0)
    args = ap.parse_args()
    rows = []
    for name, server_args in CHOICES:
        print(f"running: {name} ...", file=sys.stderr, flush=True)
        r = run(name, server_args, args)
        print(f"  {r['sec']:.2f} s/epoch, test acc {r['acc']:.3f}", file=sys.stderr, flush=True)
        rows.append(r)
    print(f"Command: /usr/bin/python3 bench/wire_bench.py --epochs {args.epochs}"
          + (f" --train_limit {args.train_limit}" if args.train_limit else ""))
    print(f"{WORKERS} CPU workers, LeNet ({PARAMS} parameters), batch 256, lr 0.2, {args.epochs} epochs, "
          f"{' '.join(f'{k}={v}' for k, v in ENV.items())}; each job's launch command is "
          f"`scripts/launch.sh --workers {WORKERS} --epochs {args.epochs} --batch_size 256 --lr 0.2 "
          f"--server_args '<server flags>' -- --progress=never`\n")
    base = rows[0]
    base_step = (base["bytes_in"] + base["bytes_out"]) / base["steps"]
    print("| wire format | server flags | bytes pushed per worker-step | bytes pulled per worker-step "
          "| bytes per step (all workers) | vs fp32 | sec/epoch (epochs 2+) | test acc | vs fp32 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        per_step = (r["bytes_in"] + r["bytes_out"]) / r["steps"]
        print(f"| {r['name']} | `{r['args']}` | {r['bytes_in'] / r['pushes']:,.0f} | "
              f"{r['bytes_out'] / r['replies']:,.0f} | {per_step:,.0f} | {per_step / base_step:.3f}x | "
              f"{r['sec']:.2f} | {r['acc']:.3f} | {r['acc'] - base['acc']:+.3f} |")
    print()
    ok = True
    for r in rows:
        push, pull = expected_bytes(r["args"])
        exact = r["bytes_in"] == r["pushes"] * push and r["bytes_out"] == r["replies"] * pull
        ok &= exact
        print(f"- {'yes' if exact else 'NO'}: {r['name']} moved exactly its format's bytes "
              f"({push:,} per push, {pull:,} per reply; {r['pushes']} pushes, {r['replies']} replies, "
              f"{r['steps']} steps)")
    bf16 = next(r for r in rows if r["name"] == "bf16")
    close = abs(bf16["acc"] - base["acc"]) <= 0.01
    ok &= close
    print(f"- {'yes' if close else 'NO'}: bf16 within 0.01 of fp32's test accuracy "
          f"({bf16['acc']:.3f} vs {base['acc']:.3f})")
    for r in rows[3:]:
        print(f"- {r['name']}: test accuracy {r['acc'] - base['acc']:+.3f} against fp32 after {args.epochs} epochs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
