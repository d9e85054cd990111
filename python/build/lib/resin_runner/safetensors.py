"""Reads safetensors files with numpy alone: an 8-byte little-endian header length, a JSON
header naming each tensor's dtype, shape and byte range, then the data."""

from __future__ import annotations

import glob
import json
import os
import struct

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def load_file(path: str) -> dict[str, np.ndarray]:
    """Every tensor of one file, as float32 for float dtypes (BF16 included)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, not a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header of {n} bytes in a file of {len(raw)}")
    header = json.loads(raw[8 : 8 + n])
    data = memoryview(raw)[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        shape = t["shape"]
        if not 0 <= a <= b <= len(data):
            raise ValueError(f"{path}: tensor {name} at bytes [{a}, {b}) of {len(data)}")
        buf = data[a:b]
        dt = t["dtype"]
        if dt == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt in _DTYPES:
            arr = np.frombuffer(buf, dtype=np.dtype(_DTYPES[dt]).newbyteorder("<"))
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name} has dtype {dt}, which this reader does not handle")
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name} holds {arr.size} values for shape {shape}")
        out[name] = arr.reshape(shape)
    return out


def load_dir(d: str) -> dict[str, np.ndarray]:
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{d} holds no *.safetensors")
    out = {}
    for f in files:
        out.update(load_file(f))
    return out
