"""A ResNet-18-shaped model (11.2 M parameters, 42.6 MiB of float32) on synthetic data, trained
through summa-server with ParameterServerOptimizer (or DistributedOptimizer): a model of the size
people train, so that the data path (11 partitions of 4 MiB each way per step) is what is timed.

  scripts/launch.sh --python python/examples/synthetic_resnet.py --workers 2 --lr 0.05 -- --steps=20

or by hand, or under torchrun (which sets RANK and WORLD_SIZE; the server is found through
$SUMMA_SERVER), with PYTHONPATH=build/python OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1:

  build/server/summa-server --address=127.0.0.1:50051 --data_address=127.0.0.1:50052 --workers=2 --lr=0.05 &
  RANK=0 python3 synthetic_resnet.py --world_size=2 & RANK=1 python3 synthetic_resnet.py --world_size=2
  SUMMA_SERVER=127.0.0.1:50051 torchrun --redirects 1 --tee 1 --nproc_per_node=2 \\
    python/examples/synthetic_resnet.py --steps=20

(torchrun's --redirects 1 --tee 1: see synthetic_gpt.py.)

The model itself goes to ParameterServerOptimizer, so the exchange overlaps backward and the next
forward (--no_overlap: all of it in opt.step()). Each step draws a fixed random batch (seeded by
rank and step), so the loss is meaningless; the printout is the step time, split into compute and
exchange, the compute alone and the communication left exposed, then RESULT {json}
(python/examples/synthetic_loop.py says what each figure is; --trace_dir writes a Chrome trace of
two steps). BatchNorm's running statistics stay local to each process. --ddp N runs the same
with torch DDP (gloo) instead, for comparison (no server).
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import synthetic_loop


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
    synthetic_loop.add_flags(ap, batch_size=16, lr=0.05)
    ap.add_argument("--image_size", type=int, default=32)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = ResNet18()

    def batch(rank, step, size, device):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x = torch.randn(size, 3, args.image_size, args.image_size, generator=g).to(device)
        y = torch.randint(0, 10, (size,), generator=g).to(device)
        return (x,), lambda logits: F.cross_entropy(logits, y)

    return synthetic_loop.run(args, "ResNet-18 shape", model, batch)


if __name__ == "__main__":
    sys.exit(main())
