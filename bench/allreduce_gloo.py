"""One rank of the AllReduce benchmark's gloo row: torch.distributed with the gloo backend.

summa-bench-allreduce starts one of these per rank (never run it by hand unless you start all):

  OMP_NUM_THREADS=1 /usr/bin/python3 bench/allreduce_gloo.py --rank=0 --world=2 \
      --store=/tmp/x/gloo.store --sizes=4096,1048576 --iters=20 --warmup=3 --timeout=120

The ranks meet through a FileStore (--store, a file that must not exist yet). For each size it
fills, times and checks exactly as the C++ ranks do (bench/allreduce_rank.h): element i of rank
r's tensor at iteration k is (r + 1) * ((i + k) % 97 + 1), every element of every result must be
the exact sum, and each all_reduce call is timed alone at each rank. It prints one line per size:

  result bytes=4096 rank=0 correct=yes times_us=12.250,11.875,...[ detail=...]

and the driver takes the median over iterations of the slowest rank. Without torch it prints
"unavailable torch is not installed (...)" and exits 0, and the driver shows that in its table.
"""
import argparse
import os
import sys
import time
from datetime import timedelta

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported, as the C++ ranks use one thread

PERIOD = 97


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, required=True, help="this rank, in [0, world)")
    ap.add_argument("--world", type=int, required=True, help="ranks in the job")
    ap.add_argument("--store", required=True, help="FileStore path the ranks meet through")
    ap.add_argument("--sizes", required=True, help="tensor sizes in bytes, comma-separated")
    ap.add_argument("--iters", type=int, default=20, help="timed all_reduce calls per size")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls before them (still checked)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds gloo waits for the others")
    return ap.parse_args()


def run_size(torch, dist, args, nbytes):
    n = nbytes // 4
    # pattern[k % 97 + i] == (i + k) % 97 + 1 for every i < n.
    pattern = (torch.arange(n + PERIOD, dtype=torch.int64) % PERIOD + 1).to(torch.float32)
    tensor = torch.empty(n, dtype=torch.float32)
    triangle = args.world * (args.world + 1) // 2
    times_us, detail = [], ""
    for k in range(args.warmup + args.iters):
        base = pattern[k % PERIOD:k % PERIOD + n]
        torch.mul(base, args.rank + 1, out=tensor)
        start = time.perf_counter()
        dist.all_reduce(tensor)
        elapsed = time.perf_counter() - start
        if k >= args.warmup:
            times_us.append(elapsed * 1e6)
        if not detail:
            expected = base * triangle
            wrong = (tensor != expected).nonzero()
            if len(wrong) > 0:
                i = int(wrong[0])
                detail = (f"element {i} of iteration {k} is {tensor[i].item():g}, "
                          f"expected {expected[i].item():g}")
    line = (f"result bytes={nbytes} rank={args.rank} correct={'no' if detail else 'yes'} "
            f"times_us={','.join(f'{t:.3f}' for t in times_us)}")
    print(line + (f" detail={detail}" if detail else ""), flush=True)


def main():
    args = parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        print(f"unavailable torch is not installed ({e})", flush=True)
        return 0
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", world_size=args.world,
                            rank=args.rank, timeout=timedelta(seconds=args.timeout))
    for nbytes in (int(s) for s in args.sizes.split(",") if s):
        run_size(torch, dist, args, nbytes)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
