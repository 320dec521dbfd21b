"""Summa's Python client: any PyTorch (or NumPy) training loop uses summa-server as its parameter
server or its allreduce.

    import summa
    summa.init("127.0.0.1:50051", world_size=2)          # rank from $RANK / $JOB_COMPLETION_INDEX
    opt = summa.ParameterServerOptimizer(model.parameters())   # the server's optimizer, or:
    opt = summa.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    opt = summa.DiLoCo(model, torch.optim.AdamW(model.parameters()))  # summa-server --mode=diloco

Errors are SummaError, carrying the server's grpc.StatusCode and message. A model's weights go in
and out as safetensors with summa.save_safetensors(model, path) and summa.load_safetensors(model,
path) (the files summa-server --export and --init_from write and read).
"""
import os

import numpy as np

from .client import ALLREDUCE_CHUNK_BYTES, TLS, Client, Joined, Partition  # noqa: F401
from .errors import SummaError  # noqa: F401
from .safetensors import load_safetensors, read_safetensors, save_safetensors  # noqa: F401

__all__ = ["init", "shutdown", "rank", "world_size", "allreduce", "broadcast_parameters",
           "ParameterServerOptimizer", "DistributedOptimizer", "DiLoCo", "Embedding", "EmbeddingBag",
           "SummaError", "Client", "TLS",
           "save_safetensors", "load_safetensors", "read_safetensors"]

_client = None
_collective_count = {}


def _env_rank():
    for var in ("RANK", "JOB_COMPLETION_INDEX"):
        if os.environ.get(var, "") != "":
            return int(os.environ[var])
    return None


def init(server=None, rank=None, world_size=None, token=None, tls=None, **client_options):
    """Connects this process to summa-server. `server` defaults to $SUMMA_SERVER, then
    127.0.0.1:50051; `rank` to $RANK, then $JOB_COMPLETION_INDEX (torchrun, a Kubernetes indexed
    Job), then 0 for a single process and otherwise -1 (the server assigns one at the join);
    `world_size` to $WORLD_SIZE, then 1; `token` to the token in $SUMMA_TOKEN_FILE (read again when
    the file changes, so a rotated secret needs no restart; Client's token_file=). `tls`: None
    (plaintext), True (system roots), a CA file, or summa.TLS(ca, cert, key) for mutual TLS.
    The join itself happens when a ParameterServerOptimizer is built (it needs the model)."""
    global _client
    if _client is not None:
        raise RuntimeError("summa.init was already called (summa.shutdown() first)")
    server = server or os.environ.get("SUMMA_SERVER", "127.0.0.1:50051")
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if rank is None:
        rank = _env_rank()
    if rank is None:
        rank = 0 if world_size == 1 else -1
    if token is None and os.environ.get("SUMMA_TOKEN_FILE") and "token_file" not in client_options:
        client_options["token_file"] = os.environ["SUMMA_TOKEN_FILE"]
    _client = Client(server, rank=rank, world_size=world_size, token=token, tls=tls, **client_options)
    return _client


def _default_client():
    if _client is None:
        raise RuntimeError("summa.init() has not been called")
    return _client


def shutdown():
    """Leaves the job if this process joined it, and closes the connection."""
    global _client
    if _client is not None:
        try:
            if _client.joined is not None:
                _client.leave()
        finally:
            _client.close()
            _client = None
            _collective_count.clear()


def rank():
    return _default_client().rank


def world_size():
    return _default_client().world_size


def _auto_name(prefix):
    n = _collective_count.get(prefix, 0)
    _collective_count[prefix] = n + 1
    return f"{prefix}.{n}"


def allreduce(tensor, name=None, inplace=False, op="sum", client=None, **group):
    """The elementwise sum over the ranks of `tensor` (a float32 torch tensor on the CPU or a numpy
    array), through summa-server's AllReduce. Returns a new tensor (or array) unless `inplace`.
    `name` names the collective: every rank passes the same one (by default the ranks' n-th unnamed
    call meet). `op` "average" divides by the world size. `group` may pass group_size and rank
    (a fixed group other than the whole world) or members=True, round=R (a member collective)."""
    c = client or _default_client()
    name = name or _auto_name("allreduce")
    torch_in = not isinstance(tensor, np.ndarray)
    if torch_in:
        import torch
        if tensor.device.type != "cpu":
            raise TypeError(f"summa.allreduce: a tensor on {tensor.device}; move it to the CPU")
        if tensor.dtype != torch.float32:
            raise TypeError(f"summa.allreduce: {tensor.dtype}; Summa sums float32")
        src = tensor.detach()
        if not src.is_contiguous():
            src = src.contiguous()
        values = src.numpy()
    else:
        if tensor.dtype != np.float32:
            raise TypeError(f"summa.allreduce: {tensor.dtype}; Summa sums float32")
        values = np.ascontiguousarray(tensor)
    if inplace:
        if values.__array_interface__["data"][0] != (
                tensor.data_ptr() if torch_in else tensor.__array_interface__["data"][0]):
            raise ValueError("summa.allreduce(inplace=True) needs a contiguous tensor")
        out = values
    else:
        out = np.empty_like(values)
    c.allreduce(values, out, name, **group)
    if op == "average":
        out /= c.world_size
    elif op != "sum":
        raise ValueError(f"op must be 'sum' or 'average', not {op!r}")
    if inplace:
        return tensor
    if torch_in:
        import torch
        return torch.from_numpy(out)
    return out


def broadcast_parameters(params, root_rank=0, name="summa.broadcast", client=None):
    """Sets every rank's `params` to root_rank's: a model (its state_dict), a state_dict, or
    tensors / (name, tensor) pairs. Float32 tensors are sent as they are; other dtypes are carried
    as float32 (exact for integers below 2**24); GPU tensors through a host copy. Through AllReduce: the root sends its values,
    the others zeros, all in one flat buffer."""
    import torch
    c = client or _default_client()
    if hasattr(params, "state_dict"):
        params = params.state_dict()
    if isinstance(params, dict):
        tensors = list(params.values())
    else:
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    sizes = [t.numel() for t in tensors]
    flat = torch.zeros(sum(sizes), dtype=torch.float32)
    if c.rank == root_rank:
        torch.cat([t.detach().reshape(-1).to("cpu", torch.float32) for t in tensors], out=flat)
    values = flat.numpy()
    c.allreduce(values, values, name)
    with torch.no_grad():
        offset = 0
        for t, n in zip(tensors, sizes):
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n


def __getattr__(name):
    # The optimizers need torch; the client and allreduce on numpy arrays do not.
    if name in ("ParameterServerOptimizer", "DistributedOptimizer"):
        from . import optim
        return getattr(optim, name)
    if name in ("Embedding", "EmbeddingBag"):
        from . import embedding
        return getattr(embedding, name)
    if name == "DiLoCo":
        from .diloco import DiLoCo
        return DiLoCo
    raise AttributeError(f"module 'summa' has no attribute {name!r}")
