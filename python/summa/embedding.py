"""Embedding tables held by row on summa-server: drop-in for torch.nn.Embedding(sparse=True) and
torch.nn.EmbeddingBag, for tables larger than any worker.

    emb = summa.Embedding(10_000_000, 64, optimizer="adagrad", lr=0.05)
    model = MyModel(emb, ...)                        # dense layers as usual
    opt = summa.ParameterServerOptimizer(model)      # finds the tables, declares them at its join
    for batch, next_batch in ...:
        emb.prefetch(next_batch.ids)                 # optional: the next batch's rows come early
        loss = model(batch).sum(); loss.backward(); opt.step(len(batch))

A table lives on the servers (rows spread over shards by a hash of the id, created on first pull
from a deterministic initializer, stepped there by a row-wise optimizer: docs/embeddings.md). The
worker holds only the rows of its batch: forward pulls the batch's distinct ids once each (the
rows of the table's version of this step: in sync mode it waits for the last step's rows), and
backward hands their summed gradients to the optimizer's step(), which pushes them with the step's
example count, together with the dense exchange. A prefetch(ids) given during a step is pulled as
soon as that step's rows are pushed, so the next forward finds them there.

The calls run on one thread of the client's, in order (pushes before the pulls that wait for
them), so that the network waits of a step overlap the dense exchange and the next batch's
compute. Not thread-safe (one training loop drives a table).
"""
import concurrent.futures
import threading

import numpy as np
import torch

from .v1 import summa_pb2 as pb

_OPTIMIZERS = ("sgd", "adagrad", "adam")
_NO_IDS = np.empty(0, np.uint64)
_NO_ROWS = np.empty((0, 1), np.float32)
_INITIALIZERS = ("zeros", "uniform", "normal")


class _SparseCalls:
    """One thread that makes a client's sparse calls in the order they are asked for."""

    _by_client = {}
    _lock = threading.Lock()

    @classmethod
    def of(cls, client):
        with cls._lock:
            calls = cls._by_client.get(id(client))
            if calls is None or calls.client is not client:
                calls = cls(client)
                cls._by_client[id(client)] = calls
            return calls

    def __init__(self, client):
        self.client = client
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="summa-sparse")

    def submit(self, fn, *args):
        return self.pool.submit(fn, *args)


class _Table(torch.nn.Module):
    """What Embedding and EmbeddingBag share: the table's spec, its pulls and pushes."""

    def __init__(self, num_embeddings, embedding_dim, name, optimizer, lr, init, seed, admit_after,
                 expire_after, eps, betas, initial_accumulator_value):
        super().__init__()
        if embedding_dim < 1:
            raise ValueError(f"summa: embedding_dim {embedding_dim} must be at least 1")
        if num_embeddings is not None and num_embeddings < 0:
            raise ValueError(f"summa: num_embeddings {num_embeddings} must not be negative (0 or None: any id)")
        if optimizer not in _OPTIMIZERS:
            raise ValueError(f"summa: optimizer {optimizer!r}: a table steps with one of {_OPTIMIZERS}")
        kind, a, b = (init, 0.0, 0.0) if isinstance(init, str) else (init[0], float(init[1]), float(init[2]))
        if kind not in _INITIALIZERS:
            raise ValueError(f"summa: init {init!r}: use 'zeros', ('uniform', a, b) or ('normal', mean, std)")
        self.num_embeddings = int(num_embeddings or 0)
        self.embedding_dim = int(embedding_dim)
        self.table_name = name
        self.spec = pb.EmbeddingTableSpec(
            name=name or "", dim=self.embedding_dim, dtype=pb.DTYPE_FLOAT32, num_embeddings=self.num_embeddings,
            initializer=pb.RowInitializer(kind=kind, a=a, b=b, seed=int(seed)),
            optimizer=pb.RowOptimizer(name=optimizer, learning_rate=float(lr), eps=float(eps or 0),
                                      beta1=float(betas[0]), beta2=float(betas[1]),
                                      initial_accumulator_value=float(initial_accumulator_value)),
            admit_after=int(admit_after), expire_after=int(expire_after))
        self._opt = None       # the ParameterServerOptimizer that declared it (attach)
        self._index = None     # its index in the job's tables
        self._calls = None
        self._grads = []       # [(ids, grads)] of this step's backwards
        self._prefetch_ids = None
        self._prefetched = None  # (ids, (future, rows))
        self._pushes = []  # futures of the pushes not yet seen to succeed
        self._looked_up = None  # the step whose rows the last forward read
        self.rows_pulled = 0
        self.rows_pushed = 0

    # --- the optimizer's side ------------------------------------------------------------------

    def _attach(self, opt, index, name):
        if self._opt is not None and self._opt is not opt:
            raise RuntimeError(f"summa: table {self.spec.name!r} already belongs to another optimizer")
        self._opt = opt
        self._index = index
        if not self.spec.name:
            self.spec.name = name
        self._calls = _SparseCalls.of(opt.client)

    def _min_version(self, step):
        return step if self._opt.mode == pb.MODE_SYNC else 0

    def _flush(self, step, num_examples):
        """Queues this step's row gradients (an empty push in sync mode when there are none, so that
        the table's step completes) and then the prefetch of the next batch's rows."""
        client, table = self._opt.client, self._index
        if self._grads:
            ids = np.concatenate([i for i, _ in self._grads])
            grads = np.concatenate([g for _, g in self._grads])
        else:
            ids = np.empty(0, np.uint64)
            grads = np.empty((0, self.embedding_dim), np.float32)
        self._grads = []
        self.rows_pushed += len(ids)
        if self._opt.mode == pb.MODE_SYNC and self._looked_up != step:
            # No forward of this step waited for the table to reach it: wait so before pushing
            # (a shard still a step behind would refuse this push as a future step's).
            self._pushes.append(self._calls.submit(client.sparse_pull, table, step, _NO_IDS, _NO_ROWS))
        if len(ids) or self._opt.mode == pb.MODE_SYNC:
            self._pushes.append(self._calls.submit(client.sparse_push, table, step, int(num_examples), ids, grads))
        self._check_pushes()  # after this step's push is on its way: the others wait for it
        if self._prefetch_ids is not None:
            ids, self._prefetch_ids = self._prefetch_ids, None
            self._prefetched = (ids, self._pull_later(ids, self._min_version(step + 1)))

    def _drop_step(self):
        """The step's gradients do not go (a recovery moved the loop to the server's step)."""
        self._grads = []
        self._prefetch_ids = None

    def _check_pushes(self):
        """Raises what a finished push met; forgets the ones that succeeded."""
        while self._pushes and self._pushes[0].done():
            self._pushes.pop(0).result()

    def _wait_pushed(self):
        """Waits for every push; raises what one met."""
        while self._pushes:
            self._pushes.pop(0).result()

    def _pull_later(self, ids, min_version):
        rows = np.empty((len(ids), self.embedding_dim), np.float32)
        future = self._calls.submit(self._opt.client.sparse_pull, self._index, min_version, ids, rows)
        return future, rows

    # --- the model's side ----------------------------------------------------------------------

    def pull(self, ids, min_version=None):
        """The rows of `ids` (a 1-d integer tensor or array; duplicates allowed) as a float32 tensor
        of len(ids) x dim, without a gradient: as of version min_version or later (None: this
        step's, as forward reads them). In order after this process's pushes, so that it can wait
        for a step they complete."""
        if self._opt is None:
            raise RuntimeError("summa: the table has no optimizer yet (summa.ParameterServerOptimizer(model))")
        ids = np.ascontiguousarray(torch.as_tensor(ids).reshape(-1).numpy(), dtype=np.uint64)
        version = self._min_version(self._opt.next_step) if min_version is None else int(min_version)
        future, rows = self._pull_later(ids, version)
        future.result()
        return torch.from_numpy(rows)

    def prefetch(self, ids):
        """The ids the next forward will look up: pulled as soon as this step's rows are pushed (at
        the optimizer's step()), so that the next forward does not wait for them."""
        self._prefetch_ids = _distinct(ids)[0]

    def _rows(self, ids):
        """The rows of distinct `ids` (uint64) for this step, as a tensor that collects their
        gradient."""
        if self._opt is None:
            raise RuntimeError("summa: a summa.Embedding needs a summa.ParameterServerOptimizer built over the "
                               "model that holds it (the optimizer declares the table at its join)")
        self._check_pushes()
        taken = None
        if self._prefetched is not None:
            want, (future, rows) = self._prefetched
            self._prefetched = None
            future.result()
            if len(want) == len(ids) and np.array_equal(want, ids):
                taken = rows
        if taken is None:
            future, taken = self._pull_later(ids, self._min_version(self._opt.next_step))
            future.result()
        self._looked_up = self._opt.next_step
        self.rows_pulled += len(ids)
        rows = torch.from_numpy(taken)
        if torch.is_grad_enabled() and self.training:
            rows.requires_grad_(True)
            rows.register_hook(self._grad_hook(ids))
        return rows

    def _grad_hook(self, ids):
        def hook(grad):
            self._grads.append((ids, grad.detach().to(torch.float32).contiguous().numpy().copy()))
        return hook

    def extra_repr(self):
        s = self.spec
        return (f"{s.num_embeddings or 'any'}, {s.dim}, name={s.name!r}, optimizer={s.optimizer.name}"
                f"(lr={s.optimizer.learning_rate}), init={s.initializer.kind}")


def _distinct(ids):
    """The distinct ids of an index tensor (sorted, as uint64) and where each position's is."""
    if not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(ids)
    if ids.device.type != "cpu":
        raise TypeError(f"summa: ids on {ids.device}: a table's rows come to the CPU; look them up with CPU ids "
                        "and move the output (table(ids.cpu()).to(device))")
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"summa: ids must be an integer tensor, not {ids.dtype}")
    flat = ids.reshape(-1).to(torch.int64)
    if flat.numel() and int(flat.min()) < 0:
        raise ValueError(f"summa: id {int(flat.min())} is negative")
    uniq, inverse = torch.unique(flat, sorted=True, return_inverse=True)
    return uniq.numpy().astype(np.uint64), inverse


class Embedding(_Table):
    """torch.nn.Embedding(num_embeddings, embedding_dim, sparse=True) with its rows on the servers.

    `optimizer`: the row-wise optimizer the server steps the rows with, "sgd", "adagrad" or "adam"
    (lazy Adam: torch.optim.SparseAdam's rule), at `lr` (with `eps`, `betas`,
    `initial_accumulator_value`). `init`: "zeros", ("uniform", a, b) or ("normal", mean, std),
    drawn per row from the id and `seed`. `num_embeddings`: ids must be below it (0 or None: any
    64-bit id). `admit_after`: a row is created the n-th time a pull names it (reads as zeros and
    drops its gradients before: Monolith's admission); `expire_after`: rows untouched for that many
    steps are dropped. `name`: the table's name on the server (default: its attribute path)."""

    def __init__(self, num_embeddings, embedding_dim, name=None, optimizer="sgd", lr=0.01,
                 init=("normal", 0.0, 1.0), seed=0, admit_after=0, expire_after=0, eps=None,
                 betas=(0.9, 0.999), initial_accumulator_value=0.0):
        super().__init__(num_embeddings, embedding_dim, name, optimizer, lr, init, seed, admit_after,
                         expire_after, eps, betas, initial_accumulator_value)

    def forward(self, ids):
        uniq, inverse = _distinct(ids)
        rows = self._rows(uniq)
        out = torch.nn.functional.embedding(inverse, rows)
        return out.view(*tuple(ids.shape), self.embedding_dim)


class EmbeddingBag(_Table):
    """torch.nn.EmbeddingBag(num_embeddings, embedding_dim, mode=..., sparse=True) with its rows on
    the servers: forward(input, offsets=None, per_sample_weights=None) as torch's. The table's
    options are Embedding's."""

    def __init__(self, num_embeddings, embedding_dim, mode="mean", name=None, optimizer="sgd", lr=0.01,
                 init=("normal", 0.0, 1.0), seed=0, admit_after=0, expire_after=0, eps=None,
                 betas=(0.9, 0.999), initial_accumulator_value=0.0):
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"summa: mode {mode!r}: use 'sum', 'mean' or 'max'")
        super().__init__(num_embeddings, embedding_dim, name, optimizer, lr, init, seed, admit_after,
                         expire_after, eps, betas, initial_accumulator_value)
        self.mode = mode

    def forward(self, input, offsets=None, per_sample_weights=None):
        uniq, inverse = _distinct(input)
        rows = self._rows(uniq)
        return torch.nn.functional.embedding_bag(inverse.view(input.shape), rows, offsets, mode=self.mode,
                                                 per_sample_weights=per_sample_weights)


def tables_of(module):
    """The summa tables in `module` (itself included), in module order, with their attribute paths."""
    if module is None:
        return []
    return [(name or type(m).__name__, m) for name, m in module.named_modules() if isinstance(m, _Table)]
