"""The build's view of `BuildOptions`: the same fields (so the same flags, checks and defaults),
plus the torch dtypes they mean and the fields that enter the build key."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from atom_aot.artifact.build_options import BuildOptions
from atom_aot.models.parallel import Split


@dataclass(frozen=True)
class BuildConfig(BuildOptions):
    """`arch` is a concrete arch here (the tools resolve "auto" before making one)."""

    @property
    def torch_dtype(self) -> torch.dtype:
        name = self.dtype if self.dtype != "auto" else ("float32" if self.arch == "cpu" else "bfloat16")
        return getattr(torch, name)

    @property
    def split(self) -> Split:
        """How each rank's model is cut from the whole (-tp, --ep, -dp)."""
        return Split(self.tensor_parallel_size, self.enable_expert_parallel, self.data_parallel_size)

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        if self.kv_cache_dtype == "fp8":
            return torch.float8_e4m3fn
        return torch.bfloat16 if self.kv_cache_dtype == "bf16" else self.torch_dtype

    def key_fields(self) -> dict:
        d = asdict(self)
        d["dtype"] = str(self.torch_dtype).removeprefix("torch.")
        d["kv_cache_dtype"] = str(self.kv_torch_dtype).removeprefix("torch.")
        d["capture_sizes"] = list(self.requested_capture_sizes)
        if self.data_parallel_size == 1:      # keys of builds from before -dp stay what they were
            del d["data_parallel_size"]
        return d
