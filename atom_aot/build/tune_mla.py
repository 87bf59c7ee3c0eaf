"""Kernel choices for an MLA (DeepSeek) model on a GPU arch: the absorbed decode kernel's config is
measured on the model's own latent shapes (decode at batches 1 to 256 over a long context) and each
batch's fastest goes into the decode row for the batch sizes from it to the next measured one; the
mixed row (prefill, chunked prefill, decodes riding along) is measured by build/tune_mla_mixed.py: the
triton mixed path with its configs, or the reference op where that is faster. build/tune.py calls this."""
from __future__ import annotations

import torch

from atom_aot.artifact.phase import Phase
from atom_aot.artifact.tuning import BackendChoice, PhaseTuning, Tuning, timings_json
from atom_aot.build.config import BuildConfig
from atom_aot.build.measure import best_config, ms_unless_too_big
from atom_aot.build.tune_mla_mixed import tune_mixed
from atom_aot.dtypes import torch_dtype
from atom_aot.models import ModelConfig

DECODE_BATCHES = (1, 8, 32, 128, 256)


def tune_mla(config: BuildConfig, cfg: ModelConfig, max_model_len: int, tune_moe, moe_label: str) -> Tuning:
    """`tune_moe`: build/tune.py's MoE tuning (the experts op's config per token bucket, the same in both rows), described as `moe_label`."""
    import atom_aot.ops.triton  # noqa: F401  (registers the ops)
    from atom_aot.ops.triton.mla_decode import CANDIDATE_CONFIGS
    context = min(max_model_len - 1, 2048)
    measured = {batch: _time_decode(cfg, config, CANDIDATE_CONFIGS, [context] * batch) for batch in DECODE_BATCHES}
    # per batch-size bucket (from each measured batch to the next) the fastest config that launched
    buckets = {f"mla_decode@{batch}": best_config({batch: row}) for batch, row in measured.items()}
    mixed, mixed_ms, mixed_label = tune_mixed(cfg, config, buckets, best_config)
    moe, moe_ms = tune_moe(cfg, config)
    return Tuning(
        arch=config.arch, measured=True,
        phases={Phase.DECODE: PhaseTuning({"mla_attention": BackendChoice("triton", buckets), "moe": moe}),
                Phase.MIXED: PhaseTuning({"mla_attention": mixed, "moe": moe})},
        kernels={"mla_attention": "decode and the MTP step: triton atom_triton::mla_decode (absorbed, split-K, "
                                  f"a config per batch-size bucket); {mixed_label}",
                 "moe": moe_label,
                 "gemm": "aten -> cuBLAS (Inductor extern call)",
                 "norms/activations": "Inductor-generated Triton (fused, compiled into the package)",
                 "sampling": "torch on the GPU"},
        measurements_ms={"context_tokens": context, "moe": timings_json(moe_ms), "mla_decode": timings_json(measured),
                         "mla_mixed": mixed_ms})


def _time_decode(cfg: ModelConfig, config: BuildConfig, candidates, context: list[int]) -> dict:
    from atom_aot.ops.triton.mla_decode import config_table
    from atom_aot.ops.triton.batch_inputs import make_paged_batch
    ds = cfg.deepseek
    b = make_paged_batch([c - 1 for c in context], [1] * len(context), 1, ds.latent_dim,
                         block_size=config.block_size, num_layers=1, dtype=torch_dtype(config.kv_cache_element_dtype), device="cuda")
    kv_cache = b.kv_cache[:, :1]                 # the latent layout [1, 1, num_blocks, block_size, 1, r + rope]
    q = torch.randn(len(context), cfg.num_attention_heads, ds.latent_dim, device="cuda", dtype=config.torch_dtype)
    op, scale = torch.ops.atom_triton.mla_decode, ds.qk_head_dim ** -0.5
    times = {}
    for c in candidates:
        args = c.as_args()
        times[args] = ms_unless_too_big(lambda: op(q, kv_cache, 0, b.block_tables, b.seq_lens, scale,
                                                    ds.kv_lora_rank, config_table(c)), c)
    return times
