"""Triton kernels for the GPU arches (CUDA sm80+/sm90, ROCm gfx942/gfx950), as `atom_triton::` ops.

Each op is a `torch.library.triton_op` whose body launches its kernels through `wrap_triton`, so
`torch.export` + AOTInductor compile the kernels into the artifact and the runtime never JITs.
Every launch parameter is an int argument of the op (the exported graph carries the tuned
values); each module lists CANDIDATE_CONFIGS for the build to measure. The `triton` attention
backend (atom_aot/ops/backends/triton.py) calls them. See docs/kernels.md.

Importing this package needs `triton`; the CPU path never imports it.
"""
from atom_aot.ops.triton import (all_reduce_norm, fp8_gemm, fused_moe, int4_gemm, int4_small_m,  # noqa: F401
                                mla_decode, moe_routing, paged_attention, rms_norm_quant, rope_cache,
                                sampling_threshold, silu_mul_quant, small_m_gemm)   # each registers atom_triton::*
