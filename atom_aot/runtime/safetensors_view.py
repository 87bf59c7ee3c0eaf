"""Zero-copy tensors over a safetensors byte range inside a larger mapped file.

The `safetensors` package opens whole files only; an artifact's weights may sit inside a
`.atom` archive. The format is a little-endian u64 header length, a JSON header of
{name: {dtype, shape, data_offsets}}, then the data; this reads it over a memoryview.
"""
from __future__ import annotations

import json
import struct

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


def tensors_from_buffer(buffer: memoryview) -> dict[str, torch.Tensor]:
    (header_len,) = struct.unpack("<Q", buffer[:8])
    header = json.loads(bytes(buffer[8:8 + header_len]))
    header.pop("__metadata__", None)
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        shape = info["shape"]
        if end == begin:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(buffer, dtype=torch.uint8, count=end - begin, offset=base + begin)
        out[name] = flat.view(dtype).view(shape)
    return out
