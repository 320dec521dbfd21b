"""Hugging Face's safetensors format for torch modules, with numpy, struct and json only (no
`safetensors` package): the files summa-server writes (its Export call, --export) and reads
(--init_from), and summa-checkpoint export writes.

    summa.save_safetensors(model, "model.safetensors", metadata={"note": "epoch 3"})
    summa.load_safetensors(model, "model.safetensors")

The names are the module's state_dict names, which are the names ParameterServerOptimizer gives
the server at the join (named_parameters()): a file the server exported loads into the module
that trained it, and a file saved here starts a job with summa-server --init_from. The server's
files hold the trained parameters only (no buffers such as BatchNorm's running statistics): load
them into a module with buffers with strict=False.

Layout: 8 bytes little-endian u64 N, N bytes of JSON header (padded with spaces so that the data
starts at a multiple of 8), then each tensor's little-endian row-major bytes, end to end.
"""
import json
import os
import struct

import numpy as np

__all__ = ["save_safetensors", "load_safetensors", "read_safetensors"]

# safetensors dtype -> (numpy dtype as stored, torch dtype name)
_DTYPES = {
    "F64": ("<f8", "float64"), "F32": ("<f4", "float32"), "F16": ("<f2", "float16"),
    "BF16": ("<u2", "bfloat16"), "I64": ("<i8", "int64"), "I32": ("<i4", "int32"),
    "I16": ("<i2", "int16"), "I8": ("i1", "int8"), "U8": ("u1", "uint8"), "BOOL": ("?", "bool"),
}
_FROM_TORCH = {torch_name: code for code, (_, torch_name) in _DTYPES.items()}
_MAX_HEADER = 100_000_000


class SafetensorsError(ValueError):
    """A file that is not safetensors, or not the module's."""


def _tensor_bytes(t):
    import torch
    t = t.detach().to("cpu").contiguous()
    name = str(t.dtype).replace("torch.", "")
    if name not in _FROM_TORCH:
        raise TypeError(f"summa.save_safetensors: {t.dtype} has no safetensors dtype here")
    if t.dtype == torch.bfloat16:
        return "BF16", t.view(torch.int16).numpy().astype("<i2").tobytes()
    return _FROM_TORCH[name], t.numpy().astype(_DTYPES[_FROM_TORCH[name]][0], copy=False).tobytes()


def save_safetensors(module, path, metadata=None):
    """Writes `module`'s state_dict (or a dict of tensors) to `path` as safetensors, in state_dict
    order, each tensor in its own dtype. `metadata`: a dict of strings to strings, written as
    __metadata__ with "format": "pt" unless it says otherwise. The file appears whole or not at
    all (written beside it, fsynced, renamed). Returns the file's size."""
    state = module.state_dict() if hasattr(module, "state_dict") else dict(module)
    meta = {"format": "pt"}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"summa.save_safetensors: metadata maps strings to strings, not {k!r}: {v!r}")
        meta[k] = v
    header = {"__metadata__": meta}
    blobs = []
    offset = 0
    for name, t in state.items():
        if name == "__metadata__":
            raise ValueError("summa.save_safetensors: a tensor may not be named __metadata__")
        dtype, data = _tensor_bytes(t)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dirfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
    return 8 + len(text) + offset


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise SafetensorsError(f"duplicate key {k!r} in the header")
        out[k] = v
    return out


def read_safetensors(path):
    """(tensors, metadata) of a safetensors file, checked as summa-server checks one: tensors is a
    dict name -> numpy array (in the file's order; BF16 widened to float32), metadata a dict of
    strings. Raises SafetensorsError naming what is wrong."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise SafetensorsError(f"{path}: {len(raw)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise SafetensorsError(f"{path}: the header length {n} runs past the end of the file")
    if n > _MAX_HEADER:
        raise SafetensorsError(f"{path}: the header length {n} is past {_MAX_HEADER}")
    text = raw[8:8 + n]
    if not text.startswith(b"{"):
        raise SafetensorsError(f"{path}: the header does not begin with '{{'")
    try:
        header = json.loads(text.decode("utf-8").rstrip(" "), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: the header is not JSON: {e}") from None
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
    data = memoryview(raw)[8 + n:]
    entries = []
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError(f"{path}: tensor {name!r} needs exactly dtype, shape and data_offsets")
        if e["dtype"] not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r} has dtype {e['dtype']!r}")
        shape, (begin, end) = e["shape"], e["data_offsets"]
        if not all(type(d) is int and d >= 0 for d in shape + [begin, end]):
            raise SafetensorsError(f"{path}: tensor {name!r}: shape and offsets are non-negative integers")
        size = np.dtype(_DTYPES[e["dtype"]][0]).itemsize * int(np.prod(shape, dtype=np.int64))
        if end - begin != size:
            raise SafetensorsError(f"{path}: tensor {name!r}: shape {shape} needs {size} bytes, "
                                   f"data_offsets [{begin}, {end}] hold {end - begin}")
        entries.append((begin, end, name, e))
    entries.sort(key=lambda x: (x[0], x[1]))
    covered = 0
    tensors = {}
    for begin, end, name, e in entries:
        if begin != covered:
            raise SafetensorsError(f"{path}: tensor {name!r} starts at {begin}, not at {covered} "
                                   f"({'an overlap' if begin < covered else 'a hole'})")
        covered = end
        a = np.frombuffer(data[begin:end], dtype=_DTYPES[e["dtype"]][0]).reshape(e["shape"])
        if e["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = a
    if covered != len(data):
        raise SafetensorsError(f"{path}: the tensors cover {covered} of the data section's {len(data)} bytes")
    return tensors, metadata


def load_safetensors(module, path, strict=True):
    """Copies a safetensors file's tensors into `module`'s state_dict tensors of the same names
    (converted to each one's dtype, on its device). strict: the file's names must be the
    state_dict's exactly, and every shape equal; otherwise names on one side only are skipped
    (shapes must still agree). Returns (missing, unexpected): the state_dict names the file lacks
    and the file's names the module lacks. The file's __metadata__ is returned by read_safetensors."""
    import torch
    tensors, _ = read_safetensors(path)
    state = module.state_dict()
    missing = [k for k in state if k not in tensors]
    unexpected = [k for k in tensors if k not in state]
    if strict and (missing or unexpected):
        raise SafetensorsError(f"{path} does not match the module: missing {missing}, unexpected {unexpected} "
                               "(strict=False loads the names both have)")
    for name, a in tensors.items():
        if name not in state:
            continue
        target = state[name]
        if tuple(target.shape) != tuple(a.shape):
            raise SafetensorsError(f"{name}: shape {list(a.shape)} in {path}, {list(target.shape)} in the module")
    with torch.no_grad():
        for name, a in tensors.items():
            if name in state:
                state[name].copy_(torch.from_numpy(np.array(a)).to(dtype=state[name].dtype))
    return missing, unexpected
