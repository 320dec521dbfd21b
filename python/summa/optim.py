"""The two ways a PyTorch loop trains through Summa.

ParameterServerOptimizer: the server owns the weights and the optimizer. The model's parameters
become views of one flat float32 buffer (and their .grad views of another), laid out in the
order the server partitions them, so a step pushes and pulls with no gathering or scattering.
Given the model, it overlaps the exchange with the compute: each partition's push-pull starts as
soon as backward has finished its gradients (a hook on each parameter's gradient accumulator, the
last layers' first: DDP's buckets, which here are the server's partitions), and each module's
forward waits, in a pre-hook, only for its own parameters' new weights (ByteScheduler's idea), so
the next forward starts while the last partitions are still in flight.

DistributedOptimizer (Horovod's shape): the gradients are summed through the AllReduce RPC in
buckets as backward finishes them (on a thread of the optimizer's, each bucket's AllReduce
releasing the GIL), then the wrapped torch optimizer steps locally.

Both: gradient accumulation over several backwards (with opt.no_sync(): DDP's), parameters that
get no gradient in a step (their buckets go at step()), frozen parameters (requires_grad=False:
not part of what is exchanged, so never pushed nor decayed by the server), and, with a
torch.distributed group of the processes on one host (local_group=), a hierarchical exchange:
the host's processes sum their gradients first and one of them exchanges with the server.
"""
import contextlib
import logging
import queue
import threading
import time

import grpc
import numpy as np
import torch

from .embedding import tables_of
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
    .data and .grad are views of. Two gradient buffers when `double`: zero_grad() while a step's
    exchange is still reading one turns the .grad views to the other."""

    def __init__(self, named, double=False):
        self.named = named
        self.params = [p for _, p in named]
        self.device = self.params[0].device if self.params else torch.device("cpu")
        for name, p in named:
            if p.dtype != torch.float32 or p.device != self.device:
                raise TypeError(f"summa: parameter {name} is {p.dtype} on {p.device}; Summa trains float32 "
                                f"tensors, all on one device ({self.device} here)")
        self.sizes = [p.numel() for p in self.params]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        total = int(self.offsets[-1])
        self.weights = torch.empty(total, dtype=torch.float32, device=self.device)
        self.buffers = [torch.zeros(total, dtype=torch.float32, device=self.device) for _ in range(2 if double else 1)]
        self.grads = self.buffers[0]
        with torch.no_grad():
            for p, a, n in zip(self.params, self.offsets, self.sizes):
                self.weights[a:a + n].copy_(p.detach().reshape(-1))
                p.data = self.weights[a:a + n].view_as(p)
                p.grad = self.grads[a:a + n].view_as(p)
        self.weights_np = self.weights.numpy() if self.device.type == "cpu" else None  # shares memory

    def move_gradients(self, buffers):
        """The gradient buffers become `buffers` (as many, each of the model's size), their values
        copied and the .grad views moved."""
        for new, old in zip(buffers, self.buffers):
            new.copy_(old)
        self.grads = buffers[next(i for i, b in enumerate(self.buffers) if b is self.grads)]
        self.buffers = buffers
        for p, a, n in zip(self.params, self.offsets, self.sizes):
            p.grad = self.grads[a:a + n].view_as(p)

    @property
    def grads_np(self):
        return self.grads.numpy()

    def bind_grad(self, i):
        """Parameter i's .grad as a view of the flat buffer: a .grad that backward made anew (after
        zero_grad(set_to_none=True), torch 2's default) is copied in."""
        p, a, n = self.params[i], self.offsets[i], self.sizes[i]
        view = self.grads[a:a + n]
        if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad.reshape(-1))
            p.grad = view.view_as(p)

    def gather_grads(self):
        """Makes every .grad a view of the flat buffer again (after zero_grad(set_to_none=True),
        or a user who assigned .grad): copies only such gradients in."""
        for i, (p, a, n) in enumerate(zip(self.params, self.offsets, self.sizes)):
            if p.grad is None:
                self.grads[a:a + n].zero_()
                p.grad = self.grads[a:a + n].view_as(p)
            else:
                self.bind_grad(i)
        for p, a, n in zip(self.params, self.offsets, self.sizes):
            if p.data.data_ptr() != self.weights[a:a + n].data_ptr():
                raise RuntimeError("summa: a parameter's .data was replaced after the optimizer "
                                   "was built; its weights would no longer be the server's")

    def zero_grad(self, in_use=None):
        """Zeros the gradients; `in_use`, a buffer an exchange still reads, is left alone (the
        .grad views move to the other buffer)."""
        if in_use is not None and self.grads is in_use and len(self.buffers) == 2:
            self.grads = self.buffers[1] if self.grads is self.buffers[0] else self.buffers[0]
        self.grads.zero_()
        for p, a, n in zip(self.params, self.offsets, self.sizes):
            if p.grad is None or p.grad.data_ptr() != self.grads[a:a + n].data_ptr():
                p.grad = self.grads[a:a + n].view_as(p)


def _split(model_or_params):
    """(module or None, [(name, parameter)] that train, [(name, parameter)] frozen)."""
    module = model_or_params if isinstance(model_or_params, torch.nn.Module) else None
    named = _named(list(module.named_parameters() if module is not None else model_or_params), "param")
    return module, [(n, p) for n, p in named if p.requires_grad], [(n, p) for n, p in named if not p.requires_grad]


class _GradientHooks:
    """Calls on_ready(bucket) the moment backward has accumulated the gradient of every parameter
    of `bucket` (a post-hook on each parameter's AccumulateGrad node, as Horovod does on torch
    1.x). `buckets_of[i]`: the buckets parameter i's values fall in. Off while `enabled` is false
    (opt.no_sync()); reset() starts the count of a new backward."""

    def __init__(self, params, buckets_of, bucket_count, on_first, on_ready, bind):
        self.enabled = True
        self._bind = bind  # bind(i): parameter i's .grad into the flat buffer (a new .grad copied in)
        self._on_first = on_first
        self._on_ready = on_ready
        self._buckets_of = buckets_of
        self._need = [0] * bucket_count
        for bs in buckets_of:
            for b in bs:
                self._need[b] += 1
        self._left = list(self._need)
        self._fired = [False] * len(params)
        self.readied = [False] * bucket_count
        self._started = False
        self._skip = False
        self._accumulators = []  # kept alive: a hook lives as long as its node
        for i, p in enumerate(params):
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._hook(i))
            self._accumulators.append(acc)

    def _hook(self, i):
        def hook(*_):
            if not self.enabled or self._fired[i] or self._skip:
                return
            if not self._started:
                self._started = True
                if self._on_first() is False:  # this backward's gradient is not to go
                    self._skip = True
                    return
            self._fired[i] = True
            self._bind(i)
            for b in reversed(self._buckets_of[i]):  # the later partitions first, as backward goes
                self._left[b] -= 1
                if self._left[b] == 0:
                    self.readied[b] = True
                    self._on_ready(b)
        return hook

    @property
    def started(self):
        return self._started

    def reset(self):
        self._left = list(self._need)
        self._fired = [False] * len(self._fired)
        self.readied = [False] * len(self.readied)
        self._started = False
        self._skip = False


@contextlib.contextmanager
def _hooks_off(hooks):
    """The optimizers' no_sync(): `hooks` (a _GradientHooks, or None without overlap) ignore the
    backwards inside."""
    if hooks is None:
        yield
        return
    hooks.enabled = False
    try:
        yield
    finally:
        hooks.enabled = True


def _buckets_by_range(offsets, sizes, ranges):
    """For each parameter (flat offset, size), the indexes of `ranges` [(offset, length)] it
    overlaps."""
    out = []
    for a, n in zip(offsets, sizes):
        out.append([k for k, (o, l) in enumerate(ranges) if o < a + n and a < o + l] if n else [])
    return out


class _LocalGroup:
    """The processes of one host (a torch.distributed group, gloo on CPUs): they sum their
    gradients locally and the group's first rank (the leader) exchanges with the server, then
    hands the weights (or summed gradients) back to the others: BytePS's and the seed's design."""

    def __init__(self, group):
        import torch.distributed as dist
        self.dist = dist
        self.group = group
        self.ranks = dist.get_process_group_ranks(group) if hasattr(dist, "get_process_group_ranks") else None
        self.leader = self.ranks[0] if self.ranks else 0
        self.is_leader = dist.get_rank() == self.leader

    def sum_to_leader(self, tensor):
        self.dist.reduce(tensor, self.leader, group=self.group)

    def from_leader(self, tensor):
        self.dist.broadcast(tensor, self.leader, group=self.group)

    def sum_examples(self, n):
        t = torch.tensor([float(n)])
        self.dist.all_reduce(t, group=self.group)
        return int(t.item())


class ParameterServerOptimizer:
    """Trains a model (an nn.Module: overlapped; or model.parameters() / named_parameters():
    not) with summa-server's optimizer (its --optimizer, --lr, --mode...). Joins at construction:
    rank 0 (or a rank the server assigns) sends its initial weights, every rank then pulls them.
    Parameters with requires_grad=False stay out of the server's model.

    step(num_examples) ends the step: the gradient of the last backward goes to the server with
    the number of examples it covers, and the weights it answers with are loaded (with overlap,
    as they arrive: each module's next forward waits for its own). The server divides the summed
    gradient by the examples pushed: with a loss summed over the shard, pass the shard's size (the
    seed's split_batch; with overlap, set opt.num_examples before backward, since the pushes start
    during it); with a mean loss, leave it at 1 (each rank's mean counts once: the average).

    After a lost server or a lapsed lease (UNAVAILABLE, NOT_FOUND) it rejoins and pushes the same
    step again (the server counts a push once), for up to client.retry_timeout. `next_step` is
    the step it pushes next: a restarted process starts there (its place in the data).
    `overlap=False` exchanges the whole gradient at step(), after backward. `local_group`: see
    the module's docstring (the server then counts one member per host). Not thread-safe."""

    # What a push carries: gradients; summa.DiLoCo's are pseudo-gradients (a DiLoCo server takes
    # no other, and refuses this class at the join).
    _pushes_pseudo_gradients = False

    def __init__(self, model, client=None, overlap=True, num_examples=1, local_group=None):
        from . import _default_client
        self.client = client or _default_client()
        module, named, self.frozen = _split(model)
        # The model's embedding tables (summa.Embedding): declared at the join, pushed at step().
        self.tables = [t for _, t in tables_of(module)]
        if self.tables and local_group is not None:
            raise ValueError("summa: embedding tables with local_group: each process pushes its own rows; "
                             "leave local_group out")
        for i, (name, t) in enumerate(tables_of(module)):
            t._attach(self, i, name)
        self.local = _LocalGroup(local_group) if local_group is not None else None
        self.overlap = bool(overlap) and self.client.overlaps and self.local is None
        self.num_examples = num_examples
        self.flat = _FlatBuffers(named, double=self.overlap and named[0][1].device.type == "cpu" if named else False)
        # GPU parameters: the exchange reads and writes pinned host copies (summa/_cuda.py).
        self.staging = None
        if self.flat.device.type == "cuda":
            if self.local is not None:
                raise ValueError("summa: local_group with GPU parameters: sum on the GPUs first (NCCL), then "
                                 "give the summed gradient's process the optimizer")
            from ._cuda import DeviceStaging
            self.staging = DeviceStaging(self.flat.weights, self.flat.device)
        self.specs = [(name, tuple(p.shape)) for name, p in self.flat.named]
        self.live_ranks = []
        self._exchanging = None  # the gradient buffer of the step in flight (overlap)
        # Set when a recovery found the server at another step than the one this process is
        # computing: that step's gradient does not go, and step() leaves next_step at the server's.
        self._discard = False
        self._pushed_examples = None
        self._last_timeline = []
        if self.local is not None:
            # Every process of the host starts from its leader's weights; only the leader joins.
            self.local.from_leader(self.flat.weights)
            if self.local.is_leader:
                self._join()
            self._share_from_leader()
        else:
            self._join()
            self._share_gradients()
        self._hooks = None
        if self.overlap:
            ranges = [(p.offset, p.length) for p in self.partitions]
            on_ready = self.client.ready
            if self.staging is not None:
                on_ready = lambda k: self.staging.download(self.client, k, *ranges[k], self.flat.grads)  # noqa: E731
            self._ranges = ranges
            self._hooks = _GradientHooks(self.flat.params, _buckets_by_range(self.flat.offsets, self.flat.sizes, ranges),
                                         len(ranges), self._begin, on_ready, self.flat.bind_grad)
            self._modules = []
            if module is not None:
                self._watch_forward(module, ranges)

    # --- joining -------------------------------------------------------------------------------

    @property
    def _weights_np(self):
        """What the exchange writes the weights into: the flat weights, or their host copy."""
        return self.flat.weights_np if self.staging is None else self.staging.host_weights.numpy()

    def _join(self):
        c = self.client
        initial = self._weights_np if c.rank <= 0 else None
        # A DiLoCo server refuses a joiner that does not take local steps (FAILED_PRECONDITION):
        # its gradients would be taken as pseudo-gradients and step the outer weights the wrong
        # way, with no error anywhere.
        joined = c.join(self.specs, initial, takes_local_steps=self._pushes_pseudo_gradients,
                        tables=[t.spec for t in self.tables])
        self.mode = joined.mode
        self.sync_every = joined.sync_every  # DiLoCo's H (summa.DiLoCo); 0 otherwise
        self.live_ranks = joined.live_ranks
        self.partitions = joined.partitions
        self.version = c.pull(joined.version, self._weights_np)
        if self.staging is not None:
            self.staging.upload_all(self.flat.weights)
        self.next_step = joined.next_step
        return joined

    def _share_gradients(self):
        """On the shared-memory plane, the gradient buffers move into the segment the server sums
        straight out of (Client.shared_floats): a push copies nothing. On a GPU the host buffers
        the gradients are copied down into move there, registered as pinned memory."""
        total = self.flat.weights.numel()
        if total == 0:
            return
        count = len(self.flat.buffers) if self.staging is None else len(self.staging.host_grads)
        shared_floats = getattr(self.client, "shared_floats", None)  # a summa.Client's
        try:
            shared = shared_floats(total * count) if shared_floats is not None else None
        except SummaError:
            shared = None  # another optimizer on this client has the segment: this one copies
        if shared is None:
            return
        shared = torch.from_numpy(shared)
        buffers = [shared[i * total:(i + 1) * total] for i in range(count)]
        if self.staging is None:
            self.flat.move_gradients(buffers)
        else:
            self.staging.move_host_gradients(shared, buffers)

    def _share_from_leader(self):
        """The leader's step, version and weights to the host's other processes."""
        state = torch.zeros(3, dtype=torch.float64)
        if self.local.is_leader:
            state[:] = torch.tensor([self.next_step, self.version, self.mode], dtype=torch.float64)
        self.local.from_leader(state)
        self.next_step, self.version, self.mode = int(state[0]), int(state[1]), int(state[2])
        self.local.from_leader(self.flat.weights)

    @property
    def rank(self):
        return self.client.rank

    # --- overlap -------------------------------------------------------------------------------

    def _watch_forward(self, module, ranges):
        """A forward pre-hook on every module that holds parameters of its own: it waits for the
        partitions those parameters fall in."""
        where = {id(p): i for i, p in enumerate(self.flat.params)}
        buckets_of = _buckets_by_range(self.flat.offsets, self.flat.sizes, ranges)
        for m in module.modules():
            own = [where[id(p)] for p in m.parameters(recurse=False) if id(p) in where]
            if not own:
                continue
            parts = sorted({b for i in own for b in buckets_of[i]})
            self._modules.append(m.register_forward_pre_hook(self._waiter(parts)))

    def _waiter(self, parts):
        def pre_hook(*_):
            if self._hooks.started:
                raise RuntimeError(f"summa: a forward began while step {self.next_step}'s backward had started "
                                   "its exchange and step() was not called (a backward that raised, or a "
                                   "missing opt.step()); the job cannot go on from here")
            if self._exchanging is None:
                return
            try:
                for k in parts:
                    self.client.wait(k)
                    if self.staging is not None:
                        self.staging.upload(k, *self._ranges[k], self.flat.weights)
            except SummaError:
                self._end_step(mid_step=True)  # recovers, or raises what it cannot
        return pre_hook

    def _begin(self):
        """The first gradient of a backward: the last step ends (if it has not), this one begins.
        False when this backward's gradient is not to go (see _end_step)."""
        if self._exchanging is not None:
            self._end_step(mid_step=True)
        if self._discard:
            return False
        self._pushed_examples = int(self.num_examples)
        if self.staging is not None:
            self.staging.next_buffer()
            grads = self.staging.host_grads_now
        else:
            grads = self.flat.grads
        self.client.begin(self.next_step, self._pushed_examples, grads.numpy(), self._weights_np)
        self._exchanging = grads

    def _end_step(self, mid_step=False):
        """Waits for the step in flight to end; after a lost server, rejoins and pushes it again.
        `mid_step`: called while this process computes the next step (in its forward or backward):
        if the server resumed at another step than that one, the computation is for nothing and
        its gradient must not go (step() then leaves next_step at the server's, and the loop
        follows it)."""
        if self.staging is not None:
            self.staging.drain()
        grads, self._exchanging = self._exchanging, None
        step = self.next_step - 1
        try:
            self.live_ranks = self.client.finish()
            self._last_timeline = self.client.timeline()
            if self.staging is not None:  # partitions no module's forward has taken yet
                for k in range(len(self._ranges)):
                    self.staging.upload(k, *self._ranges[k], self.flat.weights)
            return
        except SummaError as e:
            if e.code not in _REJOIN:
                raise
            first_error = e
        if self._push_pull_retrying(step, self._pushed_examples, grads.numpy(), first_error=first_error):
            self.next_step = max(self.next_step, step + 1)
        if self.staging is not None:
            self.staging.upload_all(self.flat.weights)
        self.version = self.next_step if self.mode == pb.MODE_SYNC else self.version
        if mid_step and self.next_step != step + 1:
            self._discard = True

    def group(self):
        """The ranks (ascending) of the next step's group: its global batch is split over these.
        The server names it with each step's replies; in an elastic job (summa-server
        --workers=MIN:MAX) it changes at step boundaries as workers join or are lost. Overlapped,
        it waits for the last step's first reply only (the exchange goes on)."""
        if self._exchanging is not None:
            try:
                self.client.wait(0)
                return self.client.live_ranks_of(0)
            except SummaError:
                self._end_step(mid_step=True)  # recovers, or raises what it cannot
        return list(self.live_ranks)

    def shard(self, batch_size):
        """This process's slice [begin, end) of the next step's global batch of `batch_size`
        examples: the seed's split_batch over group() (index i of n takes [i*b/n, (i+1)*b/n)), so
        that every example of the batch is covered once whoever joined or left. Set num_examples
        to end - begin."""
        group = self.group()
        if self.rank not in group:
            raise RuntimeError(f"summa: rank {self.rank} is not in the group of step {self.next_step} ({group}): "
                               "it was dropped or left")
        i, n = group.index(self.rank), len(group)
        return i * batch_size // n, (i + 1) * batch_size // n

    def synchronize(self):
        """Waits until the last step's weights are all in (before reading them other than by a
        forward: a checkpoint, an evaluation outside the model's forward), and until the tables'
        rows of the last step are pushed (raising what their push met)."""
        if self._exchanging is not None:
            self._end_step()  # on a GPU it also uploads the partitions no forward took
        for t in self.tables:
            t._wait_pushed()

    def no_sync(self):
        """Backwards inside only accumulate gradients (DDP's no_sync); the first backward after it
        exchanges the sum."""
        return _hooks_off(self._hooks)

    def timeline(self):
        """The last finished overlapped step, per partition: {"partition", "ready_ns", "start_ns",
        "end_ns"} (time.monotonic_ns(); -1 where it did not happen)."""
        return [{"partition": k, "ready_ns": r, "start_ns": s, "end_ns": e}
                for k, (r, s, e) in enumerate(self._last_timeline)]

    # --- the step ------------------------------------------------------------------------------

    def zero_grad(self, set_to_none=False):
        if self.staging is not None:
            # The side stream's copies of the last gradients are read before they are zeroed.
            torch.cuda.current_stream(self.flat.device).wait_stream(self.staging.stream)
            self.flat.zero_grad()
            return
        self.flat.zero_grad(in_use=self._exchanging)

    @torch.no_grad()
    def step(self, num_examples=None):
        if num_examples is None:
            num_examples = self.num_examples
        # The tables' rows of this step go first, on the tables' own thread: their pushes and the
        # next batch's prefetched pulls overlap the dense exchange. A step a recovery dropped
        # drops its rows' gradients too.
        for t in self.tables:
            if self._discard:
                t._drop_step()
            else:
                t._flush(self.next_step, num_examples)
        self._dense_step(num_examples)

    def _dense_step(self, num_examples):
        if self._discard:
            # A recovery moved this process to the server's step: this step's gradient is dropped.
            self._discard = False
            if self._hooks is not None:
                self._hooks.reset()
            return
        if self._hooks is not None and self._hooks.started:
            mismatch = int(num_examples) != self._pushed_examples
            # The partitions of parameters that had no gradient (on a GPU: copied, then ready).
            if self.staging is not None:
                for k, named in enumerate(self._hooks.readied):
                    if not named:
                        self.staging.download(self.client, k, *self._ranges[k], self.flat.grads)
            else:
                self.client.ready_all()
            self._hooks.reset()
            self.next_step += 1
            self.version = self.next_step if self.mode == pb.MODE_SYNC else self.version + 1
            if not self._modules:
                self.synchronize()  # no forward to overlap with: the weights are needed now
            if mismatch:
                raise ValueError(f"summa: step({num_examples}) after pushes of {self._pushed_examples} examples "
                                 "began during backward (they went as such); set opt.num_examples before backward")
            return
        if self._exchanging is not None:
            self._end_step()  # a step with no backward since the last one (all of it under no_sync)
        self.flat.gather_grads()
        step = self.next_step
        if self.staging is not None:
            self.staging.download_all(self.flat.grads)
            grads = self.staging.host_grads_now.numpy()
        else:
            grads = self.flat.grads_np
        if self.local is not None:
            self._hierarchical_step(step, int(num_examples))
            return
        else:
            pushed = self._push_pull_retrying(step, int(num_examples), grads)
            if self.staging is not None:
                self.staging.upload_all(self.flat.weights)
            if pushed is False:
                return
        self.next_step = max(self.next_step, step + 1)
        self.version = self.next_step if self.mode == pb.MODE_SYNC else self.version + 1

    def _hierarchical_step(self, step, num_examples):
        examples = self.local.sum_examples(num_examples)
        self.local.sum_to_leader(self.flat.grads)
        if self.local.is_leader:
            if self._push_pull_retrying(step, examples, self.flat.grads_np):
                self.next_step = max(self.next_step, step + 1)
                self.version = self.next_step if self.mode == pb.MODE_SYNC else self.version + 1
        self._share_from_leader()  # the leader's step, version and weights: the host follows it

    def _push_pull_retrying(self, step, num_examples, grads, first_error=None):
        """push_pull of `step`, rejoining through a lost server; False when the server resumed
        before this step (the gradient belongs to weights that no longer exist)."""
        failing_since = time.monotonic()
        backoff = 0.2
        error = first_error
        while True:
            if error is None:
                try:
                    self.live_ranks = self.client.push_pull(step, num_examples, grads, self._weights_np)
                    return True
                except SummaError as e:
                    if e.code not in _REJOIN:
                        raise
                    error = e
            if time.monotonic() - failing_since > self.client.retry_timeout:
                raise SummaError(error.code, f"gave up after {self.client.retry_timeout:.0f} s of "
                                             f"retries: {error.message}", error.what) from None
            log.warning("rank %d lost the server (%s); rejoining in %.1f s", self.rank, error, backoff)
            time.sleep(backoff)
            backoff = min(backoff * 2, 3.0)
            error = None
            try:
                joined = self._join()
            except SummaError as again:
                if again.code not in _REJOIN:
                    raise
                error = again
                continue
            if joined.next_step < step:
                # A server restored from an older checkpoint: this gradient belongs to weights
                # that no longer exist. Take the server's, and its step.
                log.warning("rank %d: the server resumed at step %d; dropping step %d's gradient",
                            self.rank, joined.next_step, step)
                return False
            if joined.next_step > step:
                # It has this step already (the pushes reached it before it went): its weights
                # are what this step would have pulled.
                self.next_step = joined.next_step
                return True

    def leave(self):
        """Leaves the job (the others go on without this rank)."""
        self.synchronize()
        self.client.leave()


class DistributedOptimizer(torch.optim.Optimizer):
    """Horovod's shape: wraps a torch optimizer; step() sums every parameter's gradient over the
    ranks through summa-server's AllReduce, divides by the world size when `op` is "average"
    (the default; "sum" leaves the sum), then steps the wrapped optimizer. The gradients are
    views of one flat buffer, so backward() accumulates straight into what is sent; with overlap
    (the default), buckets of about `bucket_bytes` (in reverse parameter order, DDP's) go as soon as
    backward has finished them, each its own collective. Every rank must step the same number of
    times; parameters the wrapped optimizer holds with requires_grad=False are left out."""

    def __init__(self, optimizer, model=None, op="average", name="summa.gradients", client=None,
                 overlap=True, bucket_bytes=4 << 20, local_group=None):
        from . import _default_client
        if op not in ("average", "sum"):
            raise ValueError(f"op must be 'average' or 'sum', not {op!r}")
        self.__dict__["_inner"] = optimizer
        self.client = client or _default_client()
        self.op = op
        self.name = name
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if model is not None:
            known = {id(p) for p in params}
            missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in known]
            if missing:
                raise ValueError(f"summa: the optimizer does not hold the model's {missing}")
        self.local = _LocalGroup(local_group) if local_group is not None else None
        self.flat = _FlatBuffers([(f"param{i}", p) for i, p in enumerate(params)])
        self.next_step = 0  # steps taken (every rank takes the same)
        self.live_ranks = list(range(self.client.world_size))
        self._hooks = None
        # GPU gradients are summed through a pinned host copy, after backward.
        self._host = None
        if self.flat.device.type == "cuda":
            self._host = torch.zeros(self.flat.grads.numel(), dtype=torch.float32, pin_memory=True)
            overlap = False
        if overlap and self.local is None:
            # Buckets: runs of whole parameters from the last backwards, each about bucket_bytes
            # (bucket 0 holds the last parameters: backward finishes it first).
            self.buckets = []
            end = int(self.flat.offsets[-1])
            for i in reversed(range(len(params))):
                a = int(self.flat.offsets[i])
                if (end - a) * 4 >= bucket_bytes or i == 0:
                    self.buckets.append((a, end - a))
                    end = a
            self.buckets = [(a, n) for a, n in self.buckets if n > 0]
            self._error = None
            self._thread = None
            self._hooks = _GradientHooks(params, _buckets_by_range(self.flat.offsets, self.flat.sizes, self.buckets),
                                         len(self.buckets), self._begin, lambda b: self._queue.put(b),
                                         self.flat.bind_grad)

    def __getattr__(self, name):
        return getattr(self.__dict__["_inner"], name)

    def shard(self, batch_size):
        """This process's slice [begin, end) of each global batch of `batch_size`: split_batch over
        the fixed group of world_size ranks (a collective's group cannot grow: an elastic job
        takes ParameterServerOptimizer)."""
        i, n = self.client.rank, self.client.world_size
        return i * batch_size // n, (i + 1) * batch_size // n

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

    def no_sync(self):
        """Backwards inside only accumulate (DDP's no_sync); the first backward after it sums."""
        return _hooks_off(self._hooks)

    def _begin(self):
        self._error = None
        self._queue = queue.Queue()  # nothing left over from a step that failed
        self._thread = threading.Thread(target=self._exchange, name="summa-buckets", daemon=True)
        self._thread.start()

    def _exchange(self):
        """The bucket thread: bucket 0, 1, ... each summed as soon as backward has finished it (the
        C++ call releases the GIL). In bucket order on every rank, whatever order they became
        ready in, so that no two ranks ever wait on different collectives."""
        g = self.flat.grads_np
        ready = set()
        try:
            for b in range(len(self.buckets)):
                while b not in ready:
                    ready.add(self._queue.get())
                a, n = self.buckets[b]
                view = g[a:a + n]
                self.client.allreduce(view, view, f"{self.name}.b{b}")
        except BaseException as e:  # handed to step()
            self._error = e

    @torch.no_grad()
    def step(self, closure=None):
        if self._hooks is not None and self._hooks.started:
            for b, named in enumerate(self._hooks.readied):  # buckets of parameters with no gradient
                if not named:
                    self._queue.put(b)
            self._hooks.reset()
            self._thread.join()
            self._thread = None
            if self._error is not None:
                raise self._error
        else:
            self.flat.gather_grads()
            if self._host is not None:
                self._host.copy_(self.flat.grads)
                g = self._host.numpy()
            else:
                g = self.flat.grads_np
            if self.local is not None:
                self.local.sum_to_leader(self.flat.grads)
                if self.local.is_leader:
                    self.client.allreduce(g, g, self.name)
                self.local.from_leader(self.flat.grads)
            else:
                self.client.allreduce(g, g, self.name)
            if self._host is not None:
                self.flat.grads.copy_(self._host)
        if self.op == "average":
            self.flat.grads.div_(self._world())
        self.next_step += 1
        return self._inner.step(closure)

    def _world(self):
        if self.local is None:
            return self.client.world_size
        import torch.distributed as dist
        return dist.get_world_size()
