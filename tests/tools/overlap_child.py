"""One process of tests/python_overlap_test.py: a small MLP trained through summa (or, with
--reference, on one process with no server), its final weights and what the overlap did each
step written out for the test to judge.

The model: Linear(8,32) Tanh [Linear(32,32) frozen, with --frozen] Linear(32,32) Tanh Linear(32,4),
and with --unused a Linear(4,4) that the forward never calls. The loss is summed over the
shard's examples; the server (or the reference) divides by the global batch.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self, frozen, unused):
        super().__init__()
        torch.manual_seed(7)
        self.inp = torch.nn.Linear(8, 32)
        self.frozen = torch.nn.Linear(32, 32) if frozen else None
        if frozen:
            self.frozen.requires_grad_(False)
        self.mid = torch.nn.Linear(32, 32)
        self.out = torch.nn.Linear(32, 4)
        self.unused = torch.nn.Linear(4, 4) if unused else None

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        if self.frozen is not None:
            h = self.frozen(h)
        return self.out(torch.tanh(self.mid(h)))


def batch(step, size):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(size, 8, generator=g), torch.randn(size, 4, generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server")
    ap.add_argument("--world", type=int, default=1, help="processes (members, or local processes)")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--optimizer", choices=["ps", "distributed"], default="ps")
    ap.add_argument("--op", default="sum", help="DistributedOptimizer's op")
    ap.add_argument("--overlap", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="the global batch")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--accumulate", type=int, default=1, help="backwards per step (the first ones in no_sync)")
    ap.add_argument("--frozen", action="store_true")
    ap.add_argument("--unused", action="store_true")
    ap.add_argument("--groups", action="store_true", help="two param groups (the inner SGD's lr halved for one)")
    ap.add_argument("--set_to_none", action="store_true",
                    help="model.zero_grad(set_to_none=True) (torch 2's default): backward makes new .grad tensors")
    ap.add_argument("--params_only", action="store_true", help="give the optimizer parameters, not the model")
    ap.add_argument("--delay_rank", type=int, default=-1)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds --delay_rank sleeps before each backward")
    ap.add_argument("--local_group", type=int, default=0, help="gloo port: hierarchical on one host")
    ap.add_argument("--data_plane", default="auto", help="summa.init's: auto (the socket plane here) or grpc")
    ap.add_argument("--device", default="cpu", help="where the model lives (cuda: the GPU path)")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--dump", required=True)
    ap.add_argument("--record", default=None, help="a JSON of each step's timeline and forward starts")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = Net(args.frozen, args.unused).to(args.device)
    trained = [p for p in model.parameters() if p.requires_grad]

    def groups(lr):
        if not args.groups:
            return [{"params": trained, "lr": lr}]
        first = [model.inp.weight, model.inp.bias]
        rest = [p for p in trained if all(p is not q for q in first)]
        return [{"params": first, "lr": lr / 2}, {"params": rest, "lr": lr}]

    import summa
    local = None
    if args.local_group:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.local_group}",
                                world_size=args.world, rank=args.rank)
        local = dist.new_group(list(range(args.world)))
    if args.reference:
        opt = torch.optim.SGD(groups(args.lr), lr=args.lr)
        world, rank = 1, 0
    else:
        server_world = 1 if local is not None else args.world
        summa.init(args.server, rank=0 if local is not None else args.rank, world_size=server_world,
                   data_plane=args.data_plane)
        world, rank = args.world, args.rank
        if args.optimizer == "ps":
            opt = summa.ParameterServerOptimizer(trained if args.params_only else model, overlap=bool(args.overlap),
                                                 local_group=local)
        else:
            inner = torch.optim.SGD(groups(args.lr / args.batch), lr=args.lr / args.batch)
            opt = summa.DistributedOptimizer(inner, model, op=args.op, overlap=bool(args.overlap),
                                             bucket_bytes=1024, local_group=local)
            if args.op == "average":
                # Each rank's mean loss averaged over the ranks: the whole batch's mean.
                for g in inner.param_groups:
                    g["lr"] *= args.batch
    forward_starts = {}
    if args.record:
        for name, m in model.named_modules():
            if any(True for _ in m.parameters(recurse=False)):
                def began(*_, name=name):  # returns None: a pre-hook's value would replace the input
                    forward_starts.setdefault(name, time.monotonic_ns())
                m.register_forward_pre_hook(began)
    steps = []
    for step in range(args.steps):
        x, y = (t.to(args.device) for t in batch(step, args.batch))
        lo, hi = rank * args.batch // world, (rank + 1) * args.batch // world
        x, y = x[lo:hi], y[lo:hi]
        opt.zero_grad()
        if args.set_to_none:
            model.zero_grad(set_to_none=True)
        forward_starts.clear()
        micro = np.array_split(np.arange(hi - lo), args.accumulate)
        if not args.reference and args.optimizer == "ps":
            opt.num_examples = hi - lo
        for k, idx in enumerate(micro):
            idx = torch.from_numpy(idx).to(args.device)
            loss = ((model(x[idx]) - y[idx]) ** 2).sum()
            if args.optimizer == "distributed" and args.op == "average" and not args.reference:
                loss = loss / (hi - lo)
            if args.reference:
                loss = loss / args.batch
            if rank == args.delay_rank:
                time.sleep(args.delay)
            if k < len(micro) - 1 and hasattr(opt, "no_sync"):
                with opt.no_sync():
                    loss.backward()
            else:
                loss.backward()
        if args.record:
            # opt.timeline() is the last finished step's: step - 1, finished as this backward began.
            steps.append({"forward_starts": dict(forward_starts), "timeline": opt.timeline(),
                          "step_called_ns": time.monotonic_ns()})
        opt.step()
    if hasattr(opt, "synchronize"):
        opt.synchronize()
    np.save(args.dump, torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy())
    if args.record:
        layout = {}
        if hasattr(opt, "flat"):
            where = {id(p): i for i, p in enumerate(opt.flat.params)}
            for name, m in model.named_modules():
                own = [where[id(p)] for p in m.parameters(recurse=False) if id(p) in where]
                if own:
                    layout[name] = [[int(opt.flat.offsets[i]), int(opt.flat.sizes[i])] for i in own]
        partitions = [[p.offset, p.length] for p in getattr(opt, "partitions", [])]
        with open(args.record, "w") as f:
            json.dump({"steps": steps, "modules": layout, "partitions": partitions}, f)
    if not args.reference:
        summa.shutdown()
    if args.local_group:
        # Torch 1.13's gloo, left to the interpreter's exit, can abort it ("terminate called
        # without an active exception"): its threads go first, here.
        import torch.distributed as dist
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
