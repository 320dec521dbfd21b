#!/usr/bin/python3
"""Summa against allreduce on an emulated cluster (bench/cluster/lab.py): one lab of worker hosts
and server hosts, links of --rate each way, and on those same hosts, in one run:

  summa      summa-worker --synthetic on N worker hosts, k summa-server shards on k server hosts
             of their own (BytePS's layout), for k in --shards at N = --shard_workers, and k = N
             for N in --workers
  colocated  the same with shard i on worker host i (k = N)
  gloo       torch.distributed's gloo allreduce (bench/allreduce_gloo.py) across the worker hosts
  mpi        Open MPI's MPI_Allreduce through mpi4py (bench/allreduce_mpi.py) across them, over
             TCP (btl tcp on eth0): mpirun runs on w0 and execs each rank into its host's
             namespace; PMIx's clients reach it over the lab's links (its TCP listener admits
             remote connections), since a rank in another namespace cannot reach w0's loopback

and then small models (--latency_sizes) at N = --latency_workers: summa on one server host, gloo
and mpi. Needs root (the lab). Example (the run in bench/results-cluster.md):

  sudo bench/cluster/cluster_bench.py --bin=build --out=bench/results-cluster.md --plot=bench/cluster.png

Each exchange's time is per step: Summa's is the slowest worker's PushPull wall time (step 0,
which also waits for the joins, is not counted), an allreduce's the slowest rank's all_reduce
call; the median and the spread (min-max) over the steps. Link bytes are the switch ports' own
counters (/sys/class/net/PORT/statistics, headers included), not the programs': for Summa per step
over a window from every worker's step 0 to its step S-2, for gloo and mpi the whole run (warm-up,
timed calls and the ranks' rendezvous) over the calls made. B is measured first: one TCP stream
between two worker hosts. The bound is BytePS's (OSDI 2020) with that B: a sharded server over k
hosts of its own max(M/B, N*M/(k*B)); colocated shards and a ring allreduce 2(N-1)/N * M/B.
Every run's result is checked: Summa's weights equal their exact value (lr a power of two), the
allreduces' sums are exact. The lab has no netem on some kernels: --delay and --loss then say so
and the rest runs without them.
"""
import argparse
import datetime
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from lab import Lab, LabError, NETEM_MISSING, has_netem, measure_rate, need_root  # noqa: E402

LR = 2.0 ** -10
HEADER = """# Summa against allreduce on an emulated cluster

`bench/cluster/cluster_bench.py` on a lab of `bench/cluster/lab.py` (network namespaces on one
bridge, each host's link shaped by tbf on both ends): Summa with k shards on k server hosts of
their own, Summa with a shard on each worker host (colocated), gloo's ring allreduce and Open MPI's
allreduce, on the same hosts in one run. Per-step exchange time: Summa's is the slowest worker's
PushPull (step 0 not counted), an allreduce's the slowest rank's call; median and min-max over the
steps. Link bytes: the switch ports' counters (/sys/class/net/*/statistics), per step (Summa: a
window from every worker's step 0 to its step S-2; gloo and mpi: the whole run over its calls).
"Both ways at once": of the time a host's link carried data (either way above B/10, in ~10 ms
samples), the share it carried data both ways. Cores busy: the whole machine's, and of them the
run's (its processes' CPU and the softirqs); the machine is shared, and the load average at each
run's start is in the table. The bound: BytePS's, with the measured B. What the figures mean:
[docs/design.md](../docs/design.md#where-a-parameter-server-beats-allreduce).

"""
UNITS = {"": 1, "B": 1, "K": 1024, "KIB": 1024, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GIB": 1 << 30}


def parse_size(text):
    m = re.fullmatch(r"(\d+)\s*([A-Za-z]*)", text.strip())
    if not m or m.group(2).upper() not in UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text} (examples: 4KiB, 1MiB, 64MiB)")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


def size_list(text):
    return [parse_size(s) for s in text.split(",") if s]


def int_list(text):
    return [int(s) for s in text.split(",") if s]


def fmt_size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def fmt_time(seconds):
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def expected_first_weight(world, steps):
    p = 1
    while p < world:
        p *= 2
    return -steps * LR * (world * (world + 1) / 2) / p


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, ProcessLookupError):
        return None


def machine_busy():
    """(busy, softirq, total) jiffies of this machine's CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]  # user nice system idle iowait irq softirq
    return sum(v) - v[3] - v[4], v[6], sum(v)


class Run:
    """One configuration's measurement."""

    def __init__(self, impl, workers, shards, size):
        self.impl, self.workers, self.shards, self.size = impl, workers, shards, size
        self.times = []  # seconds per step (the slowest participant's)
        self.bytes = {}  # host name -> (up, down) per step
        self.bytes_note = ""
        self.correct = None
        self.error = ""
        self.server_cpu = None  # seconds per step, per server process
        self.worker_cpu = None  # seconds per step, per worker process
        self.busy = None  # cores busy in the window, all of this machine's
        self.ours = None  # of them, the run's: its processes' CPU and the softirqs (the links)
        self.timeline = []  # (time, link_bytes()) every ~10 ms while the run exchanges
        self.load = os.getloadavg()[0]  # this machine's, as the run starts (it may be shared)

    @property
    def median(self):
        return statistics.median(self.times) if self.times else None

    def label(self):
        if self.impl == "summa":
            return f"summa, k={self.shards} server hosts"
        if self.impl == "colocated":
            return f"summa colocated, k={self.shards}"
        return self.impl


class Bench:
    def __init__(self, args, lab, log):
        self.args, self.lab, self.log = args, lab, log
        self.rundir = args.rundir
        self.b_bits = None

    # ---- Summa ---------------------------------------------------------------------------
    def summa(self, workers, shards, size, steps, colocated=False):
        run = Run("colocated" if colocated else "summa", workers, shards, size)
        lab, a = self.lab, self.args
        tag = f"{run.impl}-n{workers}-k{shards}-{fmt_size(size)}"
        deadline = time.monotonic() + a.timeout
        server_hosts = lab.workers[:shards] if colocated else lab.servers[:shards]
        servers, addresses, procs = [], [], []
        try:
            for i, h in enumerate(server_hosts):
                port_file = os.path.join(self.rundir, f"{tag}-shard{i}.port")
                argv = [a.server, f"--address={h.ip}:0", f"--port_file={port_file}",
                        f"--data_address={h.ip}:0", f"--workers={workers}", f"--lr={LR!r}",
                        f"--partition_bytes={a.partition_bytes}", f"--shards={shards}", f"--shard={i}",
                        f"--barrier_deadline={a.timeout}s", "--checkpoint_every=0"]
                if i > 0:
                    argv.append(f"--coordinator={addresses[0]}")
                p = lab.start(h, argv, os.path.join(self.rundir, f"{tag}-shard{i}.log"))
                servers.append(p)
                procs.append(p)
                addresses.append(f"{h.ip}:{self.wait_for_file(port_file, p, deadline)}")
            logs = []
            workers_procs = []
            for r in range(workers):
                log_path = os.path.join(self.rundir, f"{tag}-worker{r}.log")
                p = lab.start(lab.workers[r], [
                    a.worker, f"--server={','.join(addresses)}", f"--rank={r}", f"--world_size={workers}",
                    f"--synthetic={size}", f"--steps={steps}", "--data_plane=socket",
                    f"--call_deadline={a.timeout}s", f"--join_deadline={a.timeout}s"], log_path)
                workers_procs.append(p)
                procs.append(p)
                logs.append(log_path)
            # The window: every worker past step 0 (joins, initial values, the first pull behind
            # it) to every worker past step S-2.
            opened = closed = None
            last = steps - 2
            while True:
                texts = [self.read(path) for path in logs]

                def past(step):
                    return all(re.search(rf"^synthetic_step rank=\d+ step={step} ", t, re.M) for t in texts)

                if opened is None and past(0):
                    opened = self.sample(servers, workers_procs)
                    run.timeline.append((opened["t"], opened["bytes"]))
                if opened is not None and closed is None and past(last):
                    closed = self.sample(servers, workers_procs)
                    run.timeline.append((closed["t"], closed["bytes"]))
                elif opened is not None and closed is None:
                    run.timeline.append((time.monotonic(), lab.link_bytes()))
                if all(p.poll() is not None for p in workers_procs):
                    break
                dead = [p for p in servers if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"a server exited ({dead[0].returncode}): {self.tail(dead[0].log_path)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not done within {a.timeout} s")
                time.sleep(0.01)
            for p in workers_procs:
                if p.returncode != 0:
                    raise RuntimeError(f"a worker exited with {p.returncode}: {self.tail(p.log_path)}")
            results = [self.synthetic_result(self.read(path)) for path in logs]
            per_step = [max(r["step_us"][s] for r in results) / 1e6 for s in range(1, steps)]
            run.times = per_step
            want = expected_first_weight(workers, steps)
            run.correct = all(r["first_weight"] == want and r["uniform"] == "yes" for r in results)
            if not run.correct:
                run.error = f"weights: {[r['first_weight'] for r in results]}, expected {want}"
            if opened and closed and last > 0:
                self.window(run, opened, closed, last, len(servers), workers)
        except (RuntimeError, TimeoutError, OSError) as e:
            run.error = str(e)
        finally:
            lab.stop(procs)
        return run

    def sample(self, servers, workers):
        return {"t": time.monotonic(), "bytes": self.lab.link_bytes(), "busy": machine_busy(),
                "server_cpu": [cpu_seconds(p.pid) for p in servers],
                "worker_cpu": [cpu_seconds(p.pid) for p in workers]}

    def window(self, run, opened, closed, steps, nservers, nworkers):
        run.bytes = {h: ((closed["bytes"][h][0] - opened["bytes"][h][0]) / steps,
                         (closed["bytes"][h][1] - opened["bytes"][h][1]) / steps) for h in closed["bytes"]}
        dt = closed["t"] - opened["t"]
        busy, softirq, total = (c - o for c, o in zip(closed["busy"], opened["busy"]))
        cores = os.cpu_count()
        if total and dt > 0:
            run.busy = busy / total * cores
            cpu = [c - o for key in ("server_cpu", "worker_cpu") for o, c in zip(opened[key], closed[key])
                   if o is not None and c is not None]
            run.ours = sum(cpu) / dt + softirq / total * cores

        def per_step(key, n):
            pairs = [(b, a) for a, b in zip(opened[key], closed[key]) if a is not None and b is not None]
            return sum(b - a for b, a in pairs) / steps / n if pairs else None

        run.server_cpu = per_step("server_cpu", nservers) if nservers else None
        run.worker_cpu = per_step("worker_cpu", nworkers)

    @staticmethod
    def synthetic_result(text):
        for line in text.splitlines():
            if line.startswith("synthetic_result "):
                fields = dict(f.split("=", 1) for f in line.split()[1:])
                fields["step_us"] = [float(x) for x in fields["step_us"].split(",")]
                fields["first_weight"] = float(fields["first_weight"])
                return fields
        raise RuntimeError(f"no synthetic_result line in:\n{text[-2000:]}")

    # ---- allreduce -----------------------------------------------------------------------
    def allreduce(self, impl, workers, sizes, iters, warmup):
        """gloo or mpi across the first `workers` worker hosts, every size in one launch: a Run per size."""
        lab, a = self.lab, self.args
        runs = {s: Run(impl, workers, 0, s) for s in sizes}
        tag = f"{impl}-n{workers}-{fmt_size(sizes[0])}"
        common = [f"--sizes={','.join(map(str, sizes))}", f"--iters={iters}", f"--warmup={warmup}"]
        procs = []
        deadline = time.monotonic() + a.timeout
        try:
            opened = self.sample([], [])
            if impl == "gloo":
                store = os.path.join(self.rundir, f"{tag}.store")
                for r in range(workers):
                    procs.append(lab.start(lab.workers[r], [
                        "env", "GLOO_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1", a.python,
                        os.path.join(ROOT, "bench/allreduce_gloo.py"), f"--rank={r}", f"--world={workers}",
                        f"--store={store}", f"--timeout={a.timeout}", *common],
                        os.path.join(self.rundir, f"{tag}-rank{r}.log")))
            else:
                # mpirun on w0, each rank exec'd into its host's namespace (rank r on w r). PMIx's
                # clients reach mpirun over TCP, on loopback unless remote connections are allowed:
                # here they come over the lab's links, as the ranks' own traffic does (btl tcp, eth0).
                rank_cmd = (f"exec ip netns exec {lab.tag}-w$OMPI_COMM_WORLD_RANK {shlex.quote(a.python)} "
                            f"{shlex.quote(os.path.join(ROOT, 'bench/allreduce_mpi.py'))} {' '.join(common)}")
                procs.append(lab.start(lab.workers[0], [
                    "env", "PMIX_MCA_ptl_tcp_remote_connections=1", "PMIX_MCA_ptl_tcp_if_include=eth0",
                    "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(workers),
                    "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "eth0",
                    "--mca", "oob_tcp_if_include", "eth0", "bash", "-c", rank_cmd],
                    os.path.join(self.rundir, f"{tag}.log")))
            timeline = []
            while any(p.poll() is None for p in procs):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not done within {a.timeout} s")
                timeline.append((time.monotonic(), lab.link_bytes()))
                time.sleep(0.01)
            closed = self.sample([], [])
            text = "".join(self.read(p.log_path) for p in procs)
            bad = [p for p in procs if p.returncode != 0]
            if bad:
                raise RuntimeError(f"exited with {bad[0].returncode}: {self.tail(bad[0].log_path)}")
            if "unavailable" in text:
                raise RuntimeError(re.search(r"unavailable.*", text).group(0))
            for size, run in runs.items():
                lines = re.findall(rf"^result bytes={size} rank=(\d+) correct=(\w+) times_us=([\d.,]+)(.*)$", text, re.M)
                if len(lines) != workers:
                    raise RuntimeError(f"{len(lines)} result lines for {size} bytes, not {workers}:\n{text[-2000:]}")
                times = [[float(t) / 1e6 for t in line[2].split(",")] for line in lines]
                run.times = [max(ts[i] for ts in times) for i in range(iters)]
                run.correct = all(line[1] == "yes" for line in lines)
                if not run.correct:
                    run.error = next(line[3] for line in lines if line[1] != "yes")
            if len(sizes) == 1:
                run = runs[sizes[0]]
                calls = iters + warmup
                run.bytes = {h: ((closed["bytes"][h][0] - opened["bytes"][h][0]) / calls,
                                 (closed["bytes"][h][1] - opened["bytes"][h][1]) / calls) for h in closed["bytes"]}
                run.bytes_note = "whole run / calls"
                run.timeline = timeline
        except (RuntimeError, TimeoutError, OSError) as e:
            for run in runs.values():
                run.error = run.error or str(e)
        finally:
            lab.stop(procs)
        return list(runs.values())

    # ---- helpers -------------------------------------------------------------------------
    @staticmethod
    def read(path):
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def tail(self, path, n=1500):
        return self.read(path)[-n:].strip()

    def wait_for_file(self, path, proc, deadline):
        while True:
            text = self.read(path).strip()
            if text:
                return text
            if proc.poll() is not None:
                raise RuntimeError(f"exited with {proc.returncode} before writing {path}: {self.tail(proc.log_path)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} not written in time")
            time.sleep(0.02)

    # ---- the bound -----------------------------------------------------------------------
    def bound(self, run):
        """BytePS's exchange time for the run's layout with the measured B (bytes/s each way)."""
        b = self.b_bits / 8
        m, n, k = run.size, run.workers, run.shards
        if run.impl == "summa":
            return max(m / b, n * m / (k * b))
        return 2 * (n - 1) / n * m / b  # colocated shards (k = N) and the ring alike


def duplex(run, hosts, rate_bytes):
    """Of the time a host link carried data (either way above a tenth of B, in ~10 ms samples),
    the share it carried data both ways at once: a full-duplex link used as one that is not shows
    near 0%, a ring near 100%. Mean over `hosts`; None without samples."""
    shares = []
    for h in hosts:
        both = either = 0.0
        for (t0, b0), (t1, b1) in zip(run.timeline, run.timeline[1:]):
            dt = t1 - t0
            if dt <= 0:
                continue
            up = (b1[h.name][0] - b0[h.name][0]) / dt > 0.1 * rate_bytes
            down = (b1[h.name][1] - b0[h.name][1]) / dt > 0.1 * rate_bytes
            either += dt if up or down else 0
            both += dt if up and down else 0
        if either > 0:
            shares.append(both / either)
    return sum(shares) / len(shares) if shares else None


def table_row(cells):
    return "| " + " | ".join(cells) + " |"


def bytes_cells(run, lab):
    """Mean MiB per step up/down over the worker hosts and over the server hosts the run used."""
    if not run.bytes:
        return ["-", "-"]
    w = [run.bytes[h.name] for h in lab.workers[:run.workers]]
    cells = [f"{sum(u for u, _ in w) / len(w) / (1 << 20):.1f} / {sum(d for _, d in w) / len(w) / (1 << 20):.1f}"]
    if run.impl == "summa":
        s = [run.bytes[h.name] for h in lab.servers[:run.shards]]
        cells.append(f"{sum(u for u, _ in s) / len(s) / (1 << 20):.1f} / {sum(d for _, d in s) / len(s) / (1 << 20):.1f}")
    else:
        cells.append("-")
    return cells


def duplex_cell(bench, run):
    rate = bench.b_bits / 8
    w = duplex(run, bench.lab.workers[:run.workers], rate)
    srv = duplex(run, bench.lab.servers[:run.shards], rate) if run.impl == "summa" else None
    cells = [f"{x * 100:.0f}%" if x is not None else "-" for x in (w, srv)]
    return cells[0] if run.impl != "summa" else ", ".join(cells)


def big_table(bench, runs, gloo_by_n):
    lab = bench.lab
    lines = [table_row(["N", "layout", "median step", "spread (min-max)", "bound", "x bound", "x gloo",
                        "worker link MiB/step up / down", "server link MiB/step up / down",
                        "both ways at once: worker, server links", "CPU s/step: server, worker",
                        f"cores busy (of {os.cpu_count()}): all, the run's", "load avg at start", "correct"]),
             "|" + "---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for run in runs:
        if run.error and not run.times:
            lines.append(table_row([str(run.workers), run.label(), "failed: " + run.error.replace("\n", " ")[:300]] +
                                   [""] * 11))
            continue
        bound = bench.bound(run)
        gloo = gloo_by_n.get(run.workers)
        cpu = "-"
        if run.worker_cpu is not None:
            cpu = (f"{run.server_cpu:.2f}, " if run.server_cpu is not None else "-, ") + f"{run.worker_cpu:.2f}"
        lines.append(table_row([
            str(run.workers), run.label(), fmt_time(run.median),
            f"{fmt_time(min(run.times))} - {fmt_time(max(run.times))}", fmt_time(bound),
            f"{run.median / bound:.2f}", f"{run.median / gloo:.2f}" if gloo else "-",
            *bytes_cells(run, lab), duplex_cell(bench, run), cpu,
            f"{run.busy:.2f}, {run.ours:.2f}" if run.busy is not None else "-", f"{run.load:.1f}",
            "yes" if run.correct else f"NO {run.error}"]))
    return lines


def plot(path, bench, k_runs, n_runs, gloo_by_n, mpi_by_n, colo_by_n, shard_workers, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ks = [r.shards for r in k_runs if r.median]
    ax1.plot(ks, [r.median for r in k_runs if r.median], "o-", label="Summa, k server hosts")
    ax1.plot(ks, [bench.bound(r) for r in k_runs if r.median], "k--", label="BytePS bound, measured B")
    ax1.plot(ks, [2 * bench.bound(r) for r in k_runs if r.median], "--", color="grey",
             label="2x bound: the push, then the pull")
    for by, name, style in ((gloo_by_n, "gloo ring", "r:"), (mpi_by_n, "Open MPI", "g:"),
                            (colo_by_n, "Summa colocated (k=N)", "m-.")):
        if by.get(shard_workers):
            ax1.axhline(by[shard_workers], linestyle=style[1:], color=style[0], label=name)
    ax1.set_xlabel("k (server hosts)")
    ax1.set_ylabel("exchange time per step (s)")
    ax1.set_xticks(ks)
    ax1.set_title(f"N = {shard_workers} worker hosts")
    ax1.set_ylim(bottom=0)
    ax1.legend(fontsize=8)
    ns = sorted({r.workers for r in n_runs if r.median})
    summa = {r.workers: r for r in n_runs if r.median}
    ax2.plot(ns, [summa[n].median for n in ns], "o-", label="Summa, k = N server hosts")
    ax2.plot(ns, [bench.bound(summa[n]) for n in ns], "k--", label="bound, k = N: M/B")
    ax2.plot(ns, [2 * bench.bound(summa[n]) for n in ns], "--", color="grey", label="2x that: the push, then the pull")
    ring = [2 * (n - 1) / n * summa[n].size / (bench.b_bits / 8) for n in ns]
    ax2.plot(ns, ring, "k:", label="bound, ring / colocated: 2(N-1)/N M/B")
    for by, name, style in ((gloo_by_n, "gloo ring", "rs-"), (mpi_by_n, "Open MPI", "g^-"),
                            (colo_by_n, "Summa colocated", "mD-")):
        pts = [n for n in ns if by.get(n)]
        ax2.plot(pts, [by[n] for n in pts], style, label=name)
    ax2.set_xlabel("N (worker hosts)")
    ax2.set_xticks(ns)
    ax2.set_title("against N")
    ax2.set_ylim(bottom=0)
    ax2.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build"),
                    help="build directory holding server/summa-server and worker/summa-worker (default: build/)")
    ap.add_argument("--rate", default="1gbit", help="each host link's rate each way, tc syntax (default 1gbit)")
    ap.add_argument("--delay", help="netem delay on what each host sends (needs netem; said and left out where missing)")
    ap.add_argument("--loss", help="netem loss on what each host sends (needs netem; as --delay)")
    ap.add_argument("--model", type=parse_size, default=64 << 20, help="the model for the throughput runs (default 64MiB)")
    ap.add_argument("--partition_bytes", type=parse_size, default=1 << 20,
                    help="summa-server --partition_bytes (default 1MiB: a 64MiB model in 64, 8 per shard at k=8; "
                         "a step's first push and last pull, which no other partition's traffic overlaps, "
                         "take a partition each)")
    ap.add_argument("--workers", type=int_list, default=[2, 4, 8],
                    help="the N axis: worker hosts, each run with k = N server hosts, colocated, gloo, mpi (default 2,4,8)")
    ap.add_argument("--shards", type=int_list, default=[1, 2, 4],
                    help="the k axis: server hosts, at N = --shard_workers (default 1,2,4)")
    ap.add_argument("--shard_workers", type=int, default=4, help="N for the k axis (default 4)")
    ap.add_argument("--steps", type=int, default=8,
                    help="Summa steps per throughput run; step 0 is not timed (default 8); gloo and mpi "
                         "make --steps - 1 timed calls after one warm-up")
    ap.add_argument("--latency_sizes", type=size_list, default=size_list("4KiB,64KiB,1MiB"),
                    help="small models for the latency runs (default 4KiB,64KiB,1MiB; empty: none)")
    ap.add_argument("--latency_workers", type=int, default=8, help="N for the latency runs (default 8)")
    ap.add_argument("--latency_steps", type=int, default=40, help="steps (calls) per latency run (default 40)")
    ap.add_argument("--impls", default="summa,colocated,gloo,mpi",
                    help="which to run, of summa,colocated,gloo,mpi (default all)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds one run may take before it is stopped (default 300)")
    ap.add_argument("--python", default="/usr/bin/python3", help="the Python with torch and mpi4py (default /usr/bin/python3)")
    ap.add_argument("--rundir", help="where the runs' logs go (default: a new directory under /tmp, kept)")
    ap.add_argument("--out", help="write the report (markdown) here as well as to stdout")
    ap.add_argument("--append", action="store_true", help="append the report to --out instead of replacing it")
    ap.add_argument("--plot", help="write the plot (PNG, matplotlib) here")
    a = ap.parse_args()
    a.server = os.path.join(a.bin, "server", "summa-server")
    a.worker = os.path.join(a.bin, "worker", "summa-worker")
    impls = set(a.impls.split(","))
    if impls - {"summa", "colocated", "gloo", "mpi"}:
        ap.error(f"--impls: unknown {sorted(impls - {'summa', 'colocated', 'gloo', 'mpi'})}")
    for path in (a.server, a.worker):
        if not os.access(path, os.X_OK):
            ap.error(f"--bin: no {path}")
    if a.steps < 3:
        ap.error("--steps must be at least 3")
    try:
        need_root()
    except LabError as e:
        print(f"cluster_bench: {e}", file=sys.stderr)
        return 2
    a.rundir = a.rundir or subprocess.run(["mktemp", "-d", "/tmp/summa-cluster-XXXXXX"], capture_output=True,
                                          text=True, check=True).stdout.strip()
    os.makedirs(a.rundir, exist_ok=True)
    notes = []
    netem = has_netem()
    if (a.delay or a.loss) and not netem:
        notes.append(f"--delay/--loss asked for, but {NETEM_MISSING}; every run here is without them.")
        a.delay = a.loss = None
    if not netem:
        notes.append("No netem on this kernel: the latency runs have no added link delay; they measure "
                     "the software path and the links' serialization at the rate alone.")
    for n in notes:
        print(f"cluster_bench: {n}", file=sys.stderr)
    n_max = max(a.workers + [a.shard_workers] + ([a.latency_workers] if a.latency_sizes else []))
    k_max = max(a.shards + ([max(a.workers)] if "summa" in impls else []) + [1])

    import signal
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    started = datetime.datetime.now(datetime.timezone.utc)
    load = os.getloadavg()[0]
    with Lab(n_max, k_max, rate=a.rate, delay=a.delay, loss=a.loss, log=log) as lab:
        bench = Bench(a, lab, log)
        bench.b_bits = measure_rate(lab, lab.workers[0], lab.workers[1], seconds=3)
        log(f"B: one TCP stream w0 -> w1: {bench.b_bits / 1e6:.0f} Mbit/s")
        k_runs, n_runs, colo, gloo, mpi, lat = [], [], [], [], [], []

        def note(run):
            log(f"  {run.label():32} N={run.workers} {fmt_size(run.size):>6}: median {fmt_time(run.median)}"
                f"{'' if not run.error else ' ERROR ' + run.error[:300]}")
            return run

        for k in a.shards if "summa" in impls else []:
            k_runs.append(note(bench.summa(a.shard_workers, k, a.model, a.steps)))
        for n in a.workers:
            if "summa" in impls:
                same = [r for r in k_runs if r.workers == n and r.shards == n]
                n_runs.append(same[0] if same else note(bench.summa(n, n, a.model, a.steps)))
            if "colocated" in impls:
                colo.append(note(bench.summa(n, n, a.model, a.steps, colocated=True)))
            for impl, into in (("gloo", gloo), ("mpi", mpi)):
                if impl in impls:
                    into.extend(note(r) for r in bench.allreduce(impl, n, [a.model], a.steps - 1, 1))
        if a.shard_workers not in a.workers:
            for impl, into in (("gloo", gloo), ("mpi", mpi)):
                if impl in impls:
                    into.extend(note(r) for r in bench.allreduce(impl, a.shard_workers, [a.model], a.steps - 1, 1))
            if "colocated" in impls:
                colo.append(note(bench.summa(a.shard_workers, a.shard_workers, a.model, a.steps, colocated=True)))
        if a.latency_sizes:
            n = a.latency_workers
            for size in a.latency_sizes:
                if "summa" in impls:
                    lat.append(note(bench.summa(n, 1, size, a.latency_steps)))
            for impl in ("gloo", "mpi"):
                if impl in impls:
                    lat.extend(note(r) for r in bench.allreduce(impl, n, a.latency_sizes, a.latency_steps - 1, 1))

    def by_n(runs):
        return {r.workers: r.median for r in runs if r.median and r.size == a.model}

    gloo_by_n, mpi_by_n, colo_by_n = by_n(gloo), by_n(mpi), by_n(colo)
    report = []
    cmd = "sudo bench/cluster/cluster_bench.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    report += [f"## Links of {a.rate}, a {fmt_size(a.model)} model ({started:%Y-%m-%d %H:%M} UTC)", "",
               f"Command: `{cmd}`", "",
               f"Environment: {os.cpu_count()} cores, Linux {platform.release()} {platform.machine()}, "
               f"load average {load:.2f} at start, {started:%Y-%m-%d %H:%M} UTC; lab: {n_max} worker hosts and "
               f"{k_max} server hosts (network namespaces on one bridge), links {lab.describe_link()}; "
               f"{len(lab.hosts) + 1} namespaces in all. Logs: {a.rundir}.", ""]
    report += [f"- {n}" for n in notes] + ([""] if notes else [])
    report += [f"B, measured: one TCP stream from worker host w0 to w1 for 3 s, the first quarter left out: "
               f"**{bench.b_bits / 1e6:.0f} Mbit/s** of goodput ({bench.b_bits / 8 / (1 << 20):.1f} MiB/s; "
               f"the link's {a.rate} less TCP/IP headers). Every bound below uses it.", ""]
    m = fmt_size(a.model)
    report += [f"### {m}, against k (N = {a.shard_workers} worker hosts) and against N", ""]
    rows = k_runs + [r for r in n_runs if r not in k_runs] + colo + gloo + mpi
    rows.sort(key=lambda r: (r.workers, ["summa", "colocated", "gloo", "mpi"].index(r.impl), r.shards))
    report += big_table(bench, rows, gloo_by_n) + [""]
    if lat:
        report += [f"### Small models, N = {a.latency_workers} (Summa on one server host)", "",
                   table_row(["model", "layout", "median step", "spread (min-max)", "x gloo", "correct"]),
                   "|---:|---|---:|---|---:|---|"]
        lat_gloo = {r.size: r.median for r in lat if r.impl == "gloo" and r.median}
        for r in sorted(lat, key=lambda r: (r.size, ["summa", "gloo", "mpi"].index(r.impl))):
            if not r.times:
                report.append(table_row([fmt_size(r.size), r.label(), "failed: " + r.error[:300], "", "", ""]))
                continue
            g = lat_gloo.get(r.size)
            report.append(table_row([fmt_size(r.size), r.label(), fmt_time(r.median),
                                     f"{fmt_time(min(r.times))} - {fmt_time(max(r.times))}",
                                     f"{r.median / g:.2f}" if g else "-", "yes" if r.correct else f"NO {r.error}"]))
        report.append("")
    report += targets(a, bench, k_runs, n_runs, colo_by_n, gloo_by_n, lat)
    text = "\n".join(report) + "\n"
    print(text)
    if a.out:
        with open(a.out, "a" if a.append else "w") as f:
            if not a.append:
                f.write(HEADER)
            f.write(text)
    if a.plot:
        plot(a.plot, bench, k_runs, n_runs, gloo_by_n, mpi_by_n, colo_by_n, a.shard_workers,
             f"{m} model, links {a.rate} each way (measured B {bench.b_bits / 1e6:.0f} Mbit/s), "
             f"{os.cpu_count()} cores, {started:%Y-%m-%d}")
    failed = [r for r in k_runs + n_runs + colo + gloo + mpi + lat if r.error]
    return 1 if failed else 0


def targets(a, bench, k_runs, n_runs, colo_by_n, gloo_by_n, lat):
    """Issue 46's targets, each met or not, from this run's figures."""
    out = ["### Targets", ""]

    def verdict(ok):
        return "**met**" if ok else "**not met**"

    def find(runs, n, k):
        return next((r for r in runs if r.workers == n and r.shards == k and r.median), None)

    r44 = find(k_runs + n_runs, 4, 4)
    if r44 and gloo_by_n.get(4):
        x, g = r44.median / bench.bound(r44), r44.median / gloo_by_n[4]
        out.append(f"- N=4, k=4 at most 1.15x bound and 0.75x gloo: {x:.2f}x bound, {g:.2f}x gloo: "
                   f"{verdict(x <= 1.15 and g <= 0.75)}")
    for k in (1, 2):
        r = find(k_runs, 4, k)
        if r:
            x = r.median / bench.bound(r)
            out.append(f"- N=4, k={k} within 1.15x bound: {x:.2f}x: {verdict(x <= 1.15)}")
    for n, c in sorted(colo_by_n.items()):
        if gloo_by_n.get(n):
            out.append(f"- colocated no slower than gloo, N={n}: {c / gloo_by_n[n]:.2f}x gloo: "
                       f"{verdict(c <= gloo_by_n[n])}")
    r88 = find(n_runs, 8, 8)
    out.append(f"- N=8, k=8 (16 host namespaces) runs: {verdict(r88 is not None and r88.correct)}" +
               (f" ({fmt_time(r88.median)}, {r88.median / bench.bound(r88):.2f}x bound)" if r88 else ""))
    s4 = next((r for r in lat if r.impl == "summa" and r.size == 4096 and r.median), None)
    g4 = next((r for r in lat if r.impl == "gloo" and r.size == 4096 and r.median), None)
    if s4 and g4 and s4.workers == 8:
        out.append(f"- 4 KiB, N=8: Summa at most 0.5x gloo: {s4.median / g4.median:.2f}x: "
                   f"{verdict(s4.median <= 0.5 * g4.median)}")
    return out + [""]


if __name__ == "__main__":
    sys.exit(main())
