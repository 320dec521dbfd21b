"""LeNet on one GPU, side by side: Summa with 1 worker and with 2 workers sharing the GPU
(--device=cuda:0), each with its exchange after the step (--overlap=false) and overlapped with
the step's layers (--overlap=true), and PyTorch training the same network from scratch on the same GPU
(bench/pytorch_lenet.py --device cuda, its data uploaded once). Batch 256, lr 0.2, the seed's
settings; every run one after another in this process, with the same environment.

  python3 bench/gpu_bench.py [--epochs 10] [--bin build] [--data_dir DIR] [--profile]

--bin: the folder with server/summa-server and worker/summa-worker (scripts/gpu-check.sh passes
the unpacked bundle's). --profile: also one short Summa run under Nsight Compute (ncu), whose
per-kernel time summary is printed after the table. Prints a markdown table (seconds per epoch:
the mean over epochs 2..E, the first paying for cuBLAS's and the allocator's start; and the
test accuracy after the last epoch), then checks that every run finished every epoch on the GPU
and that Summa's 1-worker epoch is under 0.5 s; exits non-zero if any check fails.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from train_bench import ENV, run  # noqa: E402  (one environment for every benchmark)


def epochs_of(out, want):
    secs = [float(s) for s in re.findall(r"([0-9.]+) sec/epoch", out)]
    accs = [float(a) for a in re.findall(r"test acc ([0-9.]+)", out)]
    if len(secs) != want or len(accs) != want:
        raise RuntimeError(f"expected {want} epoch lines:\n{out}")
    steady = secs[1:] or secs
    return sum(steady) / len(steady), accs[-1], secs


def summa(workers, args, launch_prefix=(), worker_flags=()):
    cmd = [args.launch, "--bin", args.bin, "--workers", str(workers), "--epochs", str(args.epochs),
           "--batch_size", "256", "--lr", "0.2", "--", "--device=cuda:0", "--progress=never",
           f"--data_dir={args.data_dir}", *worker_flags]
    out, _ = run([*launch_prefix, *cmd])
    on = re.findall(r"^epoch \d+/\d+: .* on \[(.*)\]$", out, re.M)
    if len(on) != args.epochs or any("cuda:0" not in d or "cpu" in d for d in on):
        raise RuntimeError(f"Summa with {workers} worker(s) did not train on cuda:0 every epoch:\n{out}")
    return (*epochs_of(out, args.epochs), " ".join(cmd).replace(ROOT + "/", ""))


def torch_gpu(args):
    cmd = [args.python, os.path.join(ROOT, "bench/pytorch_lenet.py"), "--device", "cuda",
           "--epochs", str(args.epochs), "--batch_size", "256", "--lr", "0.2",
           f"--data_dir={args.data_dir}"]
    out, _ = run(cmd)
    sec, acc, secs = epochs_of(out, args.epochs)
    return sec, acc, secs, " ".join(cmd[1:]).replace(ROOT + "/", "")


def launch_one(args, epochs, extra=()):
    return [args.launch, "--bin", args.bin, "--workers", "1", "--epochs", str(epochs), "--batch_size",
            "256", "--lr", "0.2", *extra, "--", "--device=cuda:0", "--progress=never",
            f"--data_dir={args.data_dir}"]


def trace(args):
    """Two epochs of 1 worker with timelines (launch.sh --trace_dir): where a step's time goes
    (compute, exchange, load on the worker; the server's spans), by bench/trace_summary.py."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        cmd = launch_one(args, 2, ["--trace_dir", d])
        run(cmd)
        files = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".json"))
        out, _ = run([sys.executable, os.path.join(ROOT, "bench/trace_summary.py"), *files])
    return " ".join(cmd).replace(ROOT + "/", ""), out


def kernel_table(text):
    """ncu's per-kernel summary as rows (kernel, grid, invocations, mean us), largest total first."""
    rows = []
    pattern = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), .*Invocations (\d+)\n"
                         r"(?:.*\n){1,6}?\s+gpu__time_duration.sum\s+(\S+)\s+[\d.,]+\s+[\d.,]+\s+([\d.,]+)", re.M)
    scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "nsecond": 1e-3}
    for m in pattern.finditer(text):
        name = re.sub(r"\(.*", "", m.group(1)).replace("summa::<unnamed>::", "").replace("void ", "")
        mean = float(m.group(10).replace(",", "")) * scale.get(m.group(9), float("nan"))
        rows.append((name[:60], f"{m.group(2)}x{m.group(3)}x{m.group(4)}", int(m.group(8)), mean))
    return sorted(rows, key=lambda r: -r[2] * r[3])


def profile(args):
    """One epoch of 1 worker under ncu: kernels 2000..2449 (steps well past the first), each timed
    alone on the GPU; the per-kernel summary of gpu__time_duration, per step."""
    ncu = shutil.which("ncu") or next((p for p in ["/usr/local/cuda/bin/ncu"] if os.path.exists(p)), None)
    if ncu is None:
        print("profile: ncu is not installed here", file=sys.stderr)
        return None
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--launch-skip", "2000",
           "--launch-count", "450", "--metrics", "gpu__time_duration.sum", "--print-summary",
           "per-kernel", *launch_one(args, 1)]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV})
    return " ".join(cmd).replace(ROOT + "/", ""), p.returncode, p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build"))
    ap.add_argument("--launch", default=os.path.join(ROOT, "scripts/launch.sh"))
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--python", default=sys.executable, help="a python3 with PyTorch built for CUDA")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.epochs < 2:
        ap.error("--epochs must be at least 2 (the first epoch is not counted)")

    rows = []
    plan = [("Summa, 1 worker on cuda:0", lambda: summa(1, args, worker_flags=["--overlap=false"])),
            ("Summa, 1 worker on cuda:0, --overlap=true", lambda: summa(1, args, worker_flags=["--overlap=true"])),
            ("Summa, 2 workers sharing cuda:0", lambda: summa(2, args, worker_flags=["--overlap=false"])),
            ("Summa, 2 workers sharing cuda:0, --overlap=true", lambda: summa(2, args, worker_flags=["--overlap=true"])),
            ("PyTorch on cuda:0 (one process)", lambda: torch_gpu(args))]
    failures = []
    for name, fn in plan:
        print(f"running: {name} ...", file=sys.stderr, flush=True)
        try:
            sec, acc, secs, cmd = fn()
        except RuntimeError as e:
            failures.append(f"{name}: {e}")
            print(f"  failed: {e}", file=sys.stderr, flush=True)
            continue
        rows.append((name, sec, acc, secs, cmd))
        print(f"  {sec:.3f} s/epoch, test acc {acc:.3f}, epochs {secs}", file=sys.stderr, flush=True)

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else "?"
    print(f"Command: python3 bench/gpu_bench.py --epochs {args.epochs}" + (" --profile" if args.profile else ""))
    print(f"Environment (all runs): {' '.join(f'{k}={v}' for k, v in ENV.items())}; {os.cpu_count()} CPUs; "
          f"GPU {gpu}; LeNet, batch 256, lr 0.2, {args.epochs} epochs\n")
    print("| run | sec/epoch (mean of epochs 2..E) | epoch 1 | test acc | command |")
    print("|---|---:|---:|---:|---|")
    for name, sec, acc, secs, cmd in rows:
        print(f"| {name} | {sec:.3f} | {secs[0]:.2f} | {acc:.3f} | `{cmd}` |")
    by = {name: (sec, acc) for name, sec, acc, _, _ in rows}
    one = by.get("Summa, 1 worker on cuda:0")
    torch_one = by.get("PyTorch on cuda:0 (one process)")
    checks = [("every run finished every epoch (on cuda:0 for Summa)", not failures),
              ("Summa 1 worker under 0.5 s/epoch", one is not None and one[0] < 0.5),
              ("Summa 1 worker faster per epoch than PyTorch's one process (reported, not required)",
               one is not None and torch_one is not None and one[0] < torch_one[0])]
    print()
    for what, ok in checks:
        print(f"- {'yes' if ok else 'NO '}: {what}")
    for f in failures:
        print(f"  - {f}")
    if args.profile:
        try:
            cmd, text = trace(args)
            print(f"\nWhere a step's time goes (milliseconds): `{cmd}`, then bench/trace_summary.py\n```")
            print(text.strip())
            print("```")
        except RuntimeError as e:
            print(f"\ntrace run failed: {e}")
        result = profile(args)
        if result is not None:
            cmd, rc, text = result
            rows = kernel_table(text)
            steps = max((inv for name, _, inv, _ in rows if "SoftmaxCrossEntropy" in name), default=0)
            print(f"\nPer-kernel GPU time (ncu exit {rc}, {steps} steps profiled): `{cmd}`\n")
            print("| kernel | grid | launches | mean us | us per step |")
            print("|---|---|---:|---:|---:|")
            for name, grid, inv, mean in rows:
                print(f"| `{name}` | {grid} | {inv} | {mean:.2f} | {inv * mean / max(steps, 1):.1f} |")
            total = sum(inv * mean for _, _, inv, mean in rows) / max(steps, 1)
            print(f"| all kernels | | | | {total:.1f} |")
            if not rows:
                print("ncu printed no kernel summary:\n```\n" + text[-6000:] + "\n```")
    return 0 if all(ok for what, ok in checks if "not required" not in what) else 1


if __name__ == "__main__":
    sys.exit(main())
