"""The KV cache as the build fixed it: one typed spec, resolved once at build (`--kv-cache-dtype`, the model
class's layout, where an fp8 cache's scales come from), stored in the manifest and read once at load. The
runtime sizes, allocates and fills the cache from this spec alone; kernels read the cache tensor itself.

Every layout has the forward signature's six named dimensions (atom_aot/artifact/signature.py):

    dense (per-head k and v):       [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
    latent (MLA: c_kv | k_pe):      [num_layers, 1, num_blocks, block_size, 1, kv_lora_rank + rope_dim]

so the runtime passes the cache without knowing which one it holds. Torch-free, like the rest of artifact/.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from atom_aot.artifact.fields import Reader

# torch dtype name -> bytes per element: what a KV cache may hold
KV_CACHE_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}
FP8_KV_CACHE_DTYPE = "float8_e4m3fn"
KV_SCALE_ORIGINS = ("none", "checkpoint", "calibrated")    # where an fp8 cache's per-layer k/v scales come from


@dataclass(frozen=True)
class KVCacheLayout:
    """One rank's cache shape, as the model class decides it (its `kv_cache_layout`)."""
    num_layers: int        # cache layers: the decoder's, plus any MTP layers that attend
    parts: int             # 2: separate k and v; 1: one latent vector per token
    heads: int
    dim: int

    def shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (self.num_layers, self.parts, num_blocks, block_size, self.heads, self.dim)

    def elements_per_token(self) -> int:
        """Cache elements one token takes over all layers."""
        return self.num_layers * self.parts * self.heads * self.dim

    @classmethod
    def from_reader(cls, r: Reader) -> KVCacheLayout:
        return cls(*(r.int(name, minimum=1) for name in ("num_layers", "parts", "heads", "dim")))


@dataclass(frozen=True)
class KVCacheSpec:
    dtype: str                           # the elements' torch dtype name (KV_CACHE_ELEMENT_BYTES)
    layout: KVCacheLayout | None         # one rank's shape; None only in a manifest of format 2 (the loader derives it)
    scales: str = "none"                 # an fp8 cache's k/v scales: from the checkpoint or calibrated at build

    def __post_init__(self):
        if self.dtype not in KV_CACHE_ELEMENT_BYTES:
            raise ValueError(f"a KV cache of {self.dtype!r} is not supported; supported: "
                             f"{', '.join(KV_CACHE_ELEMENT_BYTES)}")
        if self.scales not in KV_SCALE_ORIGINS:
            raise ValueError(f"KV scales {self.scales!r}: expected one of {', '.join(KV_SCALE_ORIGINS)}")
        if self.quantized != (self.scales != "none"):
            raise ValueError(f"a {self.dtype} KV cache {'needs' if self.quantized else 'has no'} k/v scales, "
                             f"but the spec says {self.scales!r}")

    @property
    def quantized(self) -> bool:
        """Whether the cache holds fp8 values, dequantized by per-layer k/v scales."""
        return self.dtype == FP8_KV_CACHE_DTYPE

    @property
    def element_size(self) -> int:
        return KV_CACHE_ELEMENT_BYTES[self.dtype]

    def bytes_per_block(self, block_size: int) -> int:
        return self.resolved.layout.elements_per_token() * block_size * self.element_size

    def shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return self.resolved.layout.shape(num_blocks, block_size)

    @property
    def resolved(self) -> KVCacheSpec:
        if self.layout is None:
            raise ValueError("this KV cache spec has no layout yet (a migrated manifest's: the loader derives it)")
        return self

    def with_layout(self, layout: KVCacheLayout) -> KVCacheSpec:
        """This spec with `layout` (the model's, at load), which must be the recorded one if there is one."""
        if self.layout is not None and self.layout != layout:
            raise ValueError(f"the artifact records a KV cache of {self.layout}, but this atom-aot's model makes "
                             f"{layout}")
        return KVCacheSpec(self.dtype, layout, self.scales)

    def describe(self) -> str:
        """How `inspect` and the start log name it."""
        scales = {"checkpoint": "per-layer k/v scales from the checkpoint",
                  "calibrated": "per-layer k/v scales calibrated at build"}
        return self.dtype + (f", {scales[self.scales]}" if self.quantized else "")

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "layout": asdict(self.layout) if self.layout else None, "scales": self.scales}

    @classmethod
    def from_reader(cls, r: Reader) -> KVCacheSpec:
        layout = KVCacheLayout.from_reader(r.obj("layout")) if r.raw("layout", None) is not None else None
        try:
            return cls(r.str("dtype", choices=tuple(KV_CACHE_ELEMENT_BYTES)), layout,
                       r.str("scales", choices=KV_SCALE_ORIGINS))
        except ValueError as e:
            raise r.error("scales", str(e)) from None
