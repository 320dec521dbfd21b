"""One process of tests/embedding_process_test.py: a small recommendation model (an embedding
table of --rows rows looked up by --fields ids per example, an MLP on top) trained through
summa-server, with the table either on the server (--table=sparse: summa.Embedding, pulled and
pushed by row) or a dense parameter like any other (--table=dense: torch.nn.Embedding pushed
whole). Rank r takes examples [r*B/W, (r+1)*B/W) of each global batch; the loss is summed over
the shard. At the end, rank 0 writes the table's rows and the MLP's weights to --dump.

The ids of one rank's shard are distinct within a step (so that a row's gradient is one
example's, summed in the same order both ways), and the two ranks' shards share ids every step
(rows pulled and pushed by both)."""
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
    def __init__(self, table, fields, dim):
        super().__init__()
        torch.manual_seed(11)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(fields * dim, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.table = table
        self.fields, self.dim = fields, dim

    def forward(self, ids, use_table=True):
        if not use_table:  # a step that looks no row up
            return self.mlp(torch.zeros(ids.shape[0], self.fields * self.dim)).squeeze(1)
        return self.mlp(self.table(ids).reshape(ids.shape[0], self.fields * self.dim)).squeeze(1)


def batch(step, size, fields, rows, touched):
    """The global batch of `step`: ids drawn from the first `touched` rows without repeats in
    each half (a rank's shard), the second half a shuffle of the first's ids, and targets."""
    g = torch.Generator().manual_seed(500 + step)
    half = size // 2
    first = torch.randperm(touched, generator=g)[: half * fields].reshape(half, fields)
    second = first.reshape(-1)[torch.randperm(half * fields, generator=g)].reshape(half, fields)
    return torch.cat([first, second]), torch.randn(size, generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--table", choices=["sparse", "dense"], default="sparse")
    ap.add_argument("--optimizer", default="sgd", help="the table's row-wise optimizer (sparse)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--eps", type=float, default=0.0)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--touched", type=int, default=48, help="ids are drawn from the first this many rows")
    ap.add_argument("--dim", type=int, default=4)
    ap.add_argument("--fields", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="train until the job has taken this many steps")
    ap.add_argument("--initial", help="(dense) the table's first rows, from a sparse run's --dump_initial")
    ap.add_argument("--dump_initial", help="(sparse, rank 0) write the table's rows before any step")
    ap.add_argument("--native", type=int, default=1)
    ap.add_argument("--data_plane", default="auto", help="summa.init's: auto, grpc or socket (required)")
    ap.add_argument("--prefetch", type=int, default=1,
                    help="1: prefetch the next batch's ids; 2: ids of the batch after it (never used)")
    ap.add_argument("--skip_odd", action="store_true", help="odd steps look up no row")
    ap.add_argument("--slow_sparse_rank", type=int, default=-1,
                    help="this rank's table calls of even steps wait --slow_sparse seconds before they go")
    ap.add_argument("--slow_sparse", type=float, default=0.05)
    ap.add_argument("--no_leave", action="store_true", help="exit without leaving (the server is killed next)")
    ap.add_argument("--dump", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import summa

    if args.table == "sparse":
        table = summa.Embedding(args.rows, args.dim, name="items", optimizer=args.optimizer, lr=args.lr,
                                init=("uniform", -0.5, 0.5), seed=3, eps=args.eps or None)
    else:
        table = torch.nn.Embedding(args.rows, args.dim)
        with torch.no_grad():
            table.weight.copy_(torch.from_numpy(np.load(args.initial)))
    model = Net(table, args.fields, args.dim)
    client = summa.init(f"{args.server}", rank=args.rank, world_size=args.world, native=bool(args.native),
                        data_plane=args.data_plane)
    opt = summa.ParameterServerOptimizer(model, overlap=False)
    all_ids = torch.arange(args.rows)
    if args.dump_initial and args.rank == 0:
        np.save(args.dump_initial, table.pull(all_ids, min_version=0).numpy())
    lo = args.rank * args.batch // args.world
    hi = (args.rank + 1) * args.batch // args.world
    while opt.next_step < args.steps:
        step = opt.next_step
        ids, y = batch(step, args.batch, args.fields, args.rows, args.touched)
        if args.table == "sparse" and args.prefetch and step + 1 < args.steps:
            ahead = step + args.prefetch
            table.prefetch(batch(ahead, args.batch, args.fields, args.rows, args.touched)[0][lo:hi])
        model.zero_grad()
        loss = ((model(ids[lo:hi], use_table=not (args.skip_odd and step % 2)) - y[lo:hi]) ** 2).sum()
        loss.backward()
        if args.rank == args.slow_sparse_rank and step % 2 == 0:
            # The table's calls run in order on one thread: this holds back the step's push (its
            # dense exchange goes at once), so that the other rank may get ahead of it.
            table._calls.submit(time.sleep, args.slow_sparse)
        opt.step(hi - lo)
    opt.synchronize()
    if args.rank == 0:
        mlp = np.concatenate([p.detach().numpy().reshape(-1) for p in model.mlp.parameters()])
        if args.table == "sparse":
            rows = table.pull(all_ids, min_version=args.steps).numpy()
        else:
            rows = model.table.weight.detach().numpy()
        np.savez(args.dump, rows=rows, mlp=mlp)
        if args.table == "sparse":
            with open(args.dump + ".json", "w") as f:
                json.dump({"rows_pulled": table.rows_pulled, "rows_pushed": table.rows_pushed}, f)
    if args.no_leave:
        client.close()
        os._exit(0)
    summa.shutdown()


if __name__ == "__main__":
    sys.exit(main())
