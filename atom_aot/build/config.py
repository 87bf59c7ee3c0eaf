"""The build's view of `BuildOptions`: the same fields (so the same flags, checks and defaults),
plus the torch dtypes they mean and the fields that enter the build key."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from atom_aot.artifact.build_options import BuildOptions
from atom_aot.artifact.kv_cache import FP8_KV_CACHE_DTYPE, KVCacheLayout, KVCacheSpec
from atom_aot.dtypes import dtype_name, torch_dtype
from atom_aot.models.parallel import Split


@dataclass(frozen=True)
class BuildConfig(BuildOptions):
    """`arch` is a concrete arch here (the tools resolve "auto" before making one)."""

    @property
    def torch_dtype(self) -> torch.dtype:
        name = self.dtype if self.dtype != "auto" else ("float32" if self.arch == "cpu" else "bfloat16")
        return torch_dtype(name)

    @property
    def split(self) -> Split:
        """How each rank's model is cut from the whole (-tp, --ep, -dp)."""
        return Split(self.tensor_parallel_size, self.enable_expert_parallel, self.data_parallel_size)

    @property
    def kv_cache_element_dtype(self) -> str:
        """What `--kv-cache-dtype` means here, as the KV cache spec names it: fp8 is e4m3fn, auto the model's dtype."""
        if self.kv_cache_dtype == "fp8":
            return FP8_KV_CACHE_DTYPE
        return "bfloat16" if self.kv_cache_dtype == "bf16" else dtype_name(self.torch_dtype)

    def kv_cache_spec(self, layout: KVCacheLayout, scales: str) -> KVCacheSpec:
        """The KV cache this build fixes: one rank's `layout` (the model class's), where fp8 scales come from."""
        return KVCacheSpec(self.kv_cache_element_dtype, layout, scales)

    def key_fields(self) -> dict:
        d = asdict(self)
        d["dtype"] = dtype_name(self.torch_dtype)
        d["kv_cache_dtype"] = self.kv_cache_element_dtype
        d["capture_sizes"] = list(self.requested_capture_sizes)
        if self.data_parallel_size == 1:      # keys of builds from before -dp stay what they were
            del d["data_parallel_size"]
        return d
