"""One process of python_client_test's elastic case: a small model trained through summa's
ParameterServerOptimizer, each step's shard taken from opt.shard() (split_batch over the step's
group), each shard written out (step, rank, begin, end, group) for the test to count examples.
With --pause=STEP:FILE it stops before step STEP (the last step's exchange finished) until FILE
exists, so that the test admits a joiner at a step boundary of its choosing."""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

import summa  # noqa: E402


def batch(step, size):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(size, 8, generator=g), torch.randn(size, 4, generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--pause", default="", help="STEP:FILE")
    ap.add_argument("--shards", required=True, help="where to append each step's shard (JSON lines)")
    args = ap.parse_args()
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    summa.init(args.server, rank=args.rank, world_size=args.world)
    opt = summa.ParameterServerOptimizer(model)
    print(f"rank {summa.rank()} joined at step {opt.next_step}", flush=True)
    pause_step, pause_file = (int(args.pause.split(":", 1)[0]), args.pause.split(":", 1)[1]) if args.pause else (-1, "")
    with open(args.shards, "a") as out:
        while opt.next_step < args.steps:
            step = opt.next_step
            if step == pause_step and not os.path.exists(pause_file):
                opt.synchronize()
                print(f"pausing before step {step}", flush=True)
                while not os.path.exists(pause_file):
                    time.sleep(0.02)
            lo, hi = opt.shard(args.batch)
            out.write(json.dumps({"step": step, "rank": summa.rank(), "begin": lo, "end": hi,
                                  "group": opt.group()}) + "\n")
            out.flush()
            x, y = batch(step, args.batch)
            opt.zero_grad()
            opt.num_examples = hi - lo
            torch.nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi], reduction="sum").backward()
            opt.step()
        opt.synchronize()
    summa.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
