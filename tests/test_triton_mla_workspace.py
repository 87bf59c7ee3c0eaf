"""The MLA mixed step's prefix workspace (ops/triton/mla_workspace.py: the naive runs' cached prefixes up-projected
into a fixed capacity, what overflows it taken absorbed by the prefix kernel) against the reference op in float64,
on fresh random inputs; in Triton's interpreter without a GPU. The backend with a workspace inside a tiny DeepSeek:
tests/test_triton_mla_prefill.py."""
import pytest
import torch

from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.ops.mla import gather_latent, read_latent
from atom_aot.ops.triton import mla_prefill as prefill_module
from atom_aot.ops.triton.mla_workspace import PrefixWorkspace, launch_prefix_workspace, prefix_starts
from test_triton_mla_prefill import RANK, kernels, mla_step, mixed_row, reference
from triton_kernel_checks import rel_error

# cached prefixes 21, 0 (a new prompt), 40 (a one-token run: naive at the op, which absorbs none here) and 3
CONTEXTS, QUERIES = [21, 0, 40, 3], [17, 30, 1, 9]
PREFIX_TOKENS = sum(CONTEXTS)


def workspace(capacity: int, block_m: int = 16) -> PrefixWorkspace:
    """A workspace with tiles for the tiny shapes."""
    return PrefixWorkspace(capacity, block_m, 16, 4, 2)


@pytest.mark.parametrize("capacity,block_m", [
    (16, 16),     # the first prefix overflows, the others wholly
    (21, 16),     # the first prefix exactly; 21 rows in two tiles, the second partly filled
    (40, 32),     # the second prefix split: 19 of its 40 keys in the workspace
    (PREFIX_TOKENS, 16),        # every prefix exactly
    (100, 16),    # room to spare: tiles past the filled rows return at once
])
def test_the_workspace_path_matches_the_reference(capacity, block_m):
    step = mla_step(CONTEXTS, QUERIES, 3, seed=10, pad_tokens=2)
    got, want = kernels(step, workspace=workspace(capacity, block_m)), reference(step)
    real = sum(QUERIES)
    assert rel_error(got[:real], want[:real]) < 1e-5
    assert torch.equal(got[real:], torch.zeros_like(got[real:]))        # padding rows: zeros


class SkippedLaunch:
    """wrap_triton(kernel)'s stand-in that launches nothing."""
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def test_the_workspace_carries_what_it_covers_and_the_prefix_kernel_the_rest(monkeypatch):
    """With the absorbed prefix kernel not launched: a workspace holding every cached prefix still gives the
    reference's output (the chunk kernel attended all of it), one a token short does not (that token was the
    prefix kernel's)."""
    launch = prefill_module.wrap_triton
    monkeypatch.setattr(prefill_module, "wrap_triton", lambda kernel: SkippedLaunch()
                        if kernel is prefill_module.mla_prefix_kernel else launch(kernel))
    step = mla_step(CONTEXTS, QUERIES, 2, seed=12)
    want = reference(step)
    assert rel_error(kernels(step, workspace=workspace(PREFIX_TOKENS)), want) < 1e-5
    assert rel_error(kernels(step, workspace=workspace(PREFIX_TOKENS - 1)), want) > 1e-4


@pytest.mark.parametrize("fp8", [False, True])
def test_the_workspace_holds_the_naive_runs_prefixes_up_projected_in_batch_order(fp8):
    """Workspace row starts[b] + p holds position p of sequence b's cached prefix, for the runs longer than
    absorbed_max (the one-token run takes none), up to the capacity; an fp8 cache read through its scales."""
    step = mla_step(CONTEXTS, QUERIES, 2, seed=13, fp8=fp8)
    starts = prefix_starts(step["query_start_loc"], step["seq_lens"], absorbed_max=1)
    assert starts.tolist() == [0, 21, 21, 21, 24]
    capacity, layer = 22, step["layer"]
    ws_k_nope, ws_v, ws_k_pe = launch_prefix_workspace(
        step["kv_cache"].to(DEVICE), layer, step["block_tables"].to(DEVICE), starts.to(DEVICE), step["w_uk"].to(DEVICE),
        step["w_uv"].to(DEVICE), step["k_pe"].shape[1], workspace(capacity),
        None if step["kv_scale"] is None else step["kv_scale"].to(DEVICE))
    scale = step["kv_scale"]
    latents = torch.cat([read_latent(gather_latent(step["kv_cache"][layer], step["block_tables"][b], CONTEXTS[b]),
                                     torch.float64, RANK, scale) for b in (0, 3)])[:capacity]      # [C, r + rope]
    c_kv, w_uk, w_uv = latents[:, :RANK], step["w_uk"].double(), step["w_uv"].double()
    assert rel_error(ws_k_nope.cpu(), torch.einsum("lr,hnr->lhn", c_kv, w_uk)) < 1e-6
    assert rel_error(ws_v.cpu(), torch.einsum("lr,hrv->lhv", c_kv, w_uv)) < 1e-6
    assert rel_error(ws_k_pe.cpu(), latents[:, RANK:]) < 1e-6


def test_an_fp8_cache_through_the_workspace_matches_the_reference():
    step = mla_step(CONTEXTS, QUERIES, 2, seed=14, fp8=True)
    assert rel_error(kernels(step, workspace=workspace(40)), reference(step)) < 1e-5


def test_bf16_through_the_workspace_matches_the_float64_reference():
    step = mla_step(CONTEXTS, QUERIES, 2, seed=15, dtype=torch.bfloat16)
    step["kv_cache"] = step["kv_cache"].to(torch.bfloat16)
    got, want = kernels(step, workspace=workspace(40)), reference(step)
    assert got.dtype == torch.bfloat16 and rel_error(got, want) < 2e-2


def test_a_row_without_a_workspace_runs_the_absorbed_prefix_kernel_and_says_so(caplog):
    """An artifact built before the workspace: its row has no mla_prefix_workspace; the backend runs with none (the
    prefix kernel takes every cached prefix) and logs that, and a row with one reads it back."""
    from atom_aot.ops.backends import make_backend
    with caplog.at_level("INFO", logger="atom_aot"):
        old = make_backend("mla_attention", mixed_row(2).op("mla_attention"))
    assert old.workspace == [0, 64, 64, 8, 2] and "cached prefixes take the absorbed prefix kernel" in caplog.text
    assert make_backend("mla_attention", mixed_row(2, workspace(24)).op("mla_attention")).workspace == [24, 16, 16, 4, 2]
