"""The seed's LeNet on Fashion-MNIST in PyTorch, trained through summa-server.

Each process computes the gradient of its shard of every global minibatch (the seed's
split_batch: the loss summed over the shard's examples) and the server applies its optimizer to
the sum divided by the examples pushed, so N processes follow one process's trajectory on the
whole batch. The three Summa lines are marked.

  build/server/summa-server --workers=2 --lr=0.2 &
  RANK=0 python3 pytorch_lenet.py --server=127.0.0.1:50051 --world_size=2 &
  RANK=1 python3 pytorch_lenet.py --server=127.0.0.1:50051 --world_size=2
  scripts/launch.sh --python python/examples/pytorch_lenet.py --workers 2 --epochs 10

--optimizer=distributed trains with summa.DistributedOptimizer (local SGD on gradients summed
through AllReduce) instead; --reference trains one process on the whole batch with no server
(what the tests hold Summa to). A restarted process resumes at the step the server is at.

--optimizer=diloco trains with summa.DiLoCo against a DiLoCo server: each process steps its own
torch optimizer (--inner, at --lr) on the mean loss of its shard, and every H-th step (the
server's --sync_every) exchanges its pseudo-gradient for the server's outer weights; an epoch's
end exchanges too (opt.sync(), a fourth Summa line), so that its evaluation is of the outer
weights. The data position is the loop's own count of steps: a restarted diloco process starts
the data over (resuming where the job is, is --optimizer=ps's).

  build/server/summa-server --workers=2 --mode=diloco --sync_every=10 &
  RANK=0 python3 pytorch_lenet.py --world_size=2 --optimizer=diloco --inner=adamw --lr=1e-3 &
  RANK=1 python3 pytorch_lenet.py --world_size=2 --optimizer=diloco --inner=adamw --lr=1e-3

Set OPENBLAS_NUM_THREADS and OMP_NUM_THREADS before starting Python.
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import summa


def load(data_dir, split, limit):
    def read(name):
        path = os.path.join(data_dir, name)
        gz = os.path.exists(path + ".gz")
        with (gzip.open(path + ".gz") if gz else open(path, "rb")) as f:
            return f.read()
    images = np.frombuffer(read(f"{split}-images-idx3-ubyte"), np.uint8, offset=16)
    labels = np.frombuffer(read(f"{split}-labels-idx1-ubyte"), np.uint8, offset=8)
    images = images.reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
    if limit:
        images, labels = images[:limit], labels[:limit]
    return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))


class LeNet(torch.nn.Module):
    """The seed's LeNet: its parameters in the seed's order and names (W1, b1, ... b4), the
    initial weights N(0, 0.01^2) and zero biases as bench/pytorch_lenet.py draws them."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        scale = 0.01
        self.W1 = torch.nn.Parameter(torch.randn(20, 1, 3, 3) * scale)
        self.b1 = torch.nn.Parameter(torch.zeros(20))
        self.W2 = torch.nn.Parameter(torch.randn(50, 20, 5, 5) * scale)
        self.b2 = torch.nn.Parameter(torch.zeros(50))
        self.W3 = torch.nn.Parameter(torch.randn(800, 128) * scale)
        self.b3 = torch.nn.Parameter(torch.zeros(128))
        self.W4 = torch.nn.Parameter(torch.randn(128, 10) * scale)
        self.b4 = torch.nn.Parameter(torch.zeros(10))

    def forward(self, X):
        h = F.avg_pool2d(F.relu(F.conv2d(X, self.W1, self.b1)), 2)
        h = F.avg_pool2d(F.relu(F.conv2d(h, self.W2, self.b2)), 2)
        h = F.relu(h.reshape(h.shape[0], -1) @ self.W3 + self.b3)
        return h @ self.W4 + self.b4


class LocalSGD:
    """--reference: the seed's update on one process, p -= lr * grad / batch."""

    def __init__(self, model, lr):
        self.params, self.lr, self.next_step, self.live_ranks = list(model.parameters()), lr, 0, [0]
        self.num_examples = 1

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def shard(self, batch_size):
        return 0, batch_size  # one process: the whole batch

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p -= self.lr * p.grad / self.num_examples
        self.next_step += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=None, help="host:port (default $SUMMA_SERVER)")
    ap.add_argument("--rank", type=int, default=None, help="default $RANK, $JOB_COMPLETION_INDEX")
    ap.add_argument("--world_size", type=int, default=None, help="default $WORLD_SIZE, else 1")
    ap.add_argument("--token_file", default=None)
    ap.add_argument("--tls_ca", default=None)
    ap.add_argument("--optimizer", choices=["ps", "distributed", "diloco"], default="ps",
                    help="ps: the server's optimizer; distributed: local SGD (--lr) on gradients "
                         "summed through AllReduce; diloco: DiLoCo against summa-server --mode=diloco, "
                         "--inner at --lr taking the local steps on each shard's mean loss, an exchange "
                         "every --sync_every steps and at each epoch's end (a restarted diloco process "
                         "starts the data over; resuming at the job's place in the data is ps's)")
    ap.add_argument("--inner", choices=["sgd", "adamw"], default="sgd",
                    help="--optimizer=diloco: the inner torch optimizer")
    ap.add_argument("--reference", action="store_true", help="one process, no server")
    ap.add_argument("--lr", type=float, default=None,
                    help="--optimizer=distributed and --reference (default 0.2), or diloco's inner "
                         "optimizer (default 0.2 for sgd, 0.001 for adamw)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch_size", type=int, default=256, help="the global minibatch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train_limit", type=int, default=0)
    ap.add_argument("--test_limit", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many global steps (0: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--dump_weights", default=None, help="write the final flat weights (.npy)")
    ap.add_argument("--no_overlap", action="store_true",
                    help="exchange the whole gradient after backward instead of overlapping it with "
                         "backward and the next forward")
    args = ap.parse_args()
    diloco = args.optimizer == "diloco" and not args.reference
    if args.lr is None:
        args.lr = 0.001 if diloco and args.inner == "adamw" else 0.2
    torch.set_num_threads(args.threads)

    x_train, y_train = load(args.data_dir, "train", args.train_limit)
    x_test, y_test = load(args.data_dir, "t10k", args.test_limit)
    model = LeNet(args.seed)
    if args.reference:
        opt, world, rank = LocalSGD(model, args.lr), 1, 0
    else:
        token = open(args.token_file).read().strip() if args.token_file else None
        summa.init(args.server, rank=args.rank, world_size=args.world_size, token=token,  # Summa 1/3
                   tls=args.tls_ca)
        if args.optimizer == "ps":
            opt = summa.ParameterServerOptimizer(model, overlap=not args.no_overlap)  # Summa 2/3
        elif diloco:
            inner = (torch.optim.SGD if args.inner == "sgd" else torch.optim.AdamW)(model.parameters(), lr=args.lr)
            opt = summa.DiLoCo(model, inner)  # Summa 2/3
        else:
            summa.broadcast_parameters(model, root_rank=0)
            # SGD on the summed gradient at lr / batch: the seed's update (a short last batch
            # takes a slightly smaller step than the seed's).
            opt = summa.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr / args.batch_size),
                                             model, op="sum", overlap=not args.no_overlap)
        world, rank = summa.world_size(), summa.rank()

    n, batch = len(y_train), args.batch_size
    steps_per_epoch = -(-n // batch)
    # `done`, the global steps taken, is the position in the data. It is the optimizer's next step:
    # a restarted process, or one whose server came back from an older checkpoint, carries on
    # where the server is. DiLoCo's next_step counts exchanges: the loop counts its steps itself.
    if diloco:
        done = 0
        print(f"rank {rank} of {world} joined at exchange {opt.next_step} (H={opt.sync_every})", flush=True)
    else:
        done = opt.next_step
        print(f"rank {rank} of {world} {'joined' if not args.reference else 'started'} at step "
              f"{opt.next_step}", flush=True)
    last_steps = args.steps or args.epochs * steps_per_epoch
    epochs = []
    while done < last_steps:
        epoch, first = divmod(done, steps_per_epoch)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        start, loss_sum, seen = time.perf_counter(), 0.0, 0
        for b in range(first, steps_per_epoch):
            if done >= last_steps:
                break
            idx = order[b * batch:(b + 1) * batch]
            size = len(idx)
            lo, hi = opt.shard(size)  # split_batch over the step's group (it may grow or shrink)
            opt.zero_grad()
            if diloco:
                loss = F.cross_entropy(model(x_train[idx[lo:hi]]), y_train[idx[lo:hi]])  # the shard's mean
                loss.backward()
                opt.step(num_examples=hi - lo)  # Summa 3/3: the inner step; every H-th also exchanges
                loss_sum += loss.item() * (hi - lo)
                seen += hi - lo
                done += 1
                continue
            opt.num_examples = hi - lo  # the examples behind this gradient (its pushes start in backward)
            loss = F.cross_entropy(model(x_train[idx[lo:hi]]), y_train[idx[lo:hi]], reduction="sum")
            loss.backward()
            opt.step()  # Summa 3/3
            loss_sum += loss.item()
            seen += hi - lo
            done = opt.next_step
            if done != epoch * steps_per_epoch + b + 1:
                break  # the server resumed at another step: follow it
        if diloco:
            opt.sync()  # the epoch's last steps exchanged: the evaluation is of the outer weights
        seconds = time.perf_counter() - start
        with torch.no_grad():
            acc = (model(x_test).argmax(1) == y_test).float().mean().item()
        epochs.append({"seconds": seconds, "test_acc": acc})
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss_sum / max(1, seen):.3f} (rank 0's shard), "
                  f"test acc {acc:.3f}, {seconds:.1f} sec/epoch, {world} processes", flush=True)
    if args.dump_weights:
        if hasattr(opt, "synchronize"):
            opt.synchronize()  # the last step's weights may still be arriving
        np.save(args.dump_weights, torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy())
    if rank == 0 and epochs:
        print("RESULT " + json.dumps({"sec_per_epoch": sum(e["seconds"] for e in epochs) / len(epochs),
                                      "test_acc": epochs[-1]["test_acc"],
                                      **({"exchanges": opt.next_step} if diloco else {}), "steps": done}),
              flush=True)
    if not args.reference:
        summa.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
