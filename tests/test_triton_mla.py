"""atom_triton::mla_decode (the absorbed MLA decode over paged latent blocks, split-K) against the
torch reference (atom_aot/ops/mla.py), on fresh random inputs; in Triton's interpreter without a GPU."""
import json

import pytest
import torch

from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.models.mla import split_kv_b_proj
from atom_aot.ops.mla import gather_latent, mla_decode_absorbed, write_latent_cache
from atom_aot.ops.triton.batch_inputs import make_paged_batch
from atom_aot.ops.triton.mla_decode import CANDIDATE_CONFIGS, MLADecodeConfig, config_table, mla_cache_write, mla_decode

RANK, ROPE, NOPE, V = 32, 16, 16, 24


def run_case(context_lens, num_heads, config: MLADecodeConfig | list[int], seed=0, layer=1):
    """Returns (kernel's output, reference) of one decode step: each sequence's last token over its cache."""
    g = torch.Generator().manual_seed(seed)
    batch = make_paged_batch([c - 1 for c in context_lens], [1] * len(context_lens), 1, RANK + ROPE,
                             block_size=16, generator=g)
    kv_cache = batch.kv_cache[:, :1]        # [L, 1, num_blocks, 16, 1, r + rope]: the latent layout
    w_uk, w_uv = split_kv_b_proj(torch.randn(num_heads * (NOPE + V), RANK, generator=g) * 0.3, num_heads, NOPE)
    q_nope = torch.randn(len(context_lens), num_heads, NOPE, generator=g)
    q_pe = torch.randn(len(context_lens), num_heads, ROPE, generator=g)
    q = torch.cat([torch.einsum("thn,hnr->thr", q_nope, w_uk), q_pe], dim=-1)
    scale = (NOPE + ROPE) ** -0.5
    o_lat = mla_decode(q.to(DEVICE), kv_cache.to(DEVICE), layer, batch.block_tables.to(DEVICE),
                       batch.seq_lens.to(DEVICE), scale, RANK,
                       config_table(config) if isinstance(config, MLADecodeConfig) else config).cpu()
    got = torch.einsum("thr,hrv->thv", o_lat, w_uv)
    ref = torch.cat([mla_decode_absorbed(q_nope[b:b + 1], q_pe[b:b + 1],
                                         gather_latent(kv_cache[layer], batch.block_tables[b], n), w_uk, w_uv, scale)
                     for b, n in enumerate(context_lens)])
    return got, ref


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("seed,context_lens,num_heads", [(0, [1, 17, 40], 4), (1, [70, 5], 20)])
def test_matches_reference(seed, context_lens, num_heads, splits):
    """Fixed split counts (their target is never met): 1 writes o_lat directly, 3 goes through the merge."""
    config = MLADecodeConfig(16, 16, 4, 2, target_programs=1 << 20, max_splits=splits)
    got, ref = run_case(context_lens, num_heads, config, seed=seed)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("config", CANDIDATE_CONFIGS, ids=lambda c: "-".join(map(str, c.as_args())))
def test_every_candidate_the_build_measures_matches_reference(config):
    """Each shipped candidate (16 to 64 heads per program, some splitting at this batch) on 20 heads: a
    program's head block is partly masked."""
    got, ref = run_case([3, 70, 33], 20, config, seed=4)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("context_lens", [[40], [3, 70, 33]])
def test_each_batch_runs_its_buckets_config(context_lens):
    """A table of two buckets (batch 1: 16 heads a program, split 3 ways; batch 2 and up: 32 heads, no split):
    the batch's own bucket writes every output row (the output starts uninitialized)."""
    table = [1, 16, 16, 4, 2, 1 << 20, 3, 2, 32, 32, 4, 2, 1, 1]
    got, ref = run_case(context_lens, 20, table, seed=6)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_more_splits_than_key_blocks():
    """A split with no key block contributes nothing (its lse is -inf), the rest still sum right."""
    got, ref = run_case([9, 33], 4, MLADecodeConfig(16, 16, 4, 2, target_programs=1 << 20, max_splits=8), seed=2)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def _decode_logits_both_backends(model, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill 3 sequences through `model` (its kernels as set), then one decode step through the `reference`
    MLA backend and through the `triton` one on copies of the same cache: (reference logits, triton logits)."""
    from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
    from deepseek_model import step_of
    with torch.no_grad():
        model(step_of(cache, [[5, 6, 7, 8, 9], list(range(20, 40)), [3]], [0, 0, 0]))
        decode = [[11], [12], [13]]
        ref = model(step_of(cache.clone(), decode, [5, 20, 1]))
        triton_row = PhaseTuning({"mla_attention": BackendChoice("triton", {"mla_decode": (16, 16, 4, 2, 1 << 20, 2)}),
                                  "moe": BackendChoice("reference")})
        return ref, model.use_kernels(triton_row)(step_of(cache.clone(), decode, [5, 20, 1]))


def test_backend_decode_step_equals_reference_backend():
    """A tiny DeepSeek model: a decode step through the `triton` MLA backend and through the `reference` one:
    equal logits."""
    from deepseek_model import random_deepseek
    model = random_deepseek().to(DEVICE)
    ref, got = _decode_logits_both_backends(model, torch.zeros(model.kv_cache_layout(model.config).shape(12, 16),
                                                               device=DEVICE))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_backend_decode_step_on_an_fp8_cache_equals_reference_backend():
    """The same with an e4m3 latent cache and calibrated (c_kv, k_pe) scales: the triton backend folds the
    scales into the query and the latent output, the reference dequantizes the cache; equal logits."""
    from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
    from atom_aot.weights.kv_scales import calibrate_kv_scales
    from deepseek_model import random_deepseek
    model = random_deepseek(seed=1)
    scales = calibrate_kv_scales(model, [[5, 6, 7, 8, 9], list(range(20, 40))])
    assert len(scales) == 5 and all(s[0] != s[1] for s in scales.values())       # 4 layers + the MTP layer
    model.load_state_dict(scales, strict=False)
    model.use_kernels(PhaseTuning({"mla_attention": BackendChoice("reference"), "moe": BackendChoice("reference")}))
    cache = torch.zeros(model.kv_cache_layout(model.config).shape(12, 16), dtype=torch.float8_e4m3fn, device=DEVICE)
    model = model.to(DEVICE)
    ref, got = _decode_logits_both_backends(model, cache)
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)


def test_an_mla_models_tuning_is_written_as_json(monkeypatch):
    """tune_mla's row, with the MoE op's timings keyed by config tuples as build/tune.py's _tune_moe returns
    them, serializes and reads back (the first GPU build of a DeepSeek model failed on the tuple keys)."""
    from atom_aot.artifact.phase import Phase
    from atom_aot.artifact.tuning import BackendChoice, Tuning
    from atom_aot.build import tune_mla
    from atom_aot.build.config import BuildConfig
    from deepseek_model import random_deepseek
    cfg = random_deepseek().config
    monkeypatch.setattr(tune_mla, "_time_decode", lambda cfg, config, candidates, context:
                        {c.as_args(): 1.0 + i for i, c in enumerate(candidates)})
    mixed = BackendChoice("triton", {"mla_chunk": (64, 64, 4, 2), "mla_prefix": (16, 32, 4, 2), "absorbed_runs": (2,)})
    monkeypatch.setattr(tune_mla, "tune_mixed", lambda cfg, config, decode, best:
                        (BackendChoice("triton", {**decode, **mixed.params}), {"mla_chunk": {"1x2048+0": {"64,64,4,2": 0.9}}},
                         "mixed: triton"))
    moe = BackendChoice("triton", {"fused_moe@1": (16, 16, 32, 1, 2, 1)})
    tuning = tune_mla.tune_mla(BuildConfig(arch="sm90"), cfg, 4096,
                               lambda cfg, config: (moe, {1: {(16, 16, 32, 1, 2, 1): 0.5}}), "triton fused_moe")
    read = Tuning.from_dict(json.loads(tuning.to_json()))
    assert read.for_phase(Phase.DECODE).op("moe") == moe
    assert read.measurements_ms["moe"] == {"1": {"16,16,32,1,2,1": 0.5}}
    assert read.measurements_ms["mla_mixed"] == {"mla_chunk": {"1x2048+0": {"64,64,4,2": 0.9}}}
    assert read.for_phase(Phase.MIXED).op("mla_attention").params["absorbed_runs"] == (2,)
    # candidate 0 is the fastest at every batch: each bucket names it
    params = read.for_phase(Phase.DECODE).op("mla_attention").params
    assert params == {f"mla_decode@{b}": CANDIDATE_CONFIGS[0].as_args() for b in tune_mla.DECODE_BATCHES}
    from atom_aot.ops.backends import make_backend              # the backend reads them as the op's table
    backend = make_backend("mla_attention", read.for_phase(Phase.DECODE).op("mla_attention"))
    assert backend.table == [v for b in tune_mla.DECODE_BATCHES for v in (b, *CANDIDATE_CONFIGS[0].as_args())]


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_cache_write_equals_the_reference_and_skips_padding(cache_dtype):
    """Fresh random latents into a cache of random bytes: the kernel writes each token's [c_kv | k_pe] where
    the reference does (an fp8 cache through its scales), leaves padded tokens (slot -1) and every other row as
    they were, in another layer than 0."""
    g = torch.Generator().manual_seed(5)
    cache = torch.randn(3, 1, 6, 16, 1, RANK + ROPE, generator=g).to(cache_dtype)
    c_kv, k_pe = torch.randn(7, RANK, generator=g) * 3, torch.randn(7, ROPE, generator=g) * 3
    slots = torch.tensor([17, -1, 0, 95, 40, -1, 63])
    scale = torch.tensor([0.02, 0.05]) if cache_dtype != torch.float32 else None
    want = cache.clone()
    write_latent_cache(want[2], c_kv, k_pe, slots, scale)
    got = cache.clone().to(DEVICE)
    mla_cache_write(c_kv.to(DEVICE), k_pe.to(DEVICE), got, 2, slots.to(DEVICE),
                    None if scale is None else scale.to(DEVICE))
    assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))
    assert not torch.equal(want.view(torch.uint8), cache.view(torch.uint8))


EXPORT_WITH_SYMBOLIC_BATCH = """
import torch
from torch.export import Dim, export
import atom_aot.ops.triton
from atom_aot.ops.triton.mla_decode import mla_decode

class Decode(torch.nn.Module):
    def forward(self, q, kv_cache, block_tables, seq_lens):
        return mla_decode(q, kv_cache, 0, block_tables, seq_lens, 0.1, 32,
                          [1, 16, 16, 4, 2, 512, 4, 8, 32, 16, 4, 2, 512, 1, 64, 64, 32, 8, 1, 512, 32])

args = (torch.randn(4, 20, 48), torch.randn(1, 1, 8, 16, 1, 48), torch.zeros(4, 2, dtype=torch.int32),
        torch.full((4,), 5, dtype=torch.int32))
seqs = Dim("num_seqs", min=1, max=256)
exported = export(Decode(), args, dynamic_shapes=({0: seqs}, None, {0: seqs}, {0: seqs}))
print("ops", str(exported.graph_module.code).count("atom_triton.mla_decode"))
"""


def test_a_bucket_table_exports_with_a_symbolic_batch():
    """The decode package is exported with the batch size symbolic: every bucket's launch must be an expression
    of it, never a guard (a first version sized its partials by `batch * in_bucket(...)`, which export refused
    on the GPU: 'Constraints violated (num_seqs)'). In a process of its own: export cannot trace the Triton
    interpreter these tests run the kernels in."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", EXPORT_WITH_SYMBOLIC_BATCH], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split("ops")[-1]) == 1
