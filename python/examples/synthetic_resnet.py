"""A ResNet-18-shaped model (11.2 M parameters, 45 MiB of float32) on synthetic data, trained
through summa-server with ParameterServerOptimizer (or DistributedOptimizer): a model of the size
people train, so that the data path (11 partitions of 4 MiB each way per step) is what is timed.

  build/server/summa-server --workers=2 --lr=0.05 &
  RANK=0 python3 synthetic_resnet.py --world_size=2 & RANK=1 python3 synthetic_resnet.py --world_size=2
  scripts/launch.sh --python python/examples/synthetic_resnet.py --workers 2 -- --steps=20

Each step draws a fixed random batch (seeded by rank and step), so the loss is meaningless; the
printout is the step time, split into compute (forward and backward) and exchange (the step()
through Summa). BatchNorm's running statistics stay local to each process. --ddp N runs the same
with torch DDP (gloo) instead, for comparison (no server).
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        h = self.b2(self.c2(h))
        return F.relu(h + (x if self.skip is None else self.skip(x)))


class ResNet18(torch.nn.Module):
    """ResNet-18 for 32x32 inputs (CIFAR's stem): 11,173,962 parameters with 10 classes."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(64), torch.nn.ReLU())
        layers, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
            cin = cout
        self.layers = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(512, classes)

    def forward(self, x):
        h = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=None)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--world_size", type=int, default=None)
    ap.add_argument("--optimizer", choices=["ps", "distributed"], default="ps")
    ap.add_argument("--lr", type=float, default=0.05, help="--optimizer=distributed")
    ap.add_argument("--ddp", type=int, default=0, help="torch DDP (gloo) with N processes instead")
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the timing")
    ap.add_argument("--batch_size", type=int, default=16, help="per process")
    ap.add_argument("--image_size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.ddp and args.port == 0:
        return launch_ddp(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ResNet18()
    params = sum(p.numel() for p in model.parameters())

    if args.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                world_size=args.ddp, rank=args.rank)
        rank, world = args.rank, args.ddp
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    else:
        import summa
        summa.init(args.server, rank=args.rank, world_size=args.world_size)
        rank, world = summa.rank(), summa.world_size()
        net = model
        if args.optimizer == "ps":
            opt = summa.ParameterServerOptimizer(model.named_parameters())
            rank = summa.rank()
        else:
            summa.broadcast_parameters(model)
            opt = summa.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr), model)
    if rank == 0:
        print(f"ResNet-18 shape: {params:,} parameters ({params * 4 / 2**20:.1f} MiB), {world} processes, "
              f"batch {args.batch_size} per process", flush=True)

    compute = exchange = 0.0
    timed = 0
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g)
        y = torch.randint(0, 10, (args.batch_size,), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()  # under DDP the gradient allreduce overlaps this
        t1 = time.perf_counter()
        opt.step()  # mean loss: each process counts once (ParameterServerOptimizer's default)
        t2 = time.perf_counter()
        if step >= args.warmup:
            compute += t1 - t0
            exchange += t2 - t1
            timed += 1
        if rank == 0:
            print(f"step {step + 1}/{args.steps}: loss {loss.item():.3f}, {t2 - t0:.3f} s "
                  f"(compute {t1 - t0:.3f}, exchange {t2 - t1:.3f})", flush=True)
    if rank == 0 and timed:
        print("RESULT " + json.dumps({"params": params, "processes": world,
                                      "how": "ddp-gloo" if args.ddp else f"summa-{args.optimizer}",
                                      "step_seconds": (compute + exchange) / timed,
                                      "compute_seconds": compute / timed,
                                      "exchange_seconds": exchange / timed}), flush=True)
    if not args.ddp:
        summa.shutdown()
    return 0


def launch_ddp(args):
    import socket
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [a for a in sys.argv[1:] if not a.startswith("--rank")]
    procs = [subprocess.Popen([sys.executable, __file__, *argv, f"--rank={r}", f"--port={port}"])
             for r in range(args.ddp)]
    try:
        return max(p.wait() for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    sys.exit(main())
