"""atom_triton::mla_prefill (MLA's mixed-step attention: the naive chunk kernel and the absorbed prefix kernel,
merged) against the reference op (atom_aot/ops/mla.py) in float64, on fresh random inputs; in Triton's
interpreter without a GPU."""
from pathlib import Path

import pytest
import torch

from triton_support import DEVICE, ON_GPU, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.models.mla import split_kv_b_proj
from atom_aot.ops.attention import from_cache, to_cache
from atom_aot.ops.mla import mla_attention_reference, write_latent_cache
from atom_aot.ops.triton.batch_inputs import make_paged_batch
from atom_aot.ops.triton.mla_prefill import CHUNK_CANDIDATES, PREFIX_CANDIDATES, MLATileConfig, mla_prefill
from atom_aot.ops.triton.mla_workspace import ABSORBED_PREFIXES, PrefixWorkspace
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


def kernels(step: dict, chunk=SMALL, prefix=SMALL, workspace: PrefixWorkspace = ABSORBED_PREFIXES) -> torch.Tensor:
    """The cache write (reference), the chunk's up-projection in torch, then the op with every run naive (by default
    no prefix workspace: every cached prefix through the absorbed prefix kernel)."""
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
                      step["scale"], 0, list(chunk.as_args()), list(prefix.as_args()), list(workspace.as_args()),
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


def test_bf16_matches_the_float64_reference():
    """bf16 queries, weights and cache (the GPU's dtype): within bf16's rounding of the float64 reference."""
    step = mla_step([30, 0, 7], [12, 33, 1], 2, seed=5, dtype=torch.bfloat16)
    step["kv_cache"] = step["kv_cache"].to(torch.bfloat16)
    got, want = kernels(step), reference(step)
    assert got.dtype == torch.bfloat16 and rel_error(got, want) < 2e-2


@pytest.mark.parametrize("config", CHUNK_CANDIDATES + PREFIX_CANDIDATES, ids=lambda c: "-".join(map(str, c.as_args())))
def test_every_candidate_matches_the_reference(config):
    step = mla_step([19, 0], [40, 3], 2, seed=4)
    want = reference(step)
    assert rel_error(kernels(step, chunk=config), want) < 1e-5
    assert rel_error(kernels(step, prefix=config), want) < 1e-5


def mixed_row(absorbed_runs: int, workspace: PrefixWorkspace | None = None):
    """A mixed row naming the triton MLA backend's mixed path (small tiles for the tiny model); `workspace`: its
    mla_prefix_workspace param (None: a row built before it, without one)."""
    from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
    params = {"mla_chunk": SMALL.as_args(), "mla_prefix": SMALL.as_args(), "absorbed_runs": (absorbed_runs,),
              "mla_decode@1": (16, 16, 4, 2, 1 << 20, 2), "mla_decode@4": (16, 16, 4, 2, 1, 1)}
    if workspace is not None:
        params["mla_prefix_workspace"] = workspace.as_args()
    return PhaseTuning({"mla_attention": BackendChoice("triton", params), "moe": BackendChoice("reference")})


def _mixed_logits_both_backends(model, cache: torch.Tensor, absorbed_runs: int, workspace=None):
    """Prefill 3 sequences through `model`'s reference backend, then one mixed step (a decoding sequence, a
    20-token chunk over a 20-token prefix crossing a block, a 3-token run over a 1-token prefix, a new prompt)
    through the reference backend and through the triton mixed path (`workspace`: its row's prefix workspace, None:
    a row without one) on copies of the cache."""
    from deepseek_model import step_of
    tokens, starts = [[11], list(range(40, 60)), [13, 14, 15], [7, 8, 9, 10, 12]], [5, 20, 1, 0]
    with torch.no_grad():
        model(step_of(cache, [[5, 6, 7, 8, 9], list(range(20, 40)), [3]], [0, 0, 0]))
        ref = model(step_of(cache.clone(), tokens, starts))
        return ref, model.use_kernels(mixed_row(absorbed_runs, workspace))(step_of(cache.clone(), tokens, starts))


def small_workspace(capacity: int | None) -> PrefixWorkspace | None:
    return None if capacity is None else PrefixWorkspace(capacity, 16, 16, 4, 2)


@pytest.mark.parametrize("absorbed_runs,capacity", [
    (1, None), (3, None),   # a row without a prefix workspace: every cached prefix absorbed in the prefix kernel
    (1, 8),                 # naive prefixes 20 + 1: the chunk's overflows past 8
    (1, 21),                # every naive prefix exactly
    (3, 20),                # the 3-token run absorbed: the one naive prefix exactly
    (3, 64),                # room to spare
])
def test_backend_mixed_step_equals_reference_backend(absorbed_runs, capacity):
    """A tiny DeepSeek model: a mixed step through the triton mixed path (runs of up to 1 or 3 tokens absorbed;
    cached prefixes in a workspace of `capacity` tokens, what overflows absorbed) and through the reference backend:
    equal logits."""
    from deepseek_model import random_deepseek
    model = random_deepseek().to(DEVICE)
    cache = torch.zeros(model.kv_cache_layout(model.config).shape(16, 16), device=DEVICE)
    ref, got = _mixed_logits_both_backends(model, cache, absorbed_runs, small_workspace(capacity))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("capacity", [None, 8])
def test_backend_mixed_step_on_an_fp8_cache_equals_reference_backend(capacity):
    from atom_aot.weights.kv_scales import calibrate_kv_scales
    from deepseek_model import random_deepseek
    model = random_deepseek(seed=1)
    model.load_state_dict(calibrate_kv_scales(model, [[5, 6, 7, 8, 9], list(range(20, 40))]), strict=False)
    model = model.to(DEVICE)
    cache = torch.zeros(model.kv_cache_layout(model.config).shape(16, 16), dtype=torch.float8_e4m3fn, device=DEVICE)
    ref, got = _mixed_logits_both_backends(model, cache, 2, small_workspace(capacity))
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)


EXPORT_MIXED_LAYER = """
import torch
import triton
from torch.export import Dim, export
from triton.backends.compiler import GPUTarget
from atom_aot.ops.backends import make_backend
from atom_aot.ops.backends.base import AttentionInputs
from atom_aot.ops.backends.mla import MLAArgs
from export_recording import host_reads, launch_kinds, written
from atom_aot.ops.triton.mla_workspace import PrefixWorkspace
from test_triton_mla_prefill import mixed_row


class Hopper:        # torch's mutation analysis compiles the kernels to TTIR for the active target: sm90 stands in
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


triton.runtime.driver.set_active(Hopper())

backend = make_backend("mla_attention", mixed_row(2, PrefixWorkspace(32, 16, 16, 4, 2)).op("mla_attention"))
H, NOPE, ROPE, RANK, V = 4, 16, 16, 32, 24

class Layer(torch.nn.Module):
    def forward(self, q_nope, q_pe, c_kv, k_pe, positions, cos_sin, w_uk, w_uv, kv_cache, slots, tables, lens, starts):
        return backend(MLAArgs(1, q_nope, q_pe, c_kv, k_pe, positions, cos_sin, w_uk, w_uv, 0.2,
                               AttentionInputs(kv_cache, slots, tables, lens, starts)))

T, B = 7, 3
args = (torch.randn(T, H, NOPE), torch.randn(T, H, ROPE), torch.randn(T, RANK), torch.randn(T, ROPE),
        torch.zeros(T, dtype=torch.int64), torch.randn(64, ROPE), torch.randn(H, NOPE, RANK), torch.randn(H, RANK, V),
        torch.randn(2, 1, 10, 16, 1, RANK + ROPE), torch.zeros(T, dtype=torch.int64), torch.zeros(B, 4, dtype=torch.int32),
        torch.ones(B, dtype=torch.int32), torch.arange(B + 1, dtype=torch.int32))
t, b, w, blocks = Dim("T", min=2, max=8192), Dim("B", min=2, max=512), Dim("W", min=2, max=1024), Dim("blocks", min=2)
dynamic = ({0: t}, {0: t}, {0: t}, {0: t}, {0: t}, None, None, None, {2: blocks}, {0: t}, {0: b, 1: w}, {0: b},
           {0: b + 1})
decomposed = export(Layer(), args, dynamic_shapes=dynamic).run_decompositions(decompose_custom_triton_ops=True)
kinds = launch_kinds(decomposed)
print("KERNELS", sorted({name for name, _ in kinds}))
print("STATIC", sorted({name for name, symbolic in kinds if not symbolic}))
print("HOST_READS", host_reads(decomposed))
print("WRITTEN", sorted({(name, tuple(w)) for (name, _), w in zip(kinds, written(decomposed))}))
"""


def test_the_mixed_path_exports_with_symbolic_grids_and_no_host_reads():
    """One layer's triton mixed path (with a prefix workspace) exported with the step's sizes dynamic (tokens,
    sequences, table width, pool size), decomposed as AOTInductor takes it: every kernel's grid is an expression of
    the sizes but the workspace kernel's, fixed by the row's capacity, and nothing reads a tensor on the host, so the
    step can be captured in a CUDA graph; torch's mutation analysis sees each kernel write only its outputs (one it
    could not read would have the package copy the KV cache around it). In a process of its own: export cannot
    trace the Triton interpreter these tests run the kernels in."""
    import ast
    import os
    import subprocess
    import sys
    from pathlib import Path
    tests = Path(__file__).resolve().parent
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
           "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", EXPORT_MIXED_LAYER], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.split(" ")[0].isupper())
    assert ast.literal_eval(lines["KERNELS"]) == ["merge_splits_kernel", "mla_cache_write_kernel", "mla_chunk_kernel",
                                                  "mla_decode_kernel", "mla_prefix_kernel",
                                                  "mla_prefix_workspace_kernel"]
    assert ast.literal_eval(lines["STATIC"]) == ["mla_prefix_workspace_kernel"] and int(lines["HOST_READS"]) == 0
    outputs = {"mla_cache_write_kernel": {"kv_ptr"}, "mla_decode_kernel": {"out_ptr", "part_ptr", "lse_ptr"},
               "merge_splits_kernel": {"out_ptr"}, "mla_chunk_kernel": {"out_ptr", "lse_ptr"},
               "mla_prefix_kernel": {"out_ptr"}, "mla_prefix_workspace_kernel": {"ws_k_nope_ptr", "ws_v_ptr",
                                                                                 "ws_k_pe_ptr"}}
    for kernel, writes in ast.literal_eval(lines["WRITTEN"]):
        # the analysis also counts the tile search's loads of query_start_loc ([B + 1] ints) as possible writes
        assert set(writes) - {"query_start_loc_ptr"} <= outputs[kernel], (kernel, writes)


def with_tuning(artifact, out, row) -> Path:
    """A copy of the archive `artifact` whose tuning.json names `row` for the mixed phase (the member's hashes
    re-recorded in the manifest): how a CPU test runs an engine on a GPU arch's kernel choice."""
    import json
    from artifact_tools import forge_archive
    from atom_aot.artifact.digest import fast_hash, sha256
    from atom_aot.artifact.tuning import TUNING, Tuning
    from atom_aot.artifact.phase import Phase
    from artifact_tools import read_entries
    tuning = Tuning.from_dict(json.loads(read_entries(artifact)[TUNING]))
    data = Tuning(tuning.arch, True, {Phase.MIXED: row}, {"mla_attention": "triton (the test's row)"}).to_json().encode()

    def edit(manifest):
        manifest["members"][TUNING].update(size=len(data), sha256=sha256(data), xxh3=fast_hash(data),
                                           stored="raw", stored_size=len(data))
    return forge_archive(artifact, out, edit, change=lambda entries: entries.update({TUNING: data}))


@pytest.fixture(scope="module")
def tiny_deepseek(tmp_path_factory, build_artifact):
    """The tiny q-LoRA DeepSeek checkpoint, and its eager artifact with the triton mixed path (a 24-token prefix
    workspace) as its mixed row."""
    if ON_GPU:
        pytest.skip("conftest's build_artifact builds for the cpu arch, which a GPU machine refuses; this engine "
                    "test runs the path's kernels in the interpreter on CPU")
    from deepseek_factories import make_tiny_deepseek
    model_dir = make_tiny_deepseek(tmp_path_factory.mktemp("models") / "tiny-deepseek", seed=11)
    artifact = build_artifact(model_dir, compile="none")
    row = mixed_row(2, small_workspace(24))                     # a workspace the 32-token cached prefix overflows
    return model_dir, with_tuning(artifact, tmp_path_factory.mktemp("forged") / "mixed-triton.atom", row)


def test_the_engine_on_the_triton_mixed_path_decodes_like_transformers(tiny_deepseek, caplog):
    """Every step of the engine through the triton mixed path (eager artifacts run the mixed row for every
    batch): chunked prefill (a 16-token budget), decoding sequences riding along, then two prompts over the
    cached 32-token prefix of one before them; greedy output token for token equal to transformers."""
    from atom_aot import LLMEngine, SamplingParams
    from factories import hf_greedy, random_prompts
    model_dir, artifact = tiny_deepseek
    shared = random_prompts(1, 380, seed=7, lengths=(32, 32))[0]
    prompts = random_prompts(1, 380, seed=24, lengths=(20, 30)) + random_prompts(2, 380, seed=8, lengths=(1, 12),
                                                                                  prefix=shared)
    expected = hf_greedy(model_dir, prompts, 4)
    with caplog.at_level("INFO", logger="atom_aot"):
        engine = LLMEngine(str(artifact), enable_prefix_caching=True, max_num_batched_tokens=16)
    assert "mla_attention: triton (the test's row)" in caplog.text        # the start says which path runs
    greedy = SamplingParams(temperature=0, max_tokens=4)
    got = [o["token_ids"] for part in (prompts[:2], prompts[2:]) for o in engine.generate(part, greedy)]
    assert got == expected
    assert engine.core.block_manager.prefix_hits >= 32 // 16
