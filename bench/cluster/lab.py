#!/usr/bin/python3
"""An emulated cluster on this machine: N worker hosts and K server hosts, each a network namespace
with one link (a veth pair) to a switch (a bridge in a namespace of its own), each link shaped by
tc's tbf at --rate on both ends, so that a host has a full-duplex link of that rate, as BytePS's
model (OSDI 2020) assumes. Needs root.

  sudo bench/cluster/lab.py --workers=4 --servers=2 --rate=1gbit             # up; Ctrl-C tears down
  sudo bench/cluster/lab.py --workers=2 --servers=1 --rate=200mbit --measure -- COMMAND [ARGS...]
  sudo bench/cluster/lab.py --clean                                           # leftovers of killed labs

Hosts: worker i is namespace LAB-wI at 198.18.0.(1+I), server j is LAB-sJ at 198.18.0.(129+J),
in 198.18.0.0/24 (198.18.0.0/15 is reserved for benchmarking, RFC 2544); LAB is slab<PID of the
lab's process>. Each host has `lo` and `eth0` and one route, its /24: no route out, and the
switch's namespace has no address at all, so nothing in the lab reaches this machine's own network
namespace and nothing there changes but the list of namespaces. A COMMAND runs in this machine's
namespace with LAB_WORKERS and LAB_SERVERS set (space-separated NAMESPACE=ADDRESS pairs): run a
program on host w0 with `ip netns exec slab<PID>-w0 PROGRAM`. Without a COMMAND the lab waits
for Ctrl-C or SIGTERM.

Everything is removed on every way out that a process can see (the command's end, Ctrl-C,
SIGTERM, SIGHUP, a failure while bringing it up): the processes it started are stopped by PID,
then every namespace is deleted, which deletes the links and the bridge in them. Only SIGKILL
leaves them: `--clean` then deletes the namespaces of labs whose process is gone.

--delay and --loss need the kernel's netem qdisc (sch_netem); where it is missing the lab says so
and refuses them (tbf alone needs none). Used as a library by bench/cluster/cluster_bench.py and
tests/cluster_process_test.py: `with Lab(workers=2, servers=1, rate="200mbit") as lab: ...`.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

SUBNET = "198.18.0"  # /24; RFC 2544's benchmarking range is 198.18.0.0/15
PREFIX = "slab"
SWITCH_READER = r"""
import json, os, sys
for line in sys.stdin:
    stats = {}
    for dev in os.listdir('/sys/class/net'):
        d = '/sys/class/net/%s/statistics/' % dev
        with open(d + 'rx_bytes') as rx, open(d + 'tx_bytes') as tx:
            stats[dev] = [int(rx.read()), int(tx.read())]
    print(json.dumps(stats), flush=True)
"""


class LabError(Exception):
    """A lab that cannot be made here, with the reason a person can act on."""


def rate_bits(rate):
    """tc's rate syntax (1gbit, 200mbit, 500kbit, 1000000bit; bps units are bytes) in bits/s."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)?", rate.strip().lower())
    if not m:
        raise LabError(f"--rate={rate}: not a tc rate (examples: 1gbit, 200mbit, 500kbit)")
    scale = {None: 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
             "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}[m.group(2)]
    bits = float(m.group(1)) * scale
    if bits < 1e5:
        raise LabError(f"--rate={rate}: below 100 kbit/s, too slow for a lab")
    return bits


def need_root():
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, veth links and tc): run it as root")


def run(*argv, check=True):
    """Runs a command; a failure raises LabError with its stderr."""
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p


def netns_list():
    p = run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def has_netem():
    """Whether the kernel has netem: tried on `lo` of a scratch namespace (this kernel's config may
    not be readable; the qdisc's refusal is the answer)."""
    ns = f"{PREFIX}{os.getpid()}-probe"
    run("ip", "netns", "add", ns)
    try:
        return run("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                   check=False).returncode == 0
    finally:
        run("ip", "netns", "del", ns, check=False)


NETEM_MISSING = ("this kernel has no netem qdisc (sch_netem; CONFIG_NET_SCH_NETEM is not set), so the lab "
                 "cannot add delay or loss: links are shaped by rate alone (tbf)")


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def clean_stale():
    """Deletes the namespaces of labs whose process is gone (one killed by SIGKILL); returns them."""
    removed = []
    for ns in netns_list():
        m = re.fullmatch(PREFIX + r"(\d+)-\w+", ns)
        if m and not alive(int(m.group(1))):
            run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    return removed


class Host:
    def __init__(self, lab, role, index):
        self.role, self.index = role, index
        self.name = f"{role}{index}"
        self.ns = f"{lab.tag}-{self.name}"
        self.ip = f"{SUBNET}.{(1 if role == 'w' else 129) + index}"
        self.port = self.name  # its link's end in the switch namespace

    def argv(self, argv):
        """`argv` run on this host (in its namespace)."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def __repr__(self):
        return f"{self.ns}={self.ip}"


class Lab:
    """N worker hosts and K server hosts on one switch. Not thread-safe. Owns the namespaces it
    made and the processes started through start(): both are gone after down(), which __exit__
    calls on every path."""

    def __init__(self, workers, servers, rate=None, delay=None, loss=None, mtu=1500, log=None):
        if workers < 1 or servers < 0 or workers > 126 or servers > 126:
            raise LabError(f"a lab holds 1-126 worker hosts and 0-126 server hosts, not {workers} and {servers}")
        self.rate, self.delay, self.loss, self.mtu = rate, delay, loss, mtu
        self.rate_bits = rate_bits(rate) if rate else None
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.workers = [Host(self, "w", i) for i in range(workers)]
        self.servers = [Host(self, "s", j) for j in range(servers)]
        self.made = []  # namespaces, in the order made
        self.procs = []
        self.reader = None
        self.log = log or (lambda msg: None)

    @property
    def hosts(self):
        return self.workers + self.servers

    def __enter__(self):
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc):
        self.down()
        return False

    def up(self):
        need_root()
        if (self.delay or self.loss) and not has_netem():
            raise LabError(f"--delay/--loss: {NETEM_MISSING}")
        taken = [ns for ns in netns_list() if ns.startswith(self.tag + "-")]
        if taken:
            raise LabError(f"namespaces of this process's lab exist already: {' '.join(taken)}")
        started = time.monotonic()
        self._netns(self.switch)
        run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        # A bridge in a namespace of its own: no iptables on its frames (br_netfilter's default
        # is on, and conntrack would cost CPU the hosts need).
        for key in ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables"):
            run("ip", "netns", "exec", self.switch, "sysctl", "-qw", f"net.bridge.{key}=0", check=False)
        run("ip", "-n", self.switch, "link", "set", "lo", "up")
        run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for h in self.hosts:
            self._netns(h.ns)
            run("ip", "link", "add", "eth0", "netns", h.ns, "mtu", str(self.mtu), "type", "veth",
                "peer", "name", h.port, "netns", self.switch, "mtu", str(self.mtu))
            run("ip", "-n", self.switch, "link", "set", h.port, "master", "br0")
            run("ip", "-n", self.switch, "link", "set", h.port, "up")
            run("ip", "-n", h.ns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
            run("ip", "-n", h.ns, "link", "set", "lo", "up")
            run("ip", "-n", h.ns, "link", "set", "eth0", "up")
            # Up: what the host sends, shaped on its end; down: what it receives, on the switch's.
            self._shape(h.ns, "eth0")
            self._shape(self.switch, h.port)
        self.reader = subprocess.Popen(["ip", "netns", "exec", self.switch, sys.executable, "-c", SWITCH_READER],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._wait_reachable()
        self.log(f"lab {self.tag}: {len(self.workers)} worker hosts, {len(self.servers)} server hosts, "
                 f"links {self.describe_link()}, up in {time.monotonic() - started:.1f} s")

    def describe_link(self):
        parts = [f"{self.rate} each way (tbf on both ends)" if self.rate else "unshaped"]
        if self.delay:
            parts.append(f"+{self.delay} on what a host sends")
        if self.loss:
            parts.append(f"{self.loss} loss on what a host sends")
        return ", ".join(parts)

    def _netns(self, ns):
        run("ip", "netns", "add", ns)
        self.made.append(ns)

    def _shape(self, ns, dev):
        if not self.rate:
            if self.delay or self.loss:
                self._netem(ns, dev, "root")
            return
        bytes_per_s = self.rate_bits / 8
        # The bucket holds a 64 KiB GSO packet (veth keeps TSO) or a millisecond at rate,
        # whichever is more; the queue holds 50 ms at rate.
        burst = max(96 * 1024, int(bytes_per_s / 1000))
        run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", self.rate,
            "burst", str(burst), "latency", "50ms")
        if self.delay or self.loss:
            self._netem(ns, dev, "parent", "1:1")

    def _netem(self, ns, dev, *where):
        if ns == self.switch:
            return  # delay and loss on what a host sends only: once per crossing
        args = []
        if self.delay:
            args += ["delay", self.delay]
        if self.loss:
            args += ["loss", self.loss]
        run("tc", "-n", ns, "qdisc", "add", "dev", dev, *where, "netem", *args)

    def _wait_reachable(self, seconds=10):
        """Every host answers w0 (a TCP connect to a closed port is refused: the frames went both
        ways through the bridge, which forwards once its ports are up)."""
        if len(self.hosts) > 1:
            ips = ",".join(h.ip for h in self.hosts[1:])
            p = run(*self.workers[0].argv([sys.executable, os.path.abspath(__file__), "--reach", ips,
                                           f"--seconds={seconds}"]), check=False)
            if p.returncode != 0:
                raise LabError(f"hosts do not answer from w0 within {seconds} s: {p.stdout.strip()} {p.stderr.strip()}")

    def start(self, host, argv, log_path=None, env=None, stdout=None):
        """Starts `argv` on `host` (None: this machine's namespace) and tracks it by PID: stopped
        by down() if still running. `ip netns exec` execs the program, so the PID is its own."""
        full = host.argv(argv) if host else list(argv)
        out = open(log_path, "wb") if log_path else stdout
        try:
            proc = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT if log_path else None,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        finally:
            if log_path:
                out.close()
        proc.log_path = log_path
        self.procs.append(proc)
        return proc

    def stop(self, procs=None, grace=5.0):
        """SIGTERM to each process still running (by PID), SIGKILL after `grace` seconds; waits for all."""
        procs = list(self.procs if procs is None else procs)
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = [p for p in self.procs if p not in procs]

    def link_bytes(self):
        """{host name: (bytes up, bytes down)} so far, from the switch's ends of the links
        (/sys/class/net/PORT/statistics: a port receives what its host sends)."""
        self.reader.stdin.write("\n")
        self.reader.stdin.flush()
        stats = json.loads(self.reader.stdout.readline())
        return {h.name: (stats[h.port][0], stats[h.port][1]) for h in self.hosts}

    def host_link_bytes(self, host):
        """(tx, rx) of the host's own eth0, read in its namespace's /sys (a cross-check of link_bytes)."""
        p = run(*host.argv(["cat", "/sys/class/net/eth0/statistics/tx_bytes",
                            "/sys/class/net/eth0/statistics/rx_bytes"]))
        tx, rx = (int(x) for x in p.stdout.split())
        return tx, rx

    def down(self):
        """Stops every process started here, by PID, then deletes every namespace made (its links
        and the bridge with it). Safe to call more than once and after a partial up()."""
        try:
            self.stop()
        finally:
            if self.reader is not None:
                try:
                    self.reader.stdin.close()
                except OSError:
                    pass
                self.reader.stdout.close()
                try:
                    self.reader.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self.reader.kill()
                    self.reader.wait()
                self.reader = None
            for ns in reversed(self.made):
                run("ip", "netns", "del", ns, check=False)
            left = [ns for ns in self.made if ns in netns_list()]
            self.made = []
            if left:
                raise LabError(f"could not delete namespaces {' '.join(left)}")


def measure_rate(lab, src, dst, seconds=2.0, port=5201):
    """Goodput of one TCP stream from host src to host dst, in bits/s: a sink on dst, a source on
    src sending for `seconds` (the first quarter not counted: slow start)."""
    here = os.path.abspath(__file__)
    sink = lab.start(dst, [sys.executable, here, "--tcp_sink", f"{dst.ip}:{port}"], stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            probe = run(*src.argv([sys.executable, here, "--tcp_probe", f"{dst.ip}:{port}"]), check=False)
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline or sink.poll() is not None:
                raise LabError(f"the TCP sink on {dst.name} did not listen: {probe.stderr.strip()}")
            time.sleep(0.05)
        out = run(*src.argv([sys.executable, here, "--tcp_source", f"{dst.ip}:{port}", f"--seconds={seconds}"]))
        return float(out.stdout.split()[0])
    finally:
        lab.stop([sink])


def reach(ips, seconds):
    """Exits 0 once every address in `ips` (comma-separated) answers a TCP connect (refused counts)."""
    deadline = time.monotonic() + seconds
    for ip in ips.split(","):
        while True:
            try:
                socket.create_connection((ip, 9), timeout=0.5).close()
                break
            except ConnectionRefusedError:
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    print(f"{ip}: {e}")
                    sys.exit(1)
                time.sleep(0.05)


def tcp_sink(address):
    host, port = address.rsplit(":", 1)
    srv = socket.create_server((host, int(port)))
    while True:
        conn, _ = srv.accept()
        with conn:
            buf = bytearray(1 << 20)
            while conn.recv_into(buf):
                pass


def tcp_probe(address):
    host, port = address.rsplit(":", 1)
    socket.create_connection((host, int(port)), timeout=1).close()


def tcp_source(address, seconds):
    host, port = address.rsplit(":", 1)
    chunk = b"\0" * (1 << 20)
    with socket.create_connection((host, int(port))) as s:
        start = time.monotonic()
        skip = start + seconds / 4
        sent_at_skip = None
        sent = 0
        while True:
            now = time.monotonic()
            if sent_at_skip is None and now >= skip:
                sent_at_skip, skip_time = sent, now
            if now - start >= seconds:
                break
            s.sendall(chunk)
            sent += len(chunk)
        # What was sent and is still queued would inflate the figure: close waits for none of it,
        # so ask the kernel for the unsent bytes (SIOCOUTQ) and take them off.
        import fcntl
        import struct
        queued = struct.unpack("i", fcntl.ioctl(s.fileno(), 0x5411, b"\0" * 4))[0]
        end = time.monotonic()
    print(f"{(sent - sent_at_skip - queued) * 8 / (end - skip_time):.0f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="worker hosts (namespaces LAB-w0...), 1-126 (default 2)")
    ap.add_argument("--servers", type=int, default=1, help="server hosts (LAB-s0...), 0-126 (default 1)")
    ap.add_argument("--rate", help="each host link's rate, each way, in tc's syntax (1gbit, 200mbit); "
                                   "unset: links are not shaped")
    ap.add_argument("--delay", help="netem delay added to what each host sends (e.g. 1ms); needs netem")
    ap.add_argument("--loss", help="netem loss on what each host sends (e.g. 0.1%%); needs netem")
    ap.add_argument("--mtu", type=int, default=1500, help="the links' MTU (default 1500)")
    ap.add_argument("--measure", action="store_true",
                    help="once up, measure one TCP stream's goodput from w0 to the next host and print it")
    ap.add_argument("--clean", action="store_true",
                    help="delete the namespaces of labs whose process is gone (killed by SIGKILL), then exit")
    ap.add_argument("--tcp_sink", metavar="IP:PORT", help=argparse.SUPPRESS)
    ap.add_argument("--tcp_probe", metavar="IP:PORT", help=argparse.SUPPRESS)
    ap.add_argument("--tcp_source", metavar="IP:PORT", help=argparse.SUPPRESS)
    ap.add_argument("--reach", metavar="IPS", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=2.0, help=argparse.SUPPRESS)
    ap.add_argument("command", nargs=argparse.REMAINDER,
                    help="after --: a command to run once the lab is up (in this machine's namespace, "
                         "with LAB_WORKERS and LAB_SERVERS set); the lab is torn down when it ends, and "
                         "its exit status is the lab's")
    args = ap.parse_args()
    if args.reach:
        return reach(args.reach, args.seconds)
    if args.tcp_sink:
        return tcp_sink(args.tcp_sink)
    if args.tcp_probe:
        return tcp_probe(args.tcp_probe)
    if args.tcp_source:
        return tcp_source(args.tcp_source, args.seconds)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        need_root()
        if args.clean:
            removed = clean_stale()
            print(f"lab: removed {len(removed)} namespaces of labs that are gone" +
                  (f": {' '.join(removed)}" if removed else ""))
            return 0
        if (args.delay or args.loss) and not has_netem():
            raise LabError(f"--delay/--loss: {NETEM_MISSING}")
    except LabError as e:
        print(f"lab: {e}", file=sys.stderr)
        return 2

    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    try:
        with Lab(args.workers, args.servers, rate=args.rate, delay=args.delay, loss=args.loss, mtu=args.mtu,
                 log=lambda m: print(m, flush=True)) as lab:
            for h in lab.hosts:
                print(f"  {h.name}: namespace {h.ns}, {h.ip}/24 on eth0")
            if args.measure and len(lab.hosts) > 1:
                bits = measure_rate(lab, lab.hosts[0], lab.hosts[1])
                print(f"measured: one TCP stream {lab.hosts[0].name} -> {lab.hosts[1].name}: {bits / 1e6:.1f} Mbit/s")
            if command:
                env = {"LAB_WORKERS": " ".join(map(repr, lab.workers)), "LAB_SERVERS": " ".join(map(repr, lab.servers))}
                proc = lab.start(None, command, env=env)
                return proc.wait()
            print("lab: up; Ctrl-C or SIGTERM tears it down", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("lab: interrupted, torn down", file=sys.stderr)
        return 130
    except LabError as e:
        print(f"lab: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
