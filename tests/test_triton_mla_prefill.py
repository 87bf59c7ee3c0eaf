"""atom_triton::mla_prefill (MLA's mixed-step attention: the naive chunk kernel and the absorbed prefix kernel,
merged) against the reference op (atom_aot/ops/mla.py) in float64, on fresh random inputs; in Triton's
interpreter without a GPU."""
import pytest
import torch

from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.models.mla import split_kv_b_proj
from atom_aot.ops.attention import from_cache, to_cache
from atom_aot.ops.mla import mla_attention_reference, write_latent_cache
from atom_aot.ops.triton.batch_inputs import make_paged_batch
from atom_aot.ops.triton.mla_prefill import CHUNK_CANDIDATES, PREFIX_CANDIDATES, MLATileConfig, mla_prefill
from triton_kernel_checks import rel_error

RANK, ROPE, NOPE, V = 32, 16, 16, 24
SMALL = MLATileConfig(16, 16, 4, 2)


def mla_step(context_lens, query_lens, num_heads, seed, pad_tokens=0, fp8=False, dtype=torch.float32):
    """A random step over a random paged latent cache (blocks of 16 in random order): the inputs of both the
    reference op and the kernels, as a dict."""
    g = torch.Generator().manual_seed(seed)
    batch = make_paged_batch(context_lens, query_lens, 1, RANK + ROPE, block_size=16, num_layers=2,
                             pad_tokens=pad_tokens, generator=g)
    tokens = sum(query_lens) + pad_tokens
    w_uk, w_uv = split_kv_b_proj(torch.randn(num_heads * (NOPE + V), RANK, generator=g) * 0.3, num_heads, NOPE)
    cache = batch.kv_cache[:, :1]
    scale = None
    if fp8:
        scale = torch.tensor([0.02, 0.05])
        cache = to_cache(cache, torch.float8_e4m3fn, None)
    return dict(q_nope=torch.randn(tokens, num_heads, NOPE, generator=g).to(dtype),
                q_pe=torch.randn(tokens, num_heads, ROPE, generator=g).to(dtype),
                c_kv=(torch.randn(tokens, RANK, generator=g) * (6 if fp8 else 1)).to(dtype),
                k_pe=(torch.randn(tokens, ROPE, generator=g) * (15 if fp8 else 1)).to(dtype),
                kv_cache=cache, layer=1, slot_mapping=batch.slot_mapping, block_tables=batch.block_tables,
                seq_lens=batch.seq_lens, query_start_loc=batch.query_start_loc, w_uk=w_uk.to(dtype),
                w_uv=w_uv.to(dtype), scale=(NOPE + ROPE) ** -0.5, kv_scale=scale)


def reference(step: dict) -> torch.Tensor:
    """The reference op in float64 (an fp8 cache's bytes as they are, read through its scales)."""
    f64 = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.element_size() > 1 else v
           for k, v in step.items()}
    f64["kv_cache"] = step["kv_cache"].clone() if step["kv_scale"] is not None else step["kv_cache"].double()
    f64["kv_scale"] = step["kv_scale"]
    return mla_attention_reference(**f64)


def kernels(step: dict, chunk=SMALL, prefix=SMALL) -> torch.Tensor:
    """The cache write (reference), the chunk's up-projection in torch, then the op with every run naive."""
    cache = step["kv_cache"].clone()
    write_latent_cache(cache[step["layer"]], step["c_kv"], step["k_pe"], step["slot_mapping"], step["kv_scale"])
    scale = step["kv_scale"]
    c_kv = from_cache(to_cache(step["c_kv"], cache.dtype, None if scale is None else scale[0]), step["c_kv"].dtype,
                      None if scale is None else scale[0])
    k_pe = from_cache(to_cache(step["k_pe"], cache.dtype, None if scale is None else scale[1]), step["k_pe"].dtype,
                      None if scale is None else scale[1])
    k_nope = torch.einsum("tr,hnr->thn", c_kv, step["w_uk"]).contiguous()
    v = torch.einsum("tr,hrv->thv", c_kv, step["w_uv"]).contiguous()
    heads = step["q_nope"].shape[1]
    dev = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in step.items()}
    out = mla_prefill(dev["q_nope"], dev["q_pe"], k_nope.to(DEVICE), v.to(DEVICE), k_pe.to(DEVICE),
                      torch.empty(0, heads, V, device=DEVICE, dtype=v.dtype), cache.to(DEVICE), step["layer"],
                      dev["block_tables"], dev["seq_lens"], dev["query_start_loc"], dev["w_uk"], dev["w_uv"],
                      step["scale"], 0, list(chunk.as_args()), list(prefix.as_args()),
                      None if scale is None else scale.to(DEVICE))
    return out.cpu()


@pytest.mark.parametrize("seed,context_lens,query_lens,heads", [
    (0, [0], [37], 4),                     # one prefill, no prefix, crossing two blocks
    (1, [0, 21, 3, 40], [18, 17, 30, 2], 3),   # prefixes of 0 and more, chunks across block boundaries
    (2, [50, 0], [1, 5], 2),               # a decode-like run of one token, in the naive form
])
def test_naive_runs_match_the_reference(seed, context_lens, query_lens, heads):
    step = mla_step(context_lens, query_lens, heads, seed, pad_tokens=3)
    got, want = kernels(step), reference(step)
    real = sum(query_lens)
    assert rel_error(got[:real], want[:real]) < 1e-5
    assert torch.equal(got[real:], torch.zeros_like(got[real:]))        # padding rows: zeros


def test_an_fp8_cache_matches_the_reference():
    """e4m3 latents with (c_kv, k_pe) scales: the prefix read through them, the chunk rounded as the cache holds it."""
    step = mla_step([23, 0, 40], [9, 20, 17], 2, seed=3, fp8=True)
    got, want = kernels(step), reference(step)
    assert rel_error(got, want) < 1e-5


@pytest.mark.parametrize("config", CHUNK_CANDIDATES + PREFIX_CANDIDATES, ids=lambda c: "-".join(map(str, c.as_args())))
def test_every_candidate_matches_the_reference(config):
    step = mla_step([19, 0], [40, 3], 2, seed=4)
    want = reference(step)
    assert rel_error(kernels(step, chunk=config), want) < 1e-5
    assert rel_error(kernels(step, prefix=config), want) < 1e-5


def mixed_row(absorbed_runs: int):
    """A mixed row naming the triton MLA backend's mixed path (small tiles for the tiny model)."""
    from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
    params = {"mla_chunk": SMALL.as_args(), "mla_prefix": SMALL.as_args(), "absorbed_runs": (absorbed_runs,),
              "mla_decode@1": (16, 16, 4, 2, 1 << 20, 2), "mla_decode@4": (16, 16, 4, 2, 1, 1)}
    return PhaseTuning({"mla_attention": BackendChoice("triton", params), "moe": BackendChoice("reference")})


def _mixed_logits_both_backends(model, cache: torch.Tensor, absorbed_runs: int):
    """Prefill 3 sequences through `model`'s reference backend, then one mixed step (a decoding sequence, a
    20-token chunk over a 20-token prefix crossing a block, a 3-token run over a 1-token prefix, a new prompt)
    through the reference backend and through the triton mixed path on copies of the cache."""
    from deepseek_model import step_of
    tokens, starts = [[11], list(range(40, 60)), [13, 14, 15], [7, 8, 9, 10, 12]], [5, 20, 1, 0]
    with torch.no_grad():
        model(step_of(cache, [[5, 6, 7, 8, 9], list(range(20, 40)), [3]], [0, 0, 0]))
        ref = model(step_of(cache.clone(), tokens, starts))
        return ref, model.use_kernels(mixed_row(absorbed_runs))(step_of(cache.clone(), tokens, starts))


@pytest.mark.parametrize("absorbed_runs", [1, 3])
def test_backend_mixed_step_equals_reference_backend(absorbed_runs):
    """A tiny DeepSeek model: a mixed step through the triton mixed path (runs of up to 1 or 3 tokens absorbed)
    and through the reference backend: equal logits."""
    from deepseek_model import random_deepseek
    model = random_deepseek().to(DEVICE)
    cache = torch.zeros(model.kv_cache_layout(model.config).shape(16, 16), device=DEVICE)
    ref, got = _mixed_logits_both_backends(model, cache, absorbed_runs)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_backend_mixed_step_on_an_fp8_cache_equals_reference_backend():
    from atom_aot.build.kv_scales import calibrate_kv_scales
    from deepseek_model import random_deepseek
    model = random_deepseek(seed=1)
    model.load_state_dict(calibrate_kv_scales(model, [[5, 6, 7, 8, 9], list(range(20, 40))]), strict=False)
    model = model.to(DEVICE)
    cache = torch.zeros(model.kv_cache_layout(model.config).shape(16, 16), dtype=torch.float8_e4m3fn, device=DEVICE)
    ref, got = _mixed_logits_both_backends(model, cache, 2)
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)
