"""The two ways a PyTorch loop trains through Summa.

ParameterServerOptimizer: the server owns the weights and the optimizer. The model's parameters
become views of one flat float32 buffer (and their .grad views of another), laid out in the
order the server partitions them, so a step pushes and pulls with no gathering or scattering.

DistributedOptimizer (Horovod's shape): the gradients are summed through the AllReduce RPC,
then the wrapped torch optimizer steps locally.
"""
import logging
import time

import grpc
import numpy as np
import torch

from .errors import SummaError
from .v1 import summa_pb2 as pb

log = logging.getLogger("summa")

_REJOIN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)


def _named(params, prefix):
    """[(name, tensor)] from tensors or (name, tensor) pairs (model.named_parameters())."""
    out = []
    for i, p in enumerate(params):
        if isinstance(p, tuple):
            out.append(p)
        elif isinstance(p, dict):  # a torch param group
            out.extend((f"{prefix}{i}.{k}", q) for k, q in enumerate(p["params"]))
        else:
            out.append((f"{prefix}{i}", p))
    return out


class _FlatBuffers:
    """The parameters' values and gradients, each one flat CPU float32 buffer the parameters'
    .data and .grad are views of."""

    def __init__(self, named):
        self.named = named
        self.params = [p for _, p in named]
        for name, p in named:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise TypeError(f"summa: parameter {name} is {p.dtype} on {p.device}; "
                                "Summa trains float32 CPU tensors")
        self.sizes = [p.numel() for p in self.params]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        total = int(self.offsets[-1])
        self.weights = torch.empty(total, dtype=torch.float32)
        self.grads = torch.zeros(total, dtype=torch.float32)
        with torch.no_grad():
            for p, a, n in zip(self.params, self.offsets, self.sizes):
                self.weights[a:a + n].copy_(p.detach().reshape(-1))
                p.data = self.weights[a:a + n].view_as(p)
                p.grad = self.grads[a:a + n].view_as(p)
        self.weights_np = self.weights.numpy()  # shares memory
        self.grads_np = self.grads.numpy()

    def gather_grads(self):
        """Makes every .grad a view of the flat buffer again (after zero_grad(set_to_none=True),
        or a user who assigned .grad): copies only such gradients in."""
        for p, a, n in zip(self.params, self.offsets, self.sizes):
            view = self.grads[a:a + n]
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad.reshape(-1))
            else:
                continue
            p.grad = view.view_as(p)
        for p, a, n in zip(self.params, self.offsets, self.sizes):
            if p.data.data_ptr() != self.weights[a:a + n].data_ptr():
                raise RuntimeError("summa: a parameter's .data was replaced after the optimizer "
                                   "was built; its weights would no longer be the server's")

    def zero_grad(self):
        self.grads.zero_()
        for p, a, n in zip(self.params, self.offsets, self.sizes):
            if p.grad is None or p.grad.data_ptr() != self.grads[a:a + n].data_ptr():
                p.grad = self.grads[a:a + n].view_as(p)


class ParameterServerOptimizer:
    """Trains `params` (model.parameters() or model.named_parameters(); float32 on the CPU) with
    summa-server's optimizer (its --optimizer, --lr, --mode...). Joins at construction: rank 0
    (or a rank the server assigns) sends its initial weights, every rank then pulls them.

    step(num_examples) pushes the gradient for this optimizer's step with the number of examples
    it covers and loads the weights the server answers with. The server divides the summed
    gradient by the examples pushed: with a loss summed over the shard, pass the shard's size
    (the seed's split_batch); with a mean loss, leave num_examples at 1 (each rank's mean
    counts once: the average over ranks).

    After a lost server or a lapsed lease (UNAVAILABLE, NOT_FOUND) it rejoins and pushes the same
    step again (the server counts a push once), for up to client.retry_timeout. `next_step` is
    the step it pushes next: a restarted process starts there (its place in the data).
    Not thread-safe."""

    def __init__(self, params, client=None):
        from . import _default_client
        self.client = client or _default_client()
        self.flat = _FlatBuffers(_named(list(params), "param"))
        self.specs = [(name, tuple(p.shape)) for name, p in self.flat.named]
        self.live_ranks = []
        self._join()

    def _join(self):
        c = self.client
        initial = self.flat.weights_np if c.rank <= 0 else None
        joined = c.join(self.specs, initial)
        self.mode = joined.mode
        self.live_ranks = joined.live_ranks
        self.version = c.pull(joined.version, self.flat.weights_np)
        self.next_step = joined.next_step
        return joined

    @property
    def rank(self):
        return self.client.rank

    def zero_grad(self, set_to_none=False):
        self.flat.zero_grad()

    @torch.no_grad()
    def step(self, num_examples=1):
        self.flat.gather_grads()
        step = self.next_step
        failing_since = time.monotonic()
        backoff = 0.2
        while True:
            try:
                self.live_ranks = self.client.push_pull(step, int(num_examples), self.flat.grads_np,
                                                        self.flat.weights_np)
                break
            except SummaError as e:
                if e.code not in _REJOIN:
                    raise
                if time.monotonic() - failing_since > self.client.retry_timeout:
                    raise SummaError(e.code, f"gave up after {self.client.retry_timeout:.0f} s of "
                                             f"retries: {e.message}", e.what) from None
                log.warning("rank %d lost the server (%s); rejoining in %.1f s", self.rank, e, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 3.0)
                try:
                    joined = self._join()
                except SummaError as again:
                    if again.code not in _REJOIN:
                        raise
                    continue
                if joined.next_step < step:
                    # A server restored from an older checkpoint: this gradient belongs to weights
                    # that no longer exist. Take the server's, and its step.
                    log.warning("rank %d: the server resumed at step %d; dropping step %d's gradient",
                                self.rank, joined.next_step, step)
                    return
        self.next_step = step + 1
        self.version = self.next_step if self.mode == pb.MODE_SYNC else self.version + 1

    def leave(self):
        """Leaves the job (the others go on without this rank)."""
        self.client.leave()


class DistributedOptimizer(torch.optim.Optimizer):
    """Horovod's shape: wraps a torch optimizer; step() sums every parameter's gradient over the
    ranks through summa-server's AllReduce (one flat buffer, in chunks of 4 MiB), divides by the
    world size when `op` is "average" (the default; "sum" leaves the sum), then steps the wrapped
    optimizer. The gradients are views of the flat buffer, so backward() accumulates straight
    into what is sent. Every rank must step the same number of times."""

    def __init__(self, optimizer, model=None, op="average", name="summa.gradients", client=None):
        from . import _default_client
        if op not in ("average", "sum"):
            raise ValueError(f"op must be 'average' or 'sum', not {op!r}")
        self.__dict__["_inner"] = optimizer
        self.client = client or _default_client()
        self.op = op
        self.name = name
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if model is not None:
            known = {id(p) for p in params}
            missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in known]
            if missing:
                raise ValueError(f"summa: the optimizer does not hold the model's {missing}")
        self.flat = _FlatBuffers([(f"param{i}", p) for i, p in enumerate(params)])
        self.next_step = 0  # steps taken (every rank takes the same)
        self.live_ranks = list(range(self.client.world_size))

    def __getattr__(self, name):
        return getattr(self.__dict__["_inner"], name)

    @property
    def param_groups(self):
        return self._inner.param_groups

    @property
    def state(self):
        return self._inner.state

    def state_dict(self):
        return self._inner.state_dict()

    def load_state_dict(self, state):
        self._inner.load_state_dict(state)

    def zero_grad(self, set_to_none=False):
        self.flat.zero_grad()

    @torch.no_grad()
    def step(self, closure=None):
        self.flat.gather_grads()
        g = self.flat.grads_np
        self.client.allreduce(g, g, self.name)
        if self.op == "average":
            self.flat.grads.div_(self.client.world_size)
        self.next_step += 1
        return self._inner.step(closure)
