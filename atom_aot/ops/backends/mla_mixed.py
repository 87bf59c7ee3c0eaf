"""The mixed phase of MLA on GPU kernels (prefill, chunked prefill, prompts with decodes riding along): the
step's flat tensors in, no host reads, so the mixed package can be captured like the decode one.

    rope (torch), the latent-cache write kernel (atom_triton::mla_cache_write), then per query run, on the device:
    - runs of at most `absorbed_runs` tokens (a decoding sequence's one token at least): the absorbed decode kernel,
      one row per token (row j of sequence b over its first L - n_q + j + 1 latents): `absorbed_decode`;
    - longer runs: the naive form, k_nope / v up-projected for every token of the step by two GEMMs, then
      atom_triton::mla_prefill: their cached prefixes up-projected into a fixed-capacity workspace, the chunk kernel
      over those keys and causal over the run's own, the absorbed prefix kernel over what the workspace could not
      hold, merged into it; it also copies the absorbed runs' rows into place (ops/triton/mla_prefill.py).

Params of the row (the build measures them: build/tune_mla_mixed.py): `mla_chunk` and `mla_prefix` (each
MLATileConfig's ints), `mla_prefix_workspace` (PrefixWorkspace: capacity in tokens, then the up-projection's
tile), `absorbed_runs` ([max tokens]) and the decode kernel's `mla_decode@<first row count>` buckets (chosen by
the absorbed rows' count, B * absorbed_runs). A row without `mla_prefix_workspace` (built before it) runs with
no workspace: every cached prefix in the absorbed prefix kernel, as that build measured it; the start logs so.
"""
from __future__ import annotations

import logging

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.attention import from_cache, to_cache
from atom_aot.ops.backends.base import launch_configs
from atom_aot.ops.backends.mla import MLAArgs, TritonMLA, absorbed_decode, decode_table, roped

log = logging.getLogger("atom_aot")
WORKSPACE = "mla_prefix_workspace"


class TritonMixedMLA:
    def __init__(self, choice: BackendChoice):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton.mla_prefill import AbsorbedRuns, MLATileConfig
        from atom_aot.ops.triton.mla_workspace import ABSORBED_PREFIXES, PrefixWorkspace
        self.table = decode_table(choice)
        own = BackendChoice(choice.backend, {k: v for k, v in choice.params.items() if not k.startswith("mla_decode")})
        expected = {"mla_chunk": MLATileConfig, "mla_prefix": MLATileConfig, "absorbed_runs": AbsorbedRuns}
        configs = launch_configs(own, {**expected, **({WORKSPACE: PrefixWorkspace} if WORKSPACE in own.params else {})})
        self.chunk, self.prefix = list(configs["mla_chunk"].as_args()), list(configs["mla_prefix"].as_args())
        self.workspace = list(configs.get(WORKSPACE, ABSORBED_PREFIXES).as_args())
        if WORKSPACE not in own.params:
            log.info("mla_attention: the mixed row has no %s (built before it): cached prefixes take the absorbed "
                     "prefix kernel, no workspace", WORKSPACE)
        self.absorbed_max = configs["absorbed_runs"].max_tokens
        if self.absorbed_max < 1:
            raise ValueError(f"absorbed_runs must be >= 1 (a decoding token is absorbed), got {self.absorbed_max}")

    def __call__(self, args: MLAArgs) -> torch.Tensor:
        q_pe, k_pe = roped(args)
        step = args.inputs
        torch.ops.atom_triton.mla_cache_write(args.c_kv, k_pe, step.kv_cache, args.layer, step.slot_mapping,
                                              args.kv_scale)
        c_kv = as_cached(args.c_kv, step.kv_cache.dtype, args.kv_scale, 0)                      # [T, r]
        k_pe = as_cached(k_pe, step.kv_cache.dtype, args.kv_scale, 1)                            # [T, rope]
        heads, nope = args.w_uk.shape[:2]
        k_nope = (c_kv @ args.w_uk.flatten(0, 1).T).unflatten(-1, (heads, nope))                # [T, H, nope]
        v = torch.einsum("tr,hrv->thv", c_kv, args.w_uv)                                         # [T, H, v]
        absorbed = self.absorbed_rows(args, q_pe)                                                 # [B * n, H, v]
        return torch.ops.atom_triton.mla_prefill(
            args.q_nope, q_pe, k_nope, v, k_pe, absorbed, step.kv_cache, args.layer, step.block_tables,
            step.seq_lens, step.query_start_loc, args.w_uk, args.w_uv, args.scale, self.absorbed_max, self.chunk,
            self.prefix, self.workspace, args.kv_scale)

    def absorbed_rows(self, args: MLAArgs, q_pe: torch.Tensor) -> torch.Tensor:
        """The outputs of every run of at most n = absorbed_max tokens, row b * n + j for token j of sequence b
        ([B * n, H, v]; rows of other runs, and past a run's tokens, attend over nothing and are zeros)."""
        step, n = args.inputs, self.absorbed_max
        starts = step.query_start_loc[:-1]                                                        # [B]
        counts = step.query_start_loc[1:] - starts
        token = torch.arange(n, device=starts.device)
        taken = (counts[:, None] <= n) & (token[None, :] < counts[:, None])                      # [B, n]
        rows = (starts[:, None] + token[None, :]).clamp(max=args.q_nope.shape[0] - 1).flatten()
        context = step.seq_lens[:, None] - counts[:, None] + token[None, :] + 1                  # causal, per token
        lens = torch.where(taken, context, 0).flatten().to(step.seq_lens.dtype)
        # row b * n + j reads sequence b's table: gathered, as repeat_interleave's export (torch 2.11) guards the
        # table width with min(W, n * W) == W, which a dynamic W cannot be shown to satisfy
        tables = step.block_tables.index_select(0, torch.arange(n * starts.shape[0], device=starts.device) // n)
        return absorbed_decode(args, args.q_nope[rows], q_pe[rows], tables, lens, self.table)


def as_cached(x: torch.Tensor, cache_dtype: torch.dtype, kv_scale: torch.Tensor | None, part: int) -> torch.Tensor:
    """x as the latent cache gives it back (an fp8 cache rounds it through e4m3 and its scale `kv_scale[part]`):
    the chunk's keys then carry the numerics its cached prefix has."""
    scale = None if kv_scale is None else kv_scale[part]
    return from_cache(to_cache(x, cache_dtype, scale), x.dtype, scale)


def triton_mla(choice: BackendChoice):
    """The `triton` MLA backend of a row: the mixed path where its params configure the mixed kernels, else
    the decode phase's (ops/backends/mla.py)."""
    if "mla_chunk" in choice.params:
        return TritonMixedMLA(choice)
    return TritonMLA(choice)
