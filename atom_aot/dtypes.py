"""Torch dtypes and the names the artifact stores them by ("bfloat16", "float8_e4m3fn"): one spelling each way."""
from __future__ import annotations

import torch


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
