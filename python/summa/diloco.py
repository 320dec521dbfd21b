"""DiLoCo from a PyTorch loop (Douillard et al., "DiLoCo: Distributed Low-Communication Training
of Language Models", 2023), against summa-server --mode=diloco (or diloco-async).

Each process trains its model with its own torch optimizer (the inner one: AdamW in the paper;
any will do) for H steps, the server's --sync_every, learned at join. Then it pushes the
pseudo-gradient, the weights it last pulled less its weights now, times the examples its steps
covered; the server averages the group's (weighted by those examples), applies its outer
optimizer (Nesterov SGD, --outer_lr, --outer_momentum) and answers with the new outer weights,
which the model takes. So the model crosses the network once every H steps instead of twice
every step.

    model = Net()
    opt = summa.DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    for x, y in batches:
        lo, hi = opt.shard(len(x))          # split_batch over the exchange's group
        loss = F.cross_entropy(model(x[lo:hi]), y[lo:hi])
        opt.zero_grad()
        loss.backward()
        opt.step(num_examples=hi - lo)      # the inner step; every H-th also exchanges

The inner optimizer's state stays local and lives across exchanges. A process that joins a
running job (or rejoins after a lost server) pulls the outer weights and starts its H steps from
them. `next_step` counts exchanges: a restarted process resumes at the server's.
"""
import torch

from .optim import ParameterServerOptimizer
from .v1 import summa_pb2 as pb


class DiLoCo(ParameterServerOptimizer):
    """The model trains locally with `inner` (a torch optimizer over its parameters); every
    sync_every steps step() exchanges with the server (sync() exchanges at once: an epoch's end,
    say). Parameters become views of one flat buffer, as with ParameterServerOptimizer, whose
    shard(), group(), rank and leave() it has. Not thread-safe."""

    _pushes_pseudo_gradients = True  # what a --mode=diloco server takes (ParameterServerOptimizer is refused)

    def __init__(self, model, inner, client=None):
        super().__init__(model, client=client, overlap=False)
        if not self.sync_every:
            raise ValueError(f"summa: the server at {self.client.server} is not a DiLoCo job (summa-server "
                             "--mode=diloco): use ParameterServerOptimizer, or start the server with --mode=diloco")
        self.inner = inner
        self.anchor = self.flat.weights.detach().clone()  # the outer weights last pulled
        self._pseudo = torch.empty_like(self.anchor)
        # What the exchange pushes from: the pseudo-gradient itself, or its host copy (GPU).
        self._host_pseudo = self._pseudo if self.staging is None else torch.empty(
            self._pseudo.numel(), dtype=torch.float32, pin_memory=True)
        self.local_steps = 0  # since the last exchange
        self.examples = 0

    def _join(self):
        h = getattr(self, "sync_every", None)
        joined = super()._join()
        if hasattr(self, "anchor") and joined.sync_every != h:
            raise ValueError(f"summa: the server's job changed under this process: {h} local steps between "
                             f"exchanges, now {joined.sync_every} (a server restarted with another --mode or "
                             "--sync_every and no checkpoint)")
        if hasattr(self, "anchor"):
            # A rejoin pulled the outer weights: the steps since the last exchange start again
            # from them.
            self.anchor.copy_(self.flat.weights)
        return joined

    def zero_grad(self, set_to_none=False):
        """Zeros the gradients (in the flat buffer the inner optimizer reads through .grad)."""
        self.flat.zero_grad()

    def step(self, num_examples=1, closure=None):
        """The inner optimizer's step on the gradient of the last backward, which covered
        `num_examples` examples (its weight in the outer average); every sync_every-th step also
        exchanges (sync()). Returns the closure's loss, if any."""
        loss = self.inner.step(closure) if closure is not None else self.inner.step()
        self.local_steps += 1
        self.examples += int(num_examples)
        if self.local_steps >= self.sync_every:
            self.sync()
        return loss

    @torch.no_grad()
    def sync(self):
        """Pushes the pseudo-gradient of the steps since the last exchange and loads the outer
        weights the server answers with; False when there were no steps. After a lost server it
        rejoins and pushes again (for up to client.retry_timeout)."""
        if self.local_steps == 0:
            return False
        examples = self.examples
        torch.sub(self.anchor, self.flat.weights, out=self._pseudo)
        self._pseudo.mul_(float(examples))
        if self._host_pseudo is not self._pseudo:
            self._host_pseudo.copy_(self._pseudo)
        step = self.next_step
        pushed = self._push_pull_retrying(step, examples, self._host_pseudo.numpy())
        if self.staging is not None:
            self.staging.upload_all(self.flat.weights)
        if pushed:
            self.next_step = max(self.next_step, step + 1)
        self.version = self.next_step if self.mode == pb.MODE_SYNC else self.version + 1
        self.anchor.copy_(self.flat.weights)
        self.local_steps = 0
        self.examples = 0
        return True

    def leave(self):
        """Exchanges the steps taken since the last exchange, then leaves the job (the others go
        on without this rank)."""
        self.sync()
        self.client.leave()
