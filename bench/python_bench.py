"""Side-by-side benchmark of the Python client: 2 processes training through summa-server
against the same 2 processes with PyTorch DDP (gloo), one after the other in one run.

  /usr/bin/python3 bench/python_bench.py [--epochs 10] [--train_limit N] [--resnet_steps 8]

1. LeNet on Fashion-MNIST (batch 256, lr 0.2, the seed's update): python/examples/pytorch_lenet.py
   through scripts/launch.sh --python (ParameterServerOptimizer: the server applies SGD) against
   bench/pytorch_lenet.py --ddp 2 (the same model, initial weights and data order; every gradient
   summed by gloo's allreduce). Seconds per epoch (mean) and test accuracy after the last epoch.
2. python/examples/synthetic_resnet.py (ResNet-18 shape, 11.2 M parameters, batch 16 per process)
   through Summa against --ddp 2: seconds per step (mean after 2 warm-up steps), split into
   compute and exchange (under DDP the allreduce overlaps backward, so its "exchange" is what is
   left after backward).

Prints a markdown table with the command behind each row, then checks that every run finished
and that Summa's LeNet accuracy is within 0.01 of DDP's (the two follow the same trajectory up
to the order of float sums); exits non-zero if not. Not a test: nothing here runs in CI.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def run(cmd):
    start = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV}, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    lines = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} printed no RESULT line:\n{p.stdout[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):]), time.monotonic() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--train_limit", type=int, default=0)
    ap.add_argument("--resnet_steps", type=int, default=8)
    args = ap.parse_args()
    limit = [f"--train_limit={args.train_limit}"] if args.train_limit else []
    lenet = ["--epochs", str(args.epochs), "--batch_size", "256"]
    rows = []

    cmd = ["scripts/launch.sh", "--python", "python/examples/pytorch_lenet.py", "--workers", "2",
           *lenet, "--lr", "0.2", "--", *limit]
    summa_lenet, _ = run(cmd)
    rows.append(("LeNet, Summa (ParameterServerOptimizer), 2 processes", summa_lenet, cmd))
    cmd = ["/usr/bin/python3", "bench/pytorch_lenet.py", "--ddp", "2", *lenet, "--lr", "0.2", *limit]
    ddp_lenet, _ = run(cmd)
    rows.append(("LeNet, PyTorch DDP (gloo), 2 processes", ddp_lenet, cmd))

    steps = ["--steps", str(args.resnet_steps), "--warmup", "2"]
    cmd = ["scripts/launch.sh", "--python", "python/examples/synthetic_resnet.py", "--workers", "2",
           "--server_args", "--lr=0.05", "--", *steps]
    summa_resnet, _ = run(cmd)
    rows.append(("ResNet-18 shape (11.2 M), Summa (ParameterServerOptimizer), 2 processes", summa_resnet, cmd))
    cmd = ["/usr/bin/python3", "python/examples/synthetic_resnet.py", "--ddp", "2", *steps]
    ddp_resnet, _ = run(cmd)
    rows.append(("ResNet-18 shape (11.2 M), PyTorch DDP (gloo), 2 processes", ddp_resnet, cmd))

    print(f"Environment: {' '.join(f'{k}={v}' for k, v in ENV.items())}; {os.cpu_count()} CPUs; "
          f"LeNet batch 256, lr 0.2, {args.epochs} epochs"
          f"{f', first {args.train_limit} examples' if args.train_limit else ''}; "
          f"ResNet {args.resnet_steps} steps (2 warm-up), batch 16 per process\n")
    print("| run | sec/epoch | test acc | sec/step (compute + exchange) | command |")
    print("|---|---:|---:|---:|---|")
    for name, r, cmd in rows:
        epoch = f"{r['sec_per_epoch']:.2f}" if "sec_per_epoch" in r else ""
        acc = f"{r['test_acc']:.3f}" if "test_acc" in r else ""
        step = (f"{r['step_seconds']:.3f} ({r['compute_seconds']:.3f} + {r['exchange_seconds']:.3f})"
                if "step_seconds" in r else "")
        print(f"| {name} | {epoch} | {acc} | {step} | `{' '.join(cmd)}` |")
    checks = [
        ("Summa LeNet accuracy within 0.01 of DDP's", abs(summa_lenet["test_acc"] - ddp_lenet["test_acc"]) <= 0.01),
        ("Summa LeNet not slower per epoch than DDP", summa_lenet["sec_per_epoch"] <= ddp_lenet["sec_per_epoch"]),
        ("Summa ResNet not slower per step than DDP", summa_resnet["step_seconds"] <= ddp_resnet["step_seconds"]),
    ]
    print()
    for what, ok in checks:
        print(f"- {'yes' if ok else 'NO '}: {what}")
    # Speed is reported, not required (the machine is shared); the accuracy is the correctness check.
    return 0 if checks[0][1] else 1


if __name__ == "__main__":
    sys.exit(main())
