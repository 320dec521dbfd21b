"""Client: one process's connection to summa-server.

Backed by the C++ client (summa._native, client/ps_client.h through pybind11) wherever the
extension was built: the socket data plane with gRPC as the fallback, tokens and TLS, shards,
the job's wire format, leases renewed on a C++ thread, buffers crossing without a copy and the
GIL released while it waits, and the overlapped step (begin/ready/wait/finish). Where the
extension could not be built (no pybind11-dev), or with native=False, the same calls go
through grpcio (the data path raw, summa/_wire.py: one copy per direction in Python; no
overlap, no shards). status() is a control call and always goes through grpcio.
Thread-safe only for the heartbeat thread it runs itself; one training thread calls the rest.
"""
import collections
import importlib
import logging
import threading
import time

import grpc
import numpy as np

from . import _wire
from .errors import SummaError, from_native, from_rpc, refused_for_join_rate
from .v1 import summa_pb2 as pb
from .v1 import summa_pb2_grpc as pb_grpc

log = logging.getLogger("summa")

try:
    # Not `from . import _native`: where the extension is missing, that error reads as a circular import.
    _native = importlib.import_module(f"{__package__}._native")
    NATIVE_IMPORT_ERROR = None
except ImportError as e:  # built without pybind11: the grpcio client
    _native = None
    NATIVE_IMPORT_ERROR = e

_SERVICE = "/summa.v1.ParameterServer/"
# Tensors over this go to AllReduce in chunks, each a collective named "<name>/<k>of<n>",
# as ParameterClient::AllReduceInto cuts them (kAllReduceChunkBytes).
ALLREDUCE_CHUNK_BYTES = 4 << 20
_INITIALIZE_WINDOW = 8
# How often a token file is read again (common/rpc/tokens.h's kTokenRefreshSeconds).
TOKEN_REFRESH_SECONDS = 5

# What Join returned, as the trainer needs it.
Joined = collections.namedtuple(
    "Joined", "rank world_size mode version next_step partitions live_ranks lease_seconds staleness sync_every",
    defaults=(0,))
Partition = collections.namedtuple("Partition", "id offset length")
TLS = collections.namedtuple("TLS", "ca cert key", defaults=(None, None, None))


def _read(path):
    with open(path, "rb") as f:
        return f.read()


class _TokenFile:
    """A token file read again once TOKEN_REFRESH_SECONDS have passed since the last read (the
    C++ client's ClientToken does the same), so that a rotated secret goes out from then on; a
    read that fails keeps the token read last. Thread-safe (the heartbeat thread reads it too)."""

    def __init__(self, path):
        self.path = path
        self._lock = threading.Lock()
        self._token = self._read()  # the first read's error is the caller's
        self._next = time.monotonic() + TOKEN_REFRESH_SECONDS

    def _read(self):
        with open(self.path) as f:
            words = f.read().split()
        if len(words) != 1:
            raise ValueError(f"token file {self.path}: {'empty' if not words else 'more than one word'}; "
                             "a client's token file holds its token alone")
        return words[0]

    def current(self):
        with self._lock:
            if time.monotonic() >= self._next:
                self._next = time.monotonic() + TOKEN_REFRESH_SECONDS
                try:
                    token = self._read()
                except (OSError, ValueError) as e:
                    log.warning("%s; calls carry the token read before", e)
                else:
                    if token != self._token:
                        log.info("token file %s changed: calls carry its new token from now on", self.path)
                        self._token = token
            return self._token


def _credentials(tls):
    """grpc channel credentials for `tls`: True (system roots), a CA file path, or TLS(ca, cert,
    key) with a client certificate for mutual TLS."""
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, str):
        tls = TLS(ca=tls)
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca) if tls.ca else None,
        private_key=_read(tls.key) if tls.key else None,
        certificate_chain=_read(tls.cert) if tls.cert else None)


class Client:
    """`server` is host:port. `token` is sent as "authorization: Bearer <token>" on every call
    (`token_file`, in its place: the file's token, read again when it changes);
    `tls` is None (plaintext), True, a CA path or TLS(ca, cert, key). `call_timeout` bounds each
    call (a push-pull waits for the slowest worker: keep it past the server's --barrier_deadline),
    `join_timeout` the join with its retries, `retry_timeout` the rejoins through a lost server,
    counted from the last good step."""

    def __init__(self, server, rank=-1, world_size=1, token=None, tls=None, call_timeout=660.0,
                 join_timeout=120.0, retry_timeout=300.0, data_plane="auto", channels=1, native=None,
                 token_file=None):
        """`data_plane`: "auto" (the shared-memory plane for a server on this host, else the socket
        plane, where the server offers them), "grpc", "socket" or "shm" (summa-worker --data_plane;
        the shared-memory plane needs the C++ client); `channels`: TCP connections per shard for gRPC. `native`:
        None uses the C++ client where it was built, True requires it, False takes grpcio."""
        self.server = server
        self.rank = rank
        self.world_size = world_size
        self.call_timeout = call_timeout
        self.join_timeout = join_timeout
        self.retry_timeout = retry_timeout
        self.session = 0
        self.joined = None
        if native is None:
            native = _native is not None and tls is not True
        if native and _native is None:
            raise ImportError(f"summa: the C++ client (summa._native) is not built: {NATIVE_IMPORT_ERROR}")
        if native and tls is True:
            raise ValueError("summa: the C++ client needs the CA file to trust (tls=ca_path); tls=True "
                             "(the system roots) is the grpcio client's (native=False)")
        self.native = None
        if native:
            files = TLS(ca=tls) if isinstance(tls, str) else (tls or TLS())
            try:
                self.native = _native.Client(server, float(call_timeout), float(join_timeout), token or "",
                                             files.ca or "", files.cert or "", files.key or "",
                                             data_plane, int(channels), token_file or "")
            except _native.NativeError as e:
                raise from_native(e, "client") from None
        self._token_file = _TokenFile(token_file) if token_file else None
        self._token = token
        # The server enforces its own --max_message_bytes; this side takes what it is sent.
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        if tls:
            self._channel = grpc.secure_channel(server.split(",")[0], _credentials(tls), options)
        else:
            self._channel = grpc.insecure_channel(server.split(",")[0], options)
        self._stub = pb_grpc.ParameterServerStub(self._channel)
        raw = lambda m: self._channel.unary_unary(_SERVICE + m)  # bytes in, bytes out
        self._push_pull = raw("PushPull")
        self._pull = raw("Pull")
        self._initialize = raw("Initialize")
        self._allreduce = raw("AllReduce")
        self._sparse_pull = raw("SparsePull")
        self._sparse_push = raw("SparsePush")
        self._tables = []
        self._specs = None
        self._heartbeat_stop = None
        self._heartbeat_thread = None
        self.heartbeat_error = None  # the last failed heartbeat (a fenced session, say)

    @property
    def _metadata(self):
        token = self._token_file.current() if self._token_file else self._token
        return (("authorization", f"Bearer {token}"),) if token else ()

    # --- control calls -------------------------------------------------------------------------

    def _call(self, method, request, what, timeout=None):
        try:
            return method(request, timeout=timeout or self.call_timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc(e, what) from None

    def status(self):
        """The server's summa.v1.ServerStatus."""
        return self._call(self._stub.GetStatus, pb.GetStatusRequest(), "GetStatus", 10)

    def join(self, specs, initial=None, takes_local_steps=False, tables=()):
        """Joins as self.rank with the model `specs` ([(name, shape)], float32, in the flat order).
        `initial` (a float32 array of every value, or None) is sent partition by partition when
        the server asks for it (the first joiner of a model). `takes_local_steps`: the caller
        takes a DiLoCo job's local steps and pushes pseudo-gradients (summa.DiLoCo); a DiLoCo
        server refuses a joiner without it. `tables`: the job's embedding tables
        (summa.v1.EmbeddingTableSpec, summa.Embedding's), addressed by their index in
        sparse_pull and sparse_push. Returns Joined."""
        self._tables = list(tables)
        if self.native is not None:
            return self._join_native(specs, initial, takes_local_steps)
        request = pb.JoinRequest(rank=self.rank, world_size=self.world_size,
                                 values_follow=initial is not None, takes_local_steps=takes_local_steps,
                                 tables=self._tables)
        total = 0
        for name, shape in specs:
            request.params.add(name=name, dtype=pb.DTYPE_FLOAT32, shape=list(shape))
            total += int(np.prod(shape, dtype=np.int64))
        give_up = time.monotonic() + self.join_timeout
        backoff = 0.05
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._stub.Join(request, metadata=self._metadata,
                                           timeout=max(0.1, min(10.0, give_up - time.monotonic())))
                break
            except grpc.RpcError as e:
                # Not up yet, the model's values still coming, or over --join_rate: try again;
                # any other refusal (a model over its limit, a different model) stands.
                retry = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or (
                    e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and refused_for_join_rate(e))
                if not retry or time.monotonic() + backoff >= give_up:
                    raise from_rpc(e, f"join {self.server} as rank {self.rank} failed after "
                                      f"{attempt} attempts") from None
                if attempt == 1 or attempt % 20 == 0:
                    log.info("waiting for the server at %s: %s", self.server, e.details())
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
        if response.shards > 1:
            raise SummaError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"the server at {self.server} is shard {response.shard} of {response.shards}; "
                             "this client talks to one unsharded summa-server (summa-worker --server "
                             "takes every shard's address)", "join")
        partitions = []
        expected = 0
        for p in response.partitions:
            if p.offset != expected or p.length <= 0:
                raise SummaError(grpc.StatusCode.INTERNAL,
                                 f"the server's partition {p.id} at offset {p.offset} does not tile the model",
                                 "join")
            expected += p.length
            partitions.append(Partition(p.id, p.offset, p.length))
        if expected != total:
            raise SummaError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"the server's partitions cover {expected} parameters; this model has {total}",
                             "join")
        self.rank = response.rank
        self.session = response.session
        self._specs = specs
        self.joined = Joined(response.rank, response.world_size, response.mode, response.version,
                             response.next_step, partitions, list(response.live_ranks),
                             response.lease_seconds, response.staleness, response.sync_every)
        if response.initialize:
            if initial is None:
                raise SummaError(grpc.StatusCode.FAILED_PRECONDITION,
                                 "the server asks for initial values and this rank has none", "join")
            self._send_initial_values(initial)
        self._start_heartbeat(response.lease_seconds)
        return self.joined

    def _join_native(self, specs, initial, takes_local_steps):
        try:
            self.native.set_tables([t.SerializeToString() for t in self._tables])
            j = self.native.join(self.rank, self.world_size, [(n, list(s)) for n, s in specs],
                                 None if initial is None else np.ascontiguousarray(initial, np.float32),
                                 takes_local_steps)
        except _native.NativeError as e:
            raise from_native(e, f"join {self.server} as rank {self.rank}") from None
        self.rank = j["rank"]
        self._specs = specs
        self.joined = Joined(j["rank"], self.world_size, j["mode"], j["version"], j["next_step"],
                             [Partition(*p) for p in j["partitions"]], list(j["live_ranks"]),
                             j["lease_seconds"], j["staleness"], j["sync_every"])
        return self.joined

    def _native_call(self, what, fn, *args):
        try:
            return fn(*args)
        except _native.NativeError as e:
            raise from_native(e, what) from None

    def _send_initial_values(self, initial):
        parts = self.joined.partitions
        for first in range(0, len(parts), _INITIALIZE_WINDOW):
            calls = []
            for p in parts[first:first + _INITIALIZE_WINDOW]:
                header = pb.InitializeRequest(rank=self.rank, session=self.session, partition=p.id,
                                              dtype=pb.DTYPE_FLOAT32).SerializeToString()
                data = _wire.as_bytes_view(initial[p.offset:p.offset + p.length])
                calls.append((p, self._initialize.future(_wire.with_data(header, 4, data),
                                                         timeout=self.call_timeout,
                                                         metadata=self._metadata)))
            for p, call in calls:
                try:
                    call.result()
                except grpc.RpcError as e:
                    raise from_rpc(e, f"initial values of partition {p.id}") from None

    def _start_heartbeat(self, lease_seconds):
        self._stop_heartbeat()
        if lease_seconds <= 0:
            return
        stop = threading.Event()
        request = pb.HeartbeatRequest(rank=self.rank, session=self.session)

        def beat():
            while not stop.wait(lease_seconds / 3):
                try:
                    self._stub.Heartbeat(request, timeout=5, metadata=self._metadata)
                    self.heartbeat_error = None
                except grpc.RpcError as e:
                    self.heartbeat_error = from_rpc(e, f"heartbeat of rank {request.rank}")

        self._heartbeat_stop = stop
        self._heartbeat_thread = threading.Thread(target=beat, name="summa-heartbeat", daemon=True)
        self._heartbeat_thread.start()

    def _stop_heartbeat(self):
        if self._heartbeat_thread is not None:
            self._heartbeat_stop.set()
            self._heartbeat_thread.join()
            self._heartbeat_thread = None

    def leave(self):
        """Leaves the group for good (the others go on without this rank)."""
        self._stop_heartbeat()
        if self.joined is not None and self.native is not None:
            self._native_call("Leave", self.native.leave, self.rank)
            self.joined = None
        if self.joined is not None:
            self._call(self._stub.Leave, pb.LeaveRequest(rank=self.rank, session=self.session), "Leave", 10)
            self.joined = None

    def close(self):
        self._stop_heartbeat()
        if self.native is not None:
            self.native.close()
        self._channel.close()

    # --- the data path -------------------------------------------------------------------------

    def _each_partition(self, method, encode, what):
        """Starts method(encode(p)) for every partition at once and returns the raw replies."""
        calls = [(p, method.future(encode(p), timeout=self.call_timeout, metadata=self._metadata))
                 for p in self.joined.partitions]
        replies, error = [], None
        for p, call in calls:
            try:
                replies.append(call.result())
            except grpc.RpcError as e:
                error = error or from_rpc(e, f"{what} of partition {p.id}")
        if error is not None:
            raise error
        return replies

    def sparse_pull(self, table, min_version, ids, rows):
        """Fills `rows` (len(ids) x dim float32) with the rows of `ids` (uint64, duplicates allowed)
        of embedding table `table` at a version >= min_version (waiting for it); returns the
        version. Thread-safe against the dense calls (the C++ client's own connections)."""
        self._require_join("sparse_pull")
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        if self.native is not None:
            return self._native_call(f"pull of table {table}", self.native.sparse_pull, int(table),
                                     int(min_version), ids, rows)
        request = pb.SparsePullRequest(rank=self.rank, session=self.session, table=int(table),
                                       min_version=int(min_version), ids=ids.tobytes())
        reply = pb.SparsePullResponse.FromString(
            self._call(self._sparse_pull, request.SerializeToString(), f"pull of table {table}"))
        values = np.frombuffer(reply.rows, dtype=np.float32)
        if values.size != rows.size:
            raise SummaError(grpc.StatusCode.INTERNAL, f"table {table}: {values.size} values came for "
                             f"{rows.size}", "sparse_pull")
        rows.reshape(-1)[:] = values
        return reply.version

    def sparse_push(self, table, step, num_examples, ids, grads):
        """Pushes row gradients (`grads`: len(ids) x dim float32, summed over `num_examples`
        examples) of embedding table `table` for `step`; True when they completed its step."""
        self._require_join("sparse_push")
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        grads = np.ascontiguousarray(grads, dtype=np.float32)
        if self.native is not None:
            return self._native_call(f"push of table {table}", self.native.sparse_push, int(table), int(step),
                                     int(num_examples), ids, grads)
        request = pb.SparsePushRequest(rank=self.rank, session=self.session, table=int(table), step=int(step),
                                       num_examples=int(num_examples), count=len(ids),
                                       data=ids.tobytes() + grads.tobytes())
        try:
            reply = pb.SparsePushResponse.FromString(
                self._call(self._sparse_push, request.SerializeToString(), f"push of table {table}"))
        except SummaError as e:
            if e.code == grpc.StatusCode.ALREADY_EXISTS:  # a retry of a push that was counted
                return False
            raise
        return reply.completed_step

    def _decode_pulls(self, replies, weights, check_version=None):
        """Copies each PullResponse's values into `weights` (one copy); returns the headers."""
        headers = []
        for p, raw in zip(self.joined.partitions, replies):
            header, data = _wire.split_data(raw, 4)
            h = pb.PullResponse.FromString(header)
            if check_version is not None and h.version != check_version and h.late:
                # A late push (summa-server --backup_workers): the weights are a later step's, and
                # this API's caller counts its own steps.
                raise SummaError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"the push of step {check_version - 1} came after its step completed "
                                 f"(summa-server --backup_workers) and was dropped; partition {p.id} is "
                                 f"at version {h.version}, which this client does not skip to: join again",
                                 reason="LATE_PUSH")
            if check_version is not None and h.version != check_version:
                raise SummaError(grpc.StatusCode.INTERNAL,
                                 f"asked for version {check_version} of partition {p.id}, got {h.version}")
            weights[p.offset:p.offset + p.length] = _wire.floats(data, p.length, f"partition {p.id}")
            headers.append(h)
        return headers

    def pull(self, min_version, weights):
        """Every partition at version >= min_version into `weights` (float32, the whole model).
        Returns the lowest version pulled."""
        self._require_join("pull")
        if self.native is not None:
            return self._native_call("pull", self.native.pull, min_version, weights)
        headers = self._decode_pulls(self._each_partition(
            self._pull, lambda p: pb.PullRequest(rank=self.rank, session=self.session, partition=p.id,
                                                 min_version=min_version).SerializeToString(),
            "pull"), weights)
        return min(h.version for h in headers)

    def push_pull(self, step, num_examples, gradients, weights):
        """Pushes `gradients` (float32, the whole model, summed over `num_examples` examples) for
        `step` and writes the weights the server answers with into `weights`; in sync mode those
        are version step + 1. Returns the live ranks the server reports."""
        self._require_join("push_pull")
        if self.native is not None:
            return self._native_call(f"push-pull of step {step}", self.native.push_pull, step,
                                     int(num_examples), gradients, weights)

        def encode(p):
            header = pb.PushRequest(rank=self.rank, session=self.session, step=step, partition=p.id,
                                    num_examples=num_examples, dtype=pb.DTYPE_FLOAT32).SerializeToString()
            return _wire.with_data(header, 6, _wire.as_bytes_view(gradients[p.offset:p.offset + p.length]))

        replies = self._each_partition(self._push_pull, encode, f"push-pull of step {step}")
        sync = self.joined.mode == pb.MODE_SYNC
        headers = self._decode_pulls(replies, weights, step + 1 if sync else None)
        return list(headers[0].live_ranks) if headers else []

    def allreduce(self, values, out, name, group_size=None, rank=None, members=False, round=0):
        """The elementwise sum over the group of `values` (float32, C-contiguous) into `out` (same
        size; may be `values`). A fixed group by default (name, group_size = world size, rank); with
        `members`, a member collective of the joined job for `round`. Over 4 MiB, the tensor
        travels as chunks "<name>/<k>of<n>", all in flight at once."""
        values = values.reshape(-1)
        out_flat = out.reshape(-1)
        if out_flat.size != values.size:
            raise ValueError(f"allreduce of {values.size} values into {out_flat.size}")
        if members:
            self._require_join("a member allreduce")
        group_size = self.world_size if group_size is None else group_size
        rank = self.rank if rank is None else rank
        if rank < 0:
            raise SummaError(grpc.StatusCode.FAILED_PRECONDITION,
                             "allreduce needs this process's rank: pass rank= to summa.init, set "
                             "$RANK, or join first", f"allreduce '{name}'")
        if self.native is not None:
            return self._native_call(f"allreduce '{name}'", self.native.allreduce, values, out_flat,
                                     name, int(group_size), int(rank), bool(members), int(round))
        total = values.size
        chunk = ALLREDUCE_CHUNK_BYTES // 4
        n = max(1, -(-total // chunk))
        names = [name] if n == 1 else [f"{name}/{k}of{n}" for k in range(n)]
        calls = []
        for k, chunk_name in enumerate(names):
            begin, end = k * chunk, min(total, (k + 1) * chunk)
            tensor = pb.Tensor(name=chunk_name, dtype=pb.DTYPE_FLOAT32, shape=[end - begin]).SerializeToString()
            data = _wire.as_bytes_view(values[begin:end])
            outer = pb.AllReduceRequest(name=chunk_name, group_size=group_size, rank=rank,
                                        members=members, round=round,
                                        session=self.session if members else 0).SerializeToString()
            tensor_prefix = tensor + _wire.field_header(4, data.nbytes)
            request = b"".join((outer, _wire.field_header(4, len(tensor_prefix) + data.nbytes),
                                tensor_prefix, data))
            calls.append((chunk_name, begin, end,
                          self._allreduce.future(request, timeout=self.call_timeout, metadata=self._metadata)))
        replies, error = [], None
        for chunk_name, begin, end, call in calls:
            try:
                replies.append((chunk_name, begin, end, call.result()))
            except grpc.RpcError as e:
                error = error or from_rpc(e, f"allreduce '{chunk_name}'")
        if error is not None:
            raise error
        # `out` may be `values`: written only once every call has completed.
        for chunk_name, begin, end, raw in replies:
            data = _wire.find_data(raw, (1, 4))
            if data is None:
                raise SummaError(grpc.StatusCode.DATA_LOSS, "came back without values",
                                 f"allreduce '{chunk_name}'")
            out_flat[begin:end] = _wire.floats(data, end - begin, f"allreduce '{chunk_name}'")

    # --- the overlapped step (the C++ client only) ----------------------------------------------

    @property
    def overlaps(self):
        """Whether begin/ready/wait/finish are there (the C++ client)."""
        return self.native is not None

    @property
    def on_socket_plane(self):
        return self.native is not None and self.native.on_socket_plane

    def shared_floats(self, floats):
        """On the shared-memory plane, `floats` zeroed float32 values (a numpy array) in a segment
        the server maps read-only: gradients pushed from them are not copied. None on any other
        plane, or without the native client. Once per client."""
        if self.native is None:
            return None
        self._require_join("shared_floats")
        return self._native_call("shared floats", self.native.shared_floats, int(floats))

    @property
    def on_shm_plane(self):
        """Whether the data path goes over the shared-memory plane (a server on this host with
        summa-server --shm_socket; the C++ client only)."""
        return self.native is not None and self.native.on_shm_plane

    def begin(self, step, num_examples, gradients, weights):
        """Starts `step`'s exchange, partition by partition as ready() names them; `gradients` and
        `weights` (the flat float32 buffers) are held until finish()."""
        self._require_join("begin")
        self._native_call(f"begin step {step}", self.native.begin, step, int(num_examples), gradients, weights)

    def ready(self, partition):
        """Partition `partition`'s gradients are final: its push-pull starts now."""
        self.native.ready(partition)

    def ready_all(self):
        self.native.ready_all()

    def wait(self, partition):
        """Until partition `partition`'s new weights are in `weights` (SummaError if the step failed)."""
        self._native_call(f"partition {partition}", self.native.wait, partition)

    def finish(self):
        """Ends the step (every call ended); its live ranks."""
        return self._native_call("the overlapped step", self.native.finish)

    def live_ranks_of(self, partition):
        """The group partition `partition`'s reply named (the next step's), once wait() returned."""
        return list(self.native.live_ranks_of(partition))

    @property
    def step_active(self):
        return self.native is not None and self.native.active

    def timeline(self):
        """Per partition of the last overlapped step: (ready_ns, start_ns, end_ns), time.monotonic_ns()
        clock, -1 where it did not happen."""
        return self.native.timeline() if self.native is not None else []

    def _require_join(self, what):
        if self.joined is None:
            raise SummaError(grpc.StatusCode.FAILED_PRECONDITION, f"{what} before join")
