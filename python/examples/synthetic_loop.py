"""The training loop synthetic_resnet.py and synthetic_gpt.py share: their flags, the processes
(Summa's ParameterServerOptimizer or DistributedOptimizer, or torch DDP with gloo), the timed
steps, the compute-only steps after them, and a Chrome trace of two steps.

Each step: zero_grad, forward, backward, opt.step(). With ParameterServerOptimizer given the model
(overlap, the default) each partition's push-pull starts as soon as backward has finished its
gradients and each module's next forward first waits for its own partitions; with
DistributedOptimizer (overlap) each bucket's AllReduce starts during backward and step() waits
for the last; DDP allreduces its buckets during backward and waits at its end. --no_overlap
exchanges everything in step().

The run: --steps steps (the first --warmup untimed); with --trace_dir, two more steps with every
span recorded (written to TRACE_DIR/rank<r>.json, Chrome trace format: chrome://tracing or
ui.perfetto.dev); then --compute_steps steps of forward and backward alone, inside the optimizer's
(or DDP's) no_sync() and with no opt.step(): the same model's compute with no exchange, in the
same processes, both ranks at once. Rank 0 prints one line per step and RESULT {json}:

  step_seconds            wall time per timed step (zero_grad to the end of opt.step(); with
                          overlap, the last step's exchange is waited for in the next forward)
  forward_seconds, backward_seconds, step_call_seconds   its parts (step_call: opt.step())
  wait_seconds            of forward_seconds, the time modules waited for their new weights
  compute_seconds         forward + backward - waits;  exchange_seconds: waits + opt.step()
                          (the loop's own split; under DDP the exchange's tail is inside backward)
  compute_alone_seconds   forward + backward of the compute-only steps (no exchange)
  exposed_seconds         step_seconds - compute_alone_seconds: the communication not hidden
  exchange_busy_seconds   per step, the time any of its exchange calls was in flight: the union
                          of its partitions' push-pulls (from opt.timeline()), of its buckets'
                          AllReduce calls, of DDP's bucket allreduces (timed by a comm hook that
                          does what DDP's default one does), or the one push-pull or AllReduce
  exchange_bytes_per_second   model bytes x 2 (every gradient up, every new value down: what
                          each rank sends plus receives, for a parameter server and for a
                          2-rank allreduce alike) / exchange_busy_seconds
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

import torch


def add_flags(ap, batch_size, lr):
    ap.add_argument("--server", default=None, help="host:port (default $SUMMA_SERVER)")
    ap.add_argument("--rank", type=int, default=None, help="default $RANK (torchrun sets it)")
    ap.add_argument("--world_size", type=int, default=None, help="default $WORLD_SIZE, else 1")
    ap.add_argument("--optimizer", choices=["ps", "distributed"], default="ps",
                    help="ps: ParameterServerOptimizer (the server's --optimizer and --lr); "
                         "distributed: DistributedOptimizer (local SGD at --lr on gradients summed "
                         "through AllReduce)")
    ap.add_argument("--lr", type=float, default=lr, help="SGD's for --optimizer=distributed and --ddp")
    ap.add_argument("--ddp", type=int, default=0,
                    help="torch DDP with N processes instead of Summa: started here, or, under "
                         "torchrun, the processes torchrun started (gloo on the CPU; see --device)")
    ap.add_argument("--device", default="cpu",
                    help="cpu, or cuda: process r on cuda:(LOCAL_RANK or r) modulo the GPUs there "
                         "are (processes may share one); DDP then uses NCCL, or gloo where two "
                         "processes share a GPU (NCCL refuses that); cuda:N puts every process on GPU N")
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--no_overlap", action="store_true",
                    help="exchange the whole gradient in opt.step(), after backward")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the timing")
    ap.add_argument("--compute_steps", type=int, default=3,
                    help="forward+backward steps with no exchange, after the others (compute alone)")
    ap.add_argument("--batch_size", type=int, default=batch_size, help="per process")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--trace_dir", default=None,
                    help="run two more steps and write their Chrome trace to DIR/rank<r>.json")


def pick_device(name, rank):
    """--device as a torch.device: cpu, cuda:N as given, or cuda for process `rank` (LOCAL_RANK
    under torchrun) on GPU rank modulo the GPUs there are."""
    if name == "cpu":
        return torch.device("cpu")
    if not name.startswith("cuda"):
        raise SystemExit(f"--device {name}: want cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: torch sees no GPU here")
    if name == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        device = torch.device("cuda", local % torch.cuda.device_count())
    else:
        device = torch.device(name)
    torch.cuda.set_device(device)
    return device


def _under_torchrun():
    return "TORCHELASTIC_RUN_ID" in os.environ


def run(args, name, model, batch):
    """Trains `model` (built the same on every rank) on batch(rank, step, batch_size, device) ->
    (inputs, loss function of the model's output) as the flags say; returns the exit status. On a
    GPU the step's time ends once the device has run the step's kernels (synchronize)."""
    if args.ddp and args.port == 0 and not _under_torchrun():
        return _launch_ddp(args)
    if args.warmup >= args.steps:
        raise SystemExit(f"--warmup ({args.warmup}) must be below --steps ({args.steps})")
    if args.ddp and args.no_overlap:
        raise SystemExit("--no_overlap is for Summa's optimizers (DDP always overlaps)")
    torch.set_num_threads(args.threads)
    rank_hint = args.rank if args.rank is not None else int(os.environ.get("RANK", "0"))
    device = pick_device(args.device, rank_hint)
    model.to(device)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    model_bytes = 4 * params
    spans = ModuleSpans(model)  # its forward pre-hooks go before the optimizer's

    exchange = ExchangeTimes()
    summa = None
    if args.ddp:
        import torch.distributed as dist
        # NCCL takes one rank per GPU: with this node's processes on distinct GPUs (--device cuda
        # with no more processes than GPUs, or --device cuda:N alone), else gloo.
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))) \
            if _under_torchrun() else args.ddp
        gpus = torch.cuda.device_count() if args.device == "cuda" else 1
        backend = "nccl" if device.type == "cuda" and local <= gpus else "gloo"
        if _under_torchrun():
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{args.port}",
                                    world_size=args.ddp, rank=args.rank)
        rank, world = dist.get_rank(), dist.get_world_size()
        ids = [device.index] if device.type == "cuda" else None
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        net.register_comm_hook(None, exchange.ddp_hook(world))
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        how = f"ddp-{backend}"
    else:
        import summa
        client = summa.init(args.server, rank=args.rank, world_size=args.world_size)
        net = model
        if args.optimizer == "ps":
            opt = summa.ParameterServerOptimizer(model, overlap=not args.no_overlap)
        else:
            summa.broadcast_parameters(model)
            opt = summa.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr), model,
                                             overlap=not args.no_overlap)
        exchange.wrap(client)
        rank, world = summa.rank(), summa.world_size()
        how = f"summa-{args.optimizer}"
    spans.after_optimizer()
    # The overlapped ParameterServerOptimizer: each step's partitions, from opt.timeline() (the
    # last finished step's: known once the next backward has begun, or after synchronize()).
    timelined = hasattr(opt, "timeline") and getattr(opt, "overlap", False)
    overlap = not args.no_overlap
    if rank == 0:
        print(f"{name}: {params:,} parameters ({model_bytes / 2**20:.1f} MiB) on {device}, {world} processes, "
              f"batch {args.batch_size} per process, {how}{'' if overlap else ', no overlap'}"
              + (f", {len(opt.partitions)} partitions" if hasattr(opt, "partitions") else ""), flush=True)

    def one_step(step):
        inputs, loss_of = batch(rank, step, args.batch_size, device)
        t0 = time.monotonic_ns()
        spans.begin_step()
        opt.zero_grad()
        loss = loss_of(net(*inputs))
        t1 = time.monotonic_ns()
        loss.backward()
        t2 = time.monotonic_ns()
        if timelined and step > 0:
            exchange.partitions(step - 1, opt.timeline())
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's kernels, queued, are part of its time
        t3 = time.monotonic_ns()
        exchange.end_step(step)
        return {"step": step, "loss": loss.item(), "t": (t0, t1, t2, t3), "wait_ns": spans.wait_ns}

    timed = []
    total = args.steps + (2 if args.trace_dir else 0)
    for step in range(total):
        tracing = args.trace_dir is not None and step >= args.steps
        spans.recording = tracing
        s = one_step(step)
        t0, t1, t2, t3 = s["t"]
        if step >= args.warmup and step < args.steps:
            timed.append(s)
        if tracing:
            spans.iteration(s)
        if rank == 0:
            fwd, bwd, call, wait = (t1 - t0) / 1e9, (t2 - t1) / 1e9, (t3 - t2) / 1e9, s["wait_ns"] / 1e9
            print(f"step {step + 1}/{total}: loss {s['loss']:.3f}, {(t3 - t0) / 1e9:.3f} s "
                  f"(compute {fwd - wait + bwd:.3f}, exchange {wait + call:.3f}: forward {fwd:.3f} of which "
                  f"waiting {wait:.3f}, backward {bwd:.3f}, step() {call:.3f})"
                  f"{', traced' if tracing else ''}", flush=True)
    if hasattr(opt, "synchronize"):
        opt.synchronize()
        if timelined:
            exchange.partitions(total - 1, opt.timeline())
    spans.recording = False

    # Compute alone: forward and backward with no exchange (no_sync: no push, no allreduce).
    alone = []
    for k in range(args.compute_steps):
        inputs, loss_of = batch(rank, total + k, args.batch_size, device)
        t0 = time.perf_counter()
        opt.zero_grad()
        with (net.no_sync() if args.ddp else opt.no_sync()):
            loss_of(net(*inputs)).backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        alone.append(time.perf_counter() - t0)
    opt.zero_grad()

    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
        path = os.path.join(args.trace_dir, f"rank{rank}.json")
        with open(path, "w") as f:
            json.dump(spans.trace(rank, f"rank {rank} ({how}{'' if overlap else ', no overlap'})",
                                  exchange, range(args.steps, total)), f)
        if rank == 0:
            print(f"trace of steps {args.steps + 1}-{total}: {path}", flush=True)

    if rank == 0 and timed:
        n = len(timed)
        step_s = (timed[-1]["t"][3] - timed[0]["t"][0]) / 1e9 / n
        fwd = sum(s["t"][1] - s["t"][0] for s in timed) / 1e9 / n
        bwd = sum(s["t"][2] - s["t"][1] for s in timed) / 1e9 / n
        call = sum(s["t"][3] - s["t"][2] for s in timed) / 1e9 / n
        wait = sum(s["wait_ns"] for s in timed) / 1e9 / n
        busy = exchange.busy_seconds([s["step"] for s in timed])
        alone_s = sum(alone) / len(alone) if alone else None
        result = {"params": params, "processes": world, "how": how, "overlap": overlap, "device": str(device),
                  "model_bytes": model_bytes, "batch_size": args.batch_size, "timed_steps": n,
                  "step_seconds": step_s, "forward_seconds": fwd, "backward_seconds": bwd,
                  "step_call_seconds": call, "wait_seconds": wait,
                  "compute_seconds": fwd - wait + bwd, "exchange_seconds": wait + call,
                  "compute_alone_seconds": alone_s, "compute_alone_each": alone,
                  "exposed_seconds": None if alone_s is None else step_s - alone_s,
                  "exchange_busy_seconds": busy,
                  "exchange_bytes_per_second": 2 * model_bytes / busy if busy else None,
                  "trace_dir": args.trace_dir}
        if alone_s is not None:
            print(f"{n} timed steps: {step_s:.3f} s a step; compute alone {alone_s:.3f} s; exposed "
                  f"communication {step_s - alone_s:.3f} s; exchange busy {busy or 0:.3f} s a step"
                  + (f" ({2 * model_bytes / busy / 1e6:.0f} MB/s up+down)" if busy else ""), flush=True)
        print("RESULT " + json.dumps(result), flush=True)
    if args.ddp:
        import torch.distributed as dist
        dist.destroy_process_group()
    else:
        summa.shutdown()
    return 0


class ExchangeTimes:
    """Each step's exchange calls as (track, start_ns, end_ns[, ready_ns]), track naming what was
    exchanged ("partition 3", "bucket 0", ...): from opt.timeline(), or by timing the client's
    push_pull and allreduce (the instance's methods wrapped; DistributedOptimizer calls allreduce
    from its bucket thread), or DDP's buckets through a comm hook."""

    def __init__(self):
        self.pending = []  # calls since the last end_step (list.append: safe from other threads)
        self.by_step = {}

    def wrap(self, client):
        def timed(method, track):
            def call(*args, **kwargs):
                start = time.monotonic_ns()
                try:
                    return method(*args, **kwargs)
                finally:
                    self.pending.append((track(args), start, time.monotonic_ns()))
            return call
        client.push_pull = timed(client.push_pull, lambda a: "push-pull, every partition")
        # DistributedOptimizer names a bucket's collective "<name>.b<k>", its whole gradient "<name>".
        client.allreduce = timed(client.allreduce, lambda a: (
            f"bucket {a[2].rsplit('.b', 1)[1]}" if ".b" in a[2] else "allreduce, every parameter"))

    def ddp_hook(self, world):
        import torch.distributed as dist

        def hook(_, bucket):  # DDP's default: the average through an allreduce
            start = time.monotonic_ns()
            index = bucket.index()
            fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()

            def done(f):
                self.pending.append((f"bucket {index}", start, time.monotonic_ns()))
                return f.value()[0]
            return fut.then(done)
        return hook

    def partitions(self, step, timeline):
        self.by_step[step] = [(f"partition {t['partition']}", t["start_ns"], t["end_ns"], t["ready_ns"])
                              for t in timeline if t["start_ns"] >= 0 and t["end_ns"] >= 0]

    def end_step(self, step):
        calls, self.pending = self.pending, []
        if calls:
            self.by_step.setdefault(step, []).extend(calls)

    def busy_seconds(self, steps):
        """Mean over `steps` of the union of each step's call intervals; None if none was seen."""
        totals = []
        for s in steps:
            spans = sorted((c[1], c[2]) for c in self.by_step.get(s, []))
            if not spans:
                continue
            busy, (a, b) = 0, spans[0]
            for start, end in spans[1:]:
                if start > b:
                    busy += b - a
                    a, b = start, end
                else:
                    b = max(b, end)
            totals.append(busy + b - a)
        return sum(totals) / len(totals) / 1e9 if totals else None


class ModuleSpans:
    """Forward pre-hooks around the optimizer's on every module with parameters of its own (the
    modules ParameterServerOptimizer waits in): the first registered before the optimizer is
    built, the second after (torch runs pre-hooks in registration order), so the time between
    them is the module's wait for its weights. Always counts the step's waits; while `recording`,
    also keeps each module's forward span (its wait inside) and backward span (from the gradient
    of its output to the last of its parameters' gradients) for the trace."""

    def __init__(self, model):
        self.recording = False
        self.wait_ns = 0
        self._modules = [(n or "model", m) for n, m in model.named_modules()
                         if any(True for _ in m.parameters(recurse=False))]
        self._entered = {}
        self._events = []  # (tid, name, start_ns, end_ns, args)
        self._iterations = []
        self._backward = {}  # module name -> [start_ns, end_ns]
        for name, m in self._modules:
            m.register_forward_pre_hook(self._enter(name))
            m.register_forward_hook(self._leave(name))
            for p in m.parameters(recurse=False):
                if p.requires_grad:
                    p.register_hook(self._gradient(name))

    def after_optimizer(self):
        for name, m in self._modules:
            m.register_forward_pre_hook(self._waited(name))

    def begin_step(self):
        self.wait_ns = 0
        self._backward = {}

    def _enter(self, name):
        def hook(*_):
            self._entered[name] = [time.monotonic_ns(), None]
        return hook

    def _waited(self, name):
        def hook(*_):
            now = time.monotonic_ns()
            entered = self._entered[name]
            entered[1] = now
            self.wait_ns += now - entered[0]
        return hook

    def _leave(self, name):
        def hook(_, __, output):
            if not self.recording:
                return
            start, waited = self._entered[name]
            self._events.append((0, name, start, time.monotonic_ns(), None))
            if waited is not None and waited - start > 100_000:  # waits over 0.1 ms
                self._events.append((0, "wait for weights", start, waited, {"module": name}))
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(self._output_gradient(name))
        return hook

    def _output_gradient(self, name):
        def hook(_):
            self._backward.setdefault(name, [time.monotonic_ns(), None])
        return hook

    def _gradient(self, name):
        def hook(_):
            if self.recording:
                span = self._backward.setdefault(name, [time.monotonic_ns(), None])
                span[1] = time.monotonic_ns()
        return hook

    def iteration(self, s):
        t0, t1, t2, t3 = s["t"]
        self._iterations.append(s)
        self._events += [(0, f"step {s['step'] + 1}", t0, t3, {"loss": s["loss"]}),
                         (0, "forward", t0, t1, None), (0, "backward", t1, t2, None),
                         (0, "opt.step()", t2, t3, None)]
        # Backward spans, in the order they began, each clipped to start after the last ended
        # (a trace viewer wants the spans of one thread nested).
        last = t1
        for name, (start, end) in sorted(self._backward.items(), key=lambda kv: kv[1][0]):
            start = min(max(start, last), t2)
            end = min(max(end or start, start), t2)
            self._events.append((0, name, start, end, None))
            last = end

    def trace(self, rank, label, exchange, steps):
        """Chrome trace JSON (microseconds, time.monotonic_ns's clock: the ranks' files merge)."""
        us = lambda ns: ns / 1000.0
        events = [{"ph": "M", "name": "process_name", "pid": rank, "args": {"name": label}},
                  {"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "training loop"}}]
        for tid, name, start, end, args in self._events:
            e = {"ph": "X", "name": name, "pid": rank, "tid": tid, "ts": us(start), "dur": us(end - start)}
            if args:
                e["args"] = args
            events.append(e)
        tracks = {}
        for step in steps:
            for call in exchange.by_step.get(step, []):
                track, start, end = call[:3]
                tid = tracks.setdefault(track, 1 + len(tracks))
                if len(call) > 3 and 0 <= call[3] < start - 100_000:  # queued over 0.1 ms
                    events.append({"ph": "X", "name": "ready, queued", "pid": rank, "tid": tid,
                                   "ts": us(call[3]), "dur": us(start - call[3]), "args": {"step": step + 1}})
                events.append({"ph": "X", "name": f"step {step + 1} exchange", "pid": rank, "tid": tid,
                               "ts": us(start), "dur": us(end - start), "args": {"step": step + 1, "what": track}})
        for track, tid in tracks.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": track}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                           "args": {"sort_index": tid}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}


def _launch_ddp(args):
    """--ddp N without torchrun: N processes of this script, rank r each, gloo's rendezvous on a
    free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [a for a in sys.argv[1:] if not a.startswith("--rank")]
    procs = [subprocess.Popen([sys.executable, sys.argv[0], *argv, f"--rank={r}", f"--port={port}"])
             for r in range(args.ddp)]
    try:
        return max(p.wait() for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
