"""The compiled phases of a model: which batches each package serves (and, for `mtp`, which forward:
the one documented in atom_aot/models/deepseek_mtp.py, not the model's; `sample` is no model forward at all
but the sampler's mask thresholds, ops/sampling.py)."""
from __future__ import annotations

import enum


class Phase(str, enum.Enum):
    MIXED = "mixed"     # any batch: prefill, chunked prefill and decode tokens together
    DECODE = "decode"   # exactly one new token per sequence: what CUDA graphs replay
    MTP = "mtp"         # the MTP layer's proposer step (DeepSeek): (step inputs, previous hidden) -> logits, hidden
    SAMPLE = "sample"   # the sampler's thresholds on GPUs: (logits, top_k, top_p, min_p) -> [N] (no weights)

    def __str__(self) -> str:
        return self.value
