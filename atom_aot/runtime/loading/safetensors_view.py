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


def _raw_header(buffer: memoryview) -> tuple[dict, int]:
    """(the JSON header, metadata included; offset of the data section)."""
    (header_len,) = struct.unpack("<Q", buffer[:8])
    return json.loads(bytes(buffer[8:8 + header_len])), 8 + header_len


def _header(buffer: memoryview) -> tuple[dict, int]:
    """(header without metadata, offset of the data section)."""
    header, base = _raw_header(buffer)
    header.pop("__metadata__", None)
    return header, base


def metadata_of(buffer: memoryview) -> dict[str, str]:
    """The file's `__metadata__` (string to string; empty when it has none)."""
    metadata = _raw_header(buffer)[0].get("__metadata__") or {}
    return {str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {}


def _entries(header: dict):
    """(name, begin, end, dtype, shape) per tensor, offsets relative to the data section."""
    for name, info in header.items():
        begin, end = info["data_offsets"]
        yield name, begin, end, DTYPES[info["dtype"]], info["shape"]


def tensors_from_buffer(buffer: memoryview) -> dict[str, torch.Tensor]:
    header, base = _header(buffer)
    out = {}
    for name, begin, end, dtype, shape in _entries(header):
        if end == begin:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(buffer, dtype=torch.uint8, count=end - begin, offset=base + begin)
        out[name] = flat.view(dtype).view(shape)
    return out


ALIGN = 256                # bytes between device tensors' starts: what CUDA's allocator gives a tensor
STAGING_BYTES = 64 << 20   # small tensors go up together through one staging buffer of this size


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def tensors_on_device(buffer: memoryview, device: torch.device) -> dict[str, torch.Tensor]:
    """The same tensors in device memory: views of one device buffer, each starting ALIGN-aligned.

    The file's own offsets cannot be kept: safetensors packs tensors back to back, so a small tensor (an
    FP8 layer's [2] float32 KV scales, a tensor-parallel rank's int64 scalar) leaves every tensor after it
    8 bytes off a 16-byte boundary. cuBLASLt's FP8 GEMM refuses such pointers (CUBLAS_STATUS_NOT_SUPPORTED,
    seen on an H100) and Triton kernels compiled at build assume 16-byte-aligned arguments. So each tensor
    gets an aligned place in one device buffer. The copies stay large: a tensor of STAGING_BYTES or more is
    one host-to-device copy of its own; runs of smaller ones go up as one copy into a staging buffer and
    are placed from there on the device (a copy per small tensor from pageable memory took 1.0 s for
    Qwen3-0.6B's 1.1 GB on an H100, against one copy near the link's speed).
    """
    header, base = _header(buffer)
    entries = sorted(_entries(header), key=lambda e: e[1])
    places, total = {}, 0
    for name, begin, end, _, _ in entries:
        places[name] = total
        total += _round_up(end - begin, ALIGN)
    on_device = torch.empty(total, dtype=torch.uint8, device=device)

    def host(begin: int, end: int) -> torch.Tensor:
        return torch.frombuffer(buffer, dtype=torch.uint8, count=end - begin, offset=base + begin)

    for run in _runs(entries):
        first, last = run[0][1], run[-1][2]
        if len(run) == 1:
            place = places[run[0][0]]
            on_device[place:place + last - first].copy_(host(first, last))
            continue
        staged = host(first, last).to(device)                                  # one copy for the run
        for name, begin, end, _, _ in run:
            on_device[places[name]:places[name] + end - begin].copy_(staged[begin - first:end - first])
    return {name: on_device[places[name]:places[name] + end - begin].view(dtype).view(shape)
            for name, begin, end, dtype, shape in entries}


def _runs(entries: list) -> list[list]:
    """Consecutive non-empty entries grouped so that a group is one tensor of STAGING_BYTES or more, or
    smaller tensors adding up to at most STAGING_BYTES."""
    runs, current, size = [], [], 0
    for entry in entries:
        length = entry[2] - entry[1]
        if length == 0:
            continue
        if length >= STAGING_BYTES:
            runs.append([entry])
            continue
        if size + length > STAGING_BYTES and current:
            runs.append(current)
            current, size = [], 0
        current.append(entry)
        size += length
    return runs + ([current] if current else [])
