"""What serving may still choose once an artifact is built (the build fixed the rest)."""
from __future__ import annotations

from dataclasses import dataclass, fields

DEFAULT_CPU_KV_BYTES = 1 << 30


@dataclass(frozen=True)
class RuntimeConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None          # at most the artifact's; None: the artifact's
    enable_prefix_caching: bool = True
    scheduler_delay_factor: float = 0.0
    kv_cache_memory_bytes: int | None = None  # KV pool budget on the CPU (default 1 GiB)
    gpu_memory_utilization: float = 0.9       # share of GPU memory the engine may take
    num_kv_blocks: int | None = None          # exact pool size (overrides both budgets)
    enforce_eager: bool = False               # run the model module eagerly: no compiled code, no graphs
    seed: int = 0                             # for requests without a seed of their own

    def __post_init__(self):
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2, got {self.num_kv_blocks}")

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}
