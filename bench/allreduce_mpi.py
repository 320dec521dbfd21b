"""The ranks of the AllReduce benchmark's mpi rows: Open MPI's MPI_Allreduce through mpi4py.

summa-bench-allreduce runs it under mpirun, once over TCP and once over shared memory (never run
it by hand except under mpirun, as the driver does):

  mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl self,tcp \
      --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
      /usr/bin/python3 bench/allreduce_mpi.py --sizes=4096,1048576 --iters=20 --warmup=3

(`--mca btl self,vader`: shared memory.) For each size every rank fills, times and checks exactly
as the C++ ranks do (bench/allreduce_rank.h): element i of rank r's tensor at iteration k is
(r + 1) * ((i + k) % 97 + 1), every element of every result must be the exact sum, and each
Allreduce (in place, as gloo's all_reduce) is timed alone at each rank. Each rank prints one line
per size (rank 0 prints them all):

  result bytes=4096 rank=0 correct=yes times_us=12.250,11.875,...[ detail=...]

and the driver takes the median over iterations of the slowest rank. Without mpi4py it prints
"unavailable mpi4py is not installed (...)" and exits 0, and the driver shows that in its table.
"""
import argparse
import os
import sys
import time

PERIOD = 97


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", required=True, help="tensor sizes in bytes, comma-separated")
    ap.add_argument("--iters", type=int, default=20, help="timed Allreduce calls per size")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls before them (still checked)")
    return ap.parse_args()


def run_size(np, MPI, comm, args, nbytes):
    n = nbytes // 4
    rank, world = comm.Get_rank(), comm.Get_size()
    # pattern[k % 97 + i] == (i + k) % 97 + 1 for every i < n.
    pattern = (np.arange(n + PERIOD, dtype=np.int64) % PERIOD + 1).astype(np.float32)
    tensor = np.empty(n, dtype=np.float32)
    expected = np.empty(n, dtype=np.float32)
    triangle = np.float32(world * (world + 1) // 2)
    times_us, detail = [], ""
    for k in range(args.warmup + args.iters):
        base = pattern[k % PERIOD:k % PERIOD + n]
        np.multiply(base, np.float32(rank + 1), out=tensor)
        start = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, tensor, op=MPI.SUM)
        elapsed = time.perf_counter() - start
        if k >= args.warmup:
            times_us.append(elapsed * 1e6)
        if not detail:
            np.multiply(base, triangle, out=expected)
            wrong = np.flatnonzero(tensor != expected)
            if wrong.size > 0:
                i = int(wrong[0])
                detail = f"element {i} of iteration {k} is {tensor[i]:g}, expected {expected[i]:g}"
    line = (f"result bytes={nbytes} rank={rank} correct={'no' if detail else 'yes'} "
            f"times_us={','.join(f'{t:.3f}' for t in times_us)}")
    line += f" detail={detail}" if detail else ""
    # Rank 0 prints every rank's line: mpirun forwards the ranks' output in pieces that may
    # interleave mid-line.
    lines = comm.gather(line, root=0)
    if rank == 0:
        print("\n".join(lines), flush=True)


def die_with_parent():
    """Asks Linux to end this rank with SIGKILL when its parent (mpirun) dies, so that a driver
    that has to kill mpirun leaves no rank behind."""
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() == 1:  # the parent was already gone
            os._exit(1)
    except (OSError, AttributeError):
        pass


def main():
    die_with_parent()
    args = parse_args()
    try:
        import numpy as np
        from mpi4py import MPI
    except ImportError as e:
        print(f"unavailable mpi4py is not installed ({e})", flush=True)
        return 0
    comm = MPI.COMM_WORLD
    for nbytes in (int(s) for s in args.sizes.split(",") if s):
        run_size(np, MPI, comm, args, nbytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
