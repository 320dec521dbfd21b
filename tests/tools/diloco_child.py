"""One process of python_client_test's DiLoCo case, or (--replay) the whole job in one process.

A process: a small model trained through summa.DiLoCo with a torch inner optimizer (SGD with
momentum 0.9, or Adam) against summa-server --mode=diloco: E exchanges of H local steps (H, the
server's --sync_every, from the join), local step s on this rank's shard (opt.shard) of batch s,
the loss the mean squared error over the shard; then the final flat weights (the outer weights
of the last exchange) go to --out (.npy).

--replay --world=N --H=H --exchanges=E: the same job with no server, written out from the
algorithm: N copies of the model from the same initial weights, each rank with its own inner
optimizer whose state lives across exchanges, local step s of rank r on [r*B//N, (r+1)*B//N) of
batch s (split_batch); after H local steps each rank's pseudo-gradient examples*(anchor - w) in
float32, summed in rank order, and the server's outer optimizer (common/optimizer.cc's
Sgd::Apply with Nesterov) on that sum over the total examples, in numpy float32 operation for
operation as the C++ does it."""
import argparse
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def batch(step, size):
    """Global batch `step` (the job's local-step index, the same on every rank)."""
    g = torch.Generator().manual_seed(2000 + step)
    return torch.randn(size, 8, generator=g), torch.randn(size, 4, generator=g)


def new_model():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def new_inner(args, params):
    if args.inner == "sgd":
        return torch.optim.SGD(params, lr=args.inner_lr or 0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=args.inner_lr or 0.01)


def local_step(model, inner, x, y):
    """One inner step on a shard: the mean loss over it (no server involved)."""
    inner.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    inner.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def set_flat(model, values):
    """The model's parameters set, in place, to the flat `values`."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(values[offset:offset + p.numel()]).view_as(p))
            offset += p.numel()


def run(args):
    import summa
    torch.set_num_threads(1)
    model = new_model()
    inner = new_inner(args, model.parameters())
    summa.init(args.server, rank=args.rank, world_size=args.world)
    opt = summa.DiLoCo(model, inner)
    H = opt.sync_every
    print(f"rank {summa.rank()} joined at exchange {opt.next_step}, H={H}", flush=True)
    for s in range(args.exchanges * H):
        lo, hi = opt.shard(args.batch)
        x, y = batch(s, args.batch)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi]).backward()
        opt.step(num_examples=hi - lo)  # every H-th also exchanges
    assert opt.local_steps == 0, "the last local step was an exchange's"
    print(f"rank {summa.rank()} done: {opt.next_step} exchanges", flush=True)
    np.save(args.out, flat(model))
    summa.shutdown()


def outer_nesterov(w, v, grad_sum, examples, lr, momentum, weight_decay=0.0):
    """common/optimizer.cc, Sgd::Apply with nesterov, in float32 as the C++ computes it: the scale
    1/examples in double, then cast; lr, weight_decay and momentum cast to float; each operation
    rounded to float32 on its own (the build has no FMA contraction). In place on w and v."""
    f = np.float32
    scale, lr, wd, mu = f(1.0 / float(examples)), f(lr), f(weight_decay), f(momentum)
    d = grad_sum * scale + wd * w
    v[:] = mu * v + d
    w -= lr * (d + mu * v)


def replay(args):
    torch.set_num_threads(1)
    N, H, B = args.world, args.H, args.batch
    models = [new_model() for _ in range(N)]  # the same seed: the same initial weights
    inners = [new_inner(args, m.parameters()) for m in models]
    outer = flat(models[0])
    v = np.zeros_like(outer)
    shards = [(r * B // N, (r + 1) * B // N) for r in range(N)]
    for e in range(args.exchanges):
        anchor = outer.copy()
        total = np.zeros_like(outer)
        examples = 0
        for r in range(N):
            lo, hi = shards[r]
            set_flat(models[r], anchor)  # every rank starts the exchange from the outer weights
            for s in range(e * H, (e + 1) * H):
                x, y = batch(s, B)
                local_step(models[r], inners[r], x[lo:hi], y[lo:hi])
            covered = H * (hi - lo)
            total += np.float32(covered) * (anchor - flat(models[r]))
            examples += covered
        outer_nesterov(outer, v, total, examples, args.outer_lr, args.outer_momentum)
    np.save(args.out, outer)
    print(f"replay: {args.exchanges} exchanges of {H} local steps over {N} ranks", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", help="host:port of summa-server --mode=diloco")
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--exchanges", type=int, default=4)
    ap.add_argument("--batch", type=int, default=24, help="the global batch, split over the ranks")
    ap.add_argument("--inner", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--inner_lr", type=float, default=0.0, help="default 0.05 (sgd), 0.01 (adam)")
    ap.add_argument("--out", required=True, help="the final flat weights (.npy)")
    ap.add_argument("--replay", action="store_true", help="the job in this process, no server")
    ap.add_argument("--H", type=int, default=0, help="--replay: the server's --sync_every")
    ap.add_argument("--outer_lr", type=float, default=0.7, help="--replay: the server's --outer_lr")
    ap.add_argument("--outer_momentum", type=float, default=0.9, help="--replay: the server's --outer_momentum")
    args = ap.parse_args()
    if args.replay:
        if args.H < 1:
            ap.error("--replay needs --H")
        replay(args)
    else:
        if not args.server:
            ap.error("--server is needed (or --replay)")
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
