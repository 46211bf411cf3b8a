"""Checkpoint writers for tests, written from the formats' descriptions, not
from ckptd's readers: safetensors (huggingface/safetensors README), and the
TensorFlow v2 bundle (tensorflow/core/util/tensor_bundle and the LevelDB
table format: blocks with prefix-compressed keys and restart points, block
trailers with a masked CRC-32C, a 48-byte footer). CRC-32C comes from the
crc32c package (python3-crc32c), Snappy from python3-snappy."""
import json
import struct

import crc32c as _crc32c

try:
    import snappy
except ImportError:  # the Snappy cases skip without it
    snappy = None

TABLE_MAGIC = 0xDB4775248B80FB57

# tensorflow/core/framework/types.proto
TF_DTYPES = {
    "float32": 1, "float64": 2, "int32": 3, "uint8": 4, "int16": 5, "int8": 6, "string": 7,
    "complex64": 8, "int64": 9, "bool": 10, "qint8": 11, "quint8": 12, "qint32": 13,
    "bfloat16": 14, "qint16": 15, "quint16": 16, "uint16": 17, "complex128": 18, "float16": 19,
    "variant": 21, "uint32": 22, "uint64": 23, "float8_e5m2": 24, "float8_e4m3fn": 25,
}


def crc32c(data, crc=0):
    return _crc32c.crc32c(data, crc) if crc else _crc32c.crc32c(data)


def mask(c):
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# ---- protobuf wire format ----

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_varint(num, v):
    return varint(num << 3) + varint(v & 0xFFFFFFFFFFFFFFFF)


def pb_bytes(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def pb_fixed32(num, v):
    return varint(num << 3 | 5) + struct.pack("<I", v)


# ---- safetensors ----

ST_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "int32": "I32",
    "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16", "float32": "F32",
    "float64": "F64",
}


def safetensors_bytes(tensors, metadata=None, pad_to=8):
    """tensors: list of (name, st_dtype, shape, raw_bytes), written in order.
    Returns the file's bytes."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad_to:
        h += b" " * (-(8 + len(h)) % pad_to)
    return struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors)


def safetensors_from_numpy(arrays, metadata=None):
    """arrays: dict name -> numpy array (little-endian, C order)."""
    items = []
    for name, a in arrays.items():
        a = a.astype(a.dtype.newbyteorder("<"))
        items.append((name, ST_DTYPES[a.dtype.name], a.shape, a.tobytes(order="C")))
    return safetensors_bytes(items, metadata)


# ---- TensorFlow v2 bundle ----

class _Block:
    def __init__(self, restart_interval):
        self.buf = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last = b""
        self.interval = restart_interval
        self.n = 0

    def add(self, key, value):
        shared = 0
        if self.counter < self.interval:
            m = min(len(key), len(self.last))
            while shared < m and key[shared] == self.last[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buf))
            self.counter = 0
        self.buf += varint(shared) + varint(len(key) - shared) + varint(len(value))
        self.buf += key[shared:] + value
        self.last = key
        self.counter += 1
        self.n += 1

    def finish(self):
        tail = b"".join(struct.pack("<I", r) for r in self.restarts)
        return bytes(self.buf) + tail + struct.pack("<I", len(self.restarts))


def _put_block(out, contents, compress):
    kind = 0
    if compress:
        if snappy is None:
            raise RuntimeError("python3-snappy is not installed")
        c = snappy.compress(contents)
        if len(c) < len(contents) - len(contents) // 8:
            contents, kind = c, 1
    off = len(out)
    out += contents + bytes([kind])
    out += struct.pack("<I", mask(crc32c(contents + bytes([kind]))))
    return off, len(contents)


def table_bytes(items, block_size=4096, compress=False, restart_interval=16):
    """A table of sorted (key, value) byte pairs."""
    out = bytearray()
    index = _Block(1)
    block = _Block(restart_interval)
    for k, v in items:
        block.add(k, v)
        if len(block.buf) >= block_size:
            h = _put_block(out, block.finish(), compress)
            index.add(block.last, varint(h[0]) + varint(h[1]))
            block = _Block(restart_interval)
    if block.n:
        h = _put_block(out, block.finish(), compress)
        index.add(block.last, varint(h[0]) + varint(h[1]))
    meta = _put_block(out, _Block(restart_interval).finish(), False)
    idx = _put_block(out, index.finish(), compress)
    footer = varint(meta[0]) + varint(meta[1]) + varint(idx[0]) + varint(idx[1])
    footer += b"\0" * (40 - len(footer))
    out += footer + struct.pack("<Q", TABLE_MAGIC)
    return bytes(out)


def string_tensor_bytes(strings):
    """TF's layout of a string tensor and the CRC-32C its entry stores (unmasked)."""
    lengths = b"".join(varint(len(s)) for s in strings)
    crc = 0
    for s in strings:
        n = len(s)
        crc = crc32c(struct.pack("<I", n) if n <= 0xFFFFFFFF else struct.pack("<Q", n), crc)
    lc = struct.pack("<I", mask(crc))
    crc = crc32c(lc, crc)
    for s in strings:
        crc = crc32c(s, crc)
    return lengths + lc + b"".join(strings), crc


class TfTensor:
    """One tensor to write: dtype name (TF_DTYPES), shape, raw little-endian
    bytes (or strings for dtype 'string')."""

    def __init__(self, name, dtype, shape, raw=None, strings=None):
        self.name, self.dtype, self.shape = name, dtype, list(shape)
        self.raw, self.strings = raw, strings

    @classmethod
    def from_numpy(cls, name, a, dtype=None):
        a = a.astype(a.dtype.newbyteorder("<"))
        return cls(name, dtype or a.dtype.name, a.shape, raw=a.tobytes(order="C"))


def write_tf_bundle(prefix, tensors, num_shards=1, compress=False, block_size=4096,
                    big_endian_header=False):
    """Writes PREFIX.index and PREFIX.data-*-of-*; tensor i goes to shard
    i % num_shards. Returns {name: (shard, offset, size, crc)}."""
    shards = [bytearray() for _ in range(num_shards)]
    entries, where = [], {}
    for i, t in enumerate(tensors):
        sh = i % num_shards
        if t.dtype == "string":
            data, crc = string_tensor_bytes(t.strings)
        else:
            data, crc = t.raw, crc32c(t.raw)
        off = len(shards[sh])
        shards[sh] += data
        shape = b"".join(pb_bytes(2, pb_varint(1, d)) for d in t.shape)
        e = pb_varint(1, TF_DTYPES[t.dtype]) + pb_bytes(2, shape)
        if sh:
            e += pb_varint(3, sh)
        if off:
            e += pb_varint(4, off)
        if data:
            e += pb_varint(5, len(data))
        e += pb_fixed32(6, mask(crc))
        entries.append((t.name.encode(), e))
        where[t.name] = (sh, off, len(data), crc)
    header = pb_varint(1, num_shards) + (pb_varint(2, 1) if big_endian_header else b"")
    header += pb_bytes(3, pb_varint(1, 1))
    items = [(b"", header)] + sorted(entries)
    with open(prefix + ".index", "wb") as f:
        f.write(table_bytes(items, block_size=block_size, compress=compress))
    for i, d in enumerate(shards):
        with open(f"{prefix}.data-{i:05d}-of-{num_shards:05d}", "wb") as f:
            f.write(d)
    return where
