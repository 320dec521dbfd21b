"""The data path's encoding, as client/ps_client.cc does it in C++: a message is its small header
(serialized by protobuf) followed by the tensor's raw bytes, written straight from the caller's
buffer, so that a push costs one copy (buffer -> request bytes) and a reply none before the one
into the caller's tensor (np.frombuffer on the reply's bytes, then one copy into the weights).
Protobuf's own Python parser would copy a reply's `data` into a new bytes object first."""
import numpy as np


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_header(field, length):
    """The key and length of a length-delimited field."""
    return _varint(field << 3 | 2) + _varint(length)


def as_bytes_view(array):
    """A byte view of a C-contiguous little-endian float32 numpy array (no copy)."""
    if array.dtype != np.float32 or not array.flags.c_contiguous:
        raise TypeError(f"expected C-contiguous float32 values, got {array.dtype}")
    return memoryview(array).cast("B")


def with_data(header, field, data):
    """`header` (a serialized message) with the bytes field `field` appended holding `data` (a
    memoryview): one copy of the data, into the returned bytes."""
    return b"".join((header, field_header(field, data.nbytes), data))


def _read_varint(buf, pos):
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed varint in a reply")


def _fields(buf, start, end):
    """(field, wire type, key start, value start, end) for each field in buf[start:end]."""
    pos = start
    while pos < end:
        key_start = pos
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        value = pos
        if wire == 0:
            _, pos = _read_varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            n, pos = _read_varint(buf, pos)
            value = pos
            pos += n
        else:
            raise ValueError(f"unsupported wire type {wire} in a reply")
        if pos > end:
            raise ValueError("truncated reply")
        yield field, wire, key_start, value, pos


def split_data(raw, field):
    """Splits the serialized message `raw` at its bytes field `field`: returns (header, data), the
    other fields serialized again (small) and a memoryview of the data inside `raw` (no copy;
    empty when absent)."""
    buf = memoryview(raw)
    header = []
    data = buf[0:0]
    for f, wire, key_start, value, end in _fields(buf, 0, len(buf)):
        if f == field and wire == 2:
            data = buf[value:end]
        else:
            header.append(buf[key_start:end])
    return b"".join(header), data


def find_data(raw, path):
    """A memoryview of the bytes field at `path` (field numbers, outermost first) inside the
    serialized message `raw` (no copy), or None when absent."""
    buf = memoryview(raw)
    start, end = 0, len(buf)
    for depth, field in enumerate(path):
        for f, wire, _, value, stop in _fields(buf, start, end):
            if f == field and wire == 2:
                start, end = value, stop
                break
        else:
            return None
    return buf[start:end]


def floats(data, count, what):
    """`data` (a memoryview of a reply) as `count` float32 values, without a copy."""
    if data.nbytes != count * 4:
        raise ValueError(f"{what}: expected {count} float32 values ({count * 4} bytes), "
                         f"got {data.nbytes} bytes")
    return np.frombuffer(data, dtype="<f4", count=count)
