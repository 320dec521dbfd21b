"""The seed's LeNet in PyTorch (Debian's python3-torch), written from scratch like the seed, as
the reference Summa is measured against.

  single process:  pytorch_lenet.py --threads T
  DDP with gloo:   pytorch_lenet.py --ddp 2     (2 processes of 1 thread each)
  on a GPU:        pytorch_lenet.py --device cuda   (the data uploaded once and kept there; the
                   loss summed on the device and read once per epoch)

Prints one line per epoch and a final JSON line ("RESULT {...}"). Set OPENBLAS_NUM_THREADS and
OMP_NUM_THREADS before starting Python: torch.set_num_threads does not reach Debian's OpenBLAS.
Run with /usr/bin/python3.
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np


def load(data_dir, split):
    def read(name):
        path = os.path.join(data_dir, name)
        opener = gzip.open if os.path.exists(path + ".gz") else open
        with opener(path + ".gz" if os.path.exists(path + ".gz") else path, "rb") as f:
            return f.read()
    images = np.frombuffer(read(f"{split}-images-idx3-ubyte"), np.uint8, offset=16)
    labels = np.frombuffer(read(f"{split}-labels-idx1-ubyte"), np.uint8, offset=8)
    return images.reshape(-1, 1, 28, 28).astype(np.float32) / 255.0, labels.astype(np.int64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ddp", type=int, default=0, help="processes for torch.distributed (gloo)")
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train_limit", type=int, default=0)
    ap.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N) for one GPU")
    args = ap.parse_args()
    if args.ddp and args.device != "cpu":
        ap.error("--ddp runs on the CPU only (gloo)")

    if args.ddp and args.port == 0:
        return launch_ddp(args)

    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    world, rank = max(1, args.ddp), args.rank
    if args.ddp:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                world_size=world, rank=rank)

    x_train, y_train = load(args.data_dir, "train")
    x_test, y_test = load(args.data_dir, "t10k")
    if args.train_limit:
        x_train, y_train = x_train[:args.train_limit], y_train[:args.train_limit]
    device = torch.device(args.device)
    x_train, y_train = torch.from_numpy(x_train).to(device), torch.from_numpy(y_train).to(device)
    x_test, y_test = torch.from_numpy(x_test).to(device), torch.from_numpy(y_test).to(device)

    scale = 0.01
    params = [torch.randn(20, 1, 3, 3) * scale, torch.zeros(20),
              torch.randn(50, 20, 5, 5) * scale, torch.zeros(50),
              torch.randn(800, 128) * scale, torch.zeros(128),
              torch.randn(128, 10) * scale, torch.zeros(10)]
    params = [p.to(device) for p in params]
    if args.ddp:
        for p in params:
            dist.broadcast(p, 0)
    for p in params:
        p.requires_grad_()

    def lenet(X):
        W1, b1, W2, b2, W3, b3, W4, b4 = params
        h = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), 2)
        h = F.avg_pool2d(F.relu(F.conv2d(h, W2, b2)), 2)
        h = F.relu(h.reshape(h.shape[0], -1) @ W3 + b3)
        return h @ W4 + b4

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    n = len(y_train)
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(args.seed * 1000 + epoch)
        order = torch.randperm(n, generator=g).to(device)
        sync()
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        for b in range(0, n, args.batch_size):
            idx = order[b:b + args.batch_size]
            size = len(idx)
            lo, hi = rank * size // world, (rank + 1) * size // world  # the seed's split_batch
            X, y = x_train[idx[lo:hi]], y_train[idx[lo:hi]]
            loss = F.cross_entropy(lenet(X), y, reduction="sum")
            for p in params:
                p.grad = None
            loss.backward()
            with torch.no_grad():
                if args.ddp:
                    for p in params:
                        dist.all_reduce(p.grad)
                for p in params:
                    p -= args.lr * p.grad / size
            loss_sum += loss.detach()
        loss_sum = loss_sum.item()  # waits for the device's last step
        seconds = time.perf_counter() - start
        with torch.no_grad():
            acc = (lenet(x_test).argmax(1) == y_test).float().mean().item()
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss_sum * world / n:.3f} (rank 0's shard), "
                  f"test acc {acc:.3f}, {seconds:.3f} sec/epoch", flush=True)
            epochs = getattr(main, "epochs", [])
            epochs.append({"seconds": seconds, "test_acc": acc})
            main.epochs = epochs
    if rank == 0:
        e = main.epochs
        print("RESULT " + json.dumps({"sec_per_epoch": sum(x["seconds"] for x in e) / len(e),
                                      "test_acc": e[-1]["test_acc"]}), flush=True)
    return 0


def launch_ddp(args):
    import socket
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [a for a in sys.argv[1:]]
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
