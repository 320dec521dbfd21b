"""A small GPT-style decoder-only transformer (6 layers, d_model 512, 8 heads, sequences of 128
tokens, a vocabulary of 8192, the output layer tied to the token embedding: 23,175,168
parameters, 88.4 MiB of float32) on synthetic tokens, trained through summa-server with
ParameterServerOptimizer (or DistributedOptimizer, or torch DDP for comparison): a model of the
kind people train, twice the ResNet-18 shape's bytes, so that the exchange (23 partitions of
4 MiB each way per step) is what is timed.

  scripts/launch.sh --python python/examples/synthetic_gpt.py --workers 2 --lr 0.05 -- --steps 4

or under torchrun (torch 1.13's launcher: /usr/bin/torchrun, or /usr/bin/python3 -m
torch.distributed.run), which sets RANK and WORLD_SIZE; the server is started first and found
through $SUMMA_SERVER:

  build/server/summa-server --address=127.0.0.1:50051 --data_address=127.0.0.1:50052 --workers=2 --lr=0.05 &
  SUMMA_SERVER=127.0.0.1:50051 PYTHONPATH=build/python OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \\
    /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 --nproc_per_node=2 \\
    python/examples/synthetic_gpt.py --steps 4

(--redirects 1 --tee 1: Debian's torch 1.13 on Python 3.11 cannot parse their default "0", since
Python 3.11 no longer iterates a Flag's zero member, and stops with "'NoneType' object has no
attribute 'get'"; 1 shows each rank's stdout prefixed with its rank.) The same model under DDP
(gloo), 2 processes started here, or by torchrun (with --ddp 2 there too):

  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 python/examples/synthetic_gpt.py --ddp 2 --steps 4

Each step draws random tokens (seeded by rank and step) and trains on next-token cross-entropy
(the mean over the batch's tokens: each process's gradient counts once), so the loss means
nothing; the printout is the step time split into compute and exchange, the compute alone and
the communication left exposed, then RESULT {json} (python/examples/synthetic_loop.py says what
each figure is; --trace_dir writes a Chrome trace of two steps). Set OPENBLAS_NUM_THREADS and
OMP_NUM_THREADS before starting Python (scripts/launch.sh sets both to 1).
"""
import argparse
import math
import sys

import torch
import torch.nn.functional as F

import synthetic_loop


class Block(torch.nn.Module):
    """Pre-norm: x + attention(ln(x)), then x + mlp(ln(x)); causal self-attention, GELU MLP."""

    def __init__(self, d_model, heads, seq):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.up = torch.nn.Linear(d_model, 4 * d_model)
        self.down = torch.nn.Linear(4 * d_model, d_model)
        # A plain attribute, not a buffer: DDP would broadcast a buffer before every forward.
        self.causal = torch.full((seq, seq), float("-inf")).triu(1)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.causal.device != x.device:  # moved with the model, once
            self.causal = self.causal.to(x.device)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads) + self.causal[:t, :t]
        h = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(h)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(torch.nn.Module):
    """Token and position embeddings, the blocks, a last LayerNorm, and logits through the token
    embedding's transpose (tied, GPT-2's choice: 23.2 M parameters; untied it would be 27.4 M)."""

    def __init__(self, vocab=8192, seq=128, d_model=512, heads=8, layers=6):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, d_model)
        self.positions = torch.nn.Embedding(seq, d_model)
        self.blocks = torch.nn.Sequential(*[Block(d_model, heads, seq) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(d_model)
        for m in self.modules():
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.zeros_(m.bias)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.tokens(tokens) + self.positions(torch.arange(t, device=tokens.device))
        return F.linear(self.ln(self.blocks(x)), self.tokens.weight)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    synthetic_loop.add_flags(ap, batch_size=2, lr=0.05)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = GPT(vocab=args.vocab, seq=args.seq)

    def batch(rank, step, size, device):
        g = torch.Generator().manual_seed(1000 * rank + step)
        tokens = torch.randint(0, args.vocab, (size, args.seq + 1), generator=g).to(device)
        x, y = tokens[:, :-1], tokens[:, 1:]
        return (x,), lambda logits: F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1))

    return synthetic_loop.run(args, "GPT (6 x 512, 8 heads, 128 tokens, vocabulary 8192)", model, batch)


if __name__ == "__main__":
    sys.exit(main())
