"""The compiled phases of a model: which batches each package serves."""
from __future__ import annotations

import enum


class Phase(str, enum.Enum):
    MIXED = "mixed"     # any batch: prefill, chunked prefill and decode tokens together
    DECODE = "decode"   # exactly one new token per sequence: what CUDA graphs replay

    def __str__(self) -> str:
        return self.value
