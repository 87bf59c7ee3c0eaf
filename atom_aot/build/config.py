"""What a build decides. Every field is part of the build key."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from atom_aot.arch import ARCHES, DEFAULT_CAPTURE_SIZES

QUANT_MODES = ("none", "fp8")
KV_CACHE_DTYPES = ("auto", "bf16", "fp8")
DTYPES = ("auto", "float32", "bfloat16", "float16")
COMPILE_MODES = ("aoti", "none")


@dataclass(frozen=True)
class BuildConfig:
    arch: str = "cpu"                       # a concrete arch (resolve "auto" before making this)
    dtype: str = "auto"                     # activations and unquantized weights
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    quant: str = "none"                     # weight quantization of the linear layers
    kv_cache_dtype: str = "auto"            # auto: the model dtype
    capture_sizes: tuple[int, ...] | None = None  # CUDA-graph batch sizes; None: the arch's default
    max_model_len: int | None = None        # None: the model's max_position_embeddings
    block_size: int = 16                    # tokens per KV-cache block
    compile: str = "aoti"                   # "none": weights only, the runtime runs the module eagerly

    def __post_init__(self):
        _check(self.arch in ARCHES, f"--arch must be one of {', '.join(ARCHES)} (or auto), got {self.arch!r}")
        _check(self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        _check(self.quant in QUANT_MODES, f"--quant must be one of {', '.join(QUANT_MODES)}, got {self.quant!r}")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES,
               f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        _check(self.compile in COMPILE_MODES, f"compile must be one of {', '.join(COMPILE_MODES)}")
        _check(self.tensor_parallel_size >= 1, "-tp must be >= 1")
        _check(self.block_size >= 1 and self.block_size & (self.block_size - 1) == 0,
               f"--block-size must be a power of two, got {self.block_size}")
        _check(self.max_model_len is None or self.max_model_len >= 16, "--max-model-len must be >= 16")
        if self.capture_sizes is not None:
            sizes = tuple(self.capture_sizes)
            _check(all(s >= 1 for s in sizes) and list(sizes) == sorted(set(sizes)),
                   f"--capture-sizes must be increasing positive integers, got {','.join(map(str, sizes))}")

    @property
    def torch_dtype(self) -> torch.dtype:
        name = self.dtype if self.dtype != "auto" else ("float32" if self.arch == "cpu" else "bfloat16")
        return getattr(torch, name)

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        if self.kv_cache_dtype == "fp8":
            return torch.float8_e4m3fn
        return torch.bfloat16 if self.kv_cache_dtype == "bf16" else self.torch_dtype

    @property
    def requested_capture_sizes(self) -> tuple[int, ...]:
        return tuple(self.capture_sizes) if self.capture_sizes is not None else DEFAULT_CAPTURE_SIZES

    @property
    def graph_capture_sizes(self) -> tuple[int, ...]:
        """The sizes graphs are captured at: none on the CPU, which has no graphs."""
        return () if self.arch == "cpu" else self.requested_capture_sizes

    def key_fields(self) -> dict:
        d = asdict(self)
        d["dtype"] = str(self.torch_dtype).removeprefix("torch.")
        d["kv_cache_dtype"] = str(self.kv_torch_dtype).removeprefix("torch.")
        d["capture_sizes"] = list(self.requested_capture_sizes)
        return d


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
