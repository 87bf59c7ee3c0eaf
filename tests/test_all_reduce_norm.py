"""The all-reduce fused into the residual add + RMSNorm after it: the peer table and its rule, the Triton kernel
(in the interpreter without a GPU) against the unfused reference, its peer path with ranks as processes, and
the model's layers handing their partial sums to their norms. On GPUs the same kernel runs over peer-mapped
memory: scripts/gpu/all_reduce_norm_gpus.py checks it there against float64 and times it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_kernel_checks import all_reduce_norm_reference as reference
from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.distributed import collectives, peer_table
from atom_aot.distributed.symmetric_all_reduce import AllReducePlan, plan_from_env
from atom_aot.ops.norm import rms_norm
from atom_aot.ops.triton.all_reduce_norm import all_reduce_add_rms_norm

ROOT = Path(__file__).resolve().parents[1]


def test_the_rule_takes_messages_that_fit_a_slab_per_program():
    row = 4096 * 2                                     # a Llama-3.1-8B row in bf16
    slab = peer_table.slab_bytes_for(1 << 20)          # two ranks' one-shot bound, 16 KiB per program: the minimum
    assert slab == peer_table.MIN_SLAB_BYTES == 32768
    assert peer_table.peer_path_taken(1, row, slab) and peer_table.peer_path_taken(256, row, slab)
    assert not peer_table.peer_path_taken(257, row, slab)         # 5 rows for some program: 40 KiB
    assert not peer_table.peer_path_taken(1, row, 0)               # no peer memory
    assert peer_table.slab_bytes_for(4 << 20) == 65536
    assert not peer_table.peer_path_taken(1, 4094, slab)           # rows not whole 16-byte vectors
    assert not peer_table.two_shot_taken(128, 0) and not peer_table.two_shot_taken(64, 2)
    assert peer_table.two_shot_taken(65, 2) and peer_table.two_shot_taken(256, peer_table.two_shot_rows_for(4))
    assert not peer_table.two_shot_taken(192, peer_table.two_shot_rows_for(4))
    huge = peer_table.PROGRAMS * peer_table.ROWS_PER_PROGRAM_MAX
    assert peer_table.peer_path_taken(huge, 16, 1 << 20) and not peer_table.peer_path_taken(huge + 1, 16, 1 << 20)


def test_the_table_lays_out_rank_slab_buffers_and_signal_pads():
    values = peer_table.table_values(1, 4096, [10, 20], [30, 40], 2)
    assert len(values) == peer_table.TABLE_SIZE and values[peer_table.TWO_SHOT_ROWS] == 2
    assert peer_table.TWO_SHOT_ROWS == peer_table.TABLE_SIZE - 1     # last: packages built before read the rest
    assert values[peer_table.RANK] == 1 and values[peer_table.SLAB_BYTES] == 4096
    assert values[peer_table.BUFFERS:peer_table.BUFFERS + 2] == [10, 20]
    assert values[peer_table.SIGNALS:peer_table.SIGNALS + 2] == [30, 40]
    assert peer_table.empty_table() == [0] * peer_table.TABLE_SIZE
    with pytest.raises(ValueError, match="up to 8 ranks"):
        peer_table.table_values(0, 16, list(range(9)), list(range(9)))


def test_the_plan_fuses_by_default_and_the_environment_splits_it():
    assert plan_from_env(2, {}).norm_slab_bytes == 32768
    assert "summed in the norm's kernel in 64 slabs of 32 KiB" in plan_from_env(2, {}).describe()
    assert plan_from_env(2, {}).norm_two_shot_rows == 0                          # one-shot: what GPUs have run
    two_shot = plan_from_env(4, {"ATOM_ALL_REDUCE_NORM": "fused-two-shot"})
    assert two_shot.norm_two_shot_rows == 4 and two_shot.describe().endswith("32 KiB, two-shot from 4 rows per slab")
    assert plan_from_env(2, {"ATOM_ALL_REDUCE_NORM_SLAB": "16384"}).norm_slab_bytes == 16384
    with pytest.raises(ValueError, match="ATOM_ALL_REDUCE_NORM_SLAB=100: expected whole 16-byte vectors"):
        plan_from_env(2, {"ATOM_ALL_REDUCE_NORM_SLAB": "100"})
    assert peer_table.slab_bytes_for(256 << 10) == peer_table.MIN_SLAB_BYTES     # four ranks: the same 4 rows each
    separate = plan_from_env(2, {"ATOM_ALL_REDUCE_NORM": "separate"})
    assert separate.norm_slab_bytes == 0 and "norm" not in separate.describe()
    assert plan_from_env(16, {}).norm_slab_bytes == 0              # more ranks than the table holds
    with pytest.raises(ValueError, match="ATOM_ALL_REDUCE_NORM="):
        plan_from_env(2, {"ATOM_ALL_REDUCE_NORM": "on"})
    with pytest.raises(ValueError, match="ATOM_ALL_REDUCE_NORM_SLAB sizes the fused kernel's slabs"):
        plan_from_env(2, {"ATOM_ALL_REDUCE_NORM": "separate", "ATOM_ALL_REDUCE_NORM_SLAB": "32768"})


@pytest.mark.parametrize("rows", [1, 7, 513], ids=["one row", "seven rows", "a program per row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_peers_the_kernel_adds_and_normalizes_the_reduced_sum(rows, dtype):
    g = torch.Generator().manual_seed(rows)
    partials = [torch.randn(rows, 160, generator=g).to(dtype) for _ in range(2)]
    residual, weight = torch.randn(rows, 160, generator=g).to(dtype), torch.randn(160, generator=g).to(dtype)
    reduced = torch.stack([p.float() for p in partials]).sum(0).to(dtype)
    table = torch.tensor(peer_table.empty_table(), dtype=torch.int64)
    out, residual_out = all_reduce_add_rms_norm(*(t.to(DEVICE) for t in (partials[0], reduced, residual, weight,
                                                                         table)), 1e-5, 2)
    expected_out, expected_residual = reference(partials, residual, weight, 1e-5)
    assert torch.equal(residual_out.cpu(), expected_residual)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2     # bf16: one rounding of the norm's sum order
    torch.testing.assert_close(out.cpu().float(), expected_out.float(), rtol=tolerance, atol=tolerance)


def test_the_kernel_refuses_mismatched_inputs_by_name():
    x, table = torch.randn(2, 32), torch.zeros(peer_table.TABLE_SIZE, dtype=torch.int64)
    with pytest.raises(ValueError, match="weight \\[hidden\\]"):
        all_reduce_add_rms_norm(x, x, x, torch.randn(16), table, 1e-5, 2)
    with pytest.raises(ValueError, match="one dtype"):
        all_reduce_add_rms_norm(x, x, x.double(), torch.randn(32), table, 1e-5, 2)
    with pytest.raises(ValueError, match="peer table"):
        all_reduce_add_rms_norm(x, x, x, torch.randn(32), table[:4], 1e-5, 2)


RANK_RUNS = [(2, "two-shot"), (3, "two-shot"), (3, "one-shot")]


@pytest.fixture(scope="module")
def rank_runs():
    """world -> the output of all_reduce_norm_ranks.py, run once per world with each of its modes in RANK_RUNS (one
    set of spawned ranks for both of 3's)."""
    runs = {}

    def run(world: int) -> dict:
        if world not in runs:
            env = {**os.environ, "TRITON_INTERPRET": "1",
                   "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
            modes = [mode for w, mode in RANK_RUNS if w == world]
            proc = subprocess.run([sys.executable, str(ROOT / "tests" / "all_reduce_norm_ranks.py"), str(world),
                                   *modes], env=env, capture_output=True, text=True, timeout=420 * len(modes))
            assert proc.returncode == 0, proc.stderr[-3000:]
            runs[world] = json.loads(proc.stdout.splitlines()[-1])
        return runs[world]
    return run


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks as CPU processes, in the interpreter")
@pytest.mark.parametrize("world, mode", RANK_RUNS)
def test_ranks_sum_over_each_others_buffers_call_after_call(rank_runs, world, mode):
    """Peer-path and summed-before calls alternate (the halves and counts carry over): every rank's outputs
    equal the reference exactly, and each program met its peers once per peer-path call. In two-shot mode the
    calls of enough rows per program sum two-shot; in one-shot mode (the default) none does, and 2 and 3 rows
    per program sum as a pair and as a pair and an odd row."""
    run = rank_runs(world)
    assert run["exit_codes"] == [0] * world
    result = run["modes"][mode]
    assert [c["peer"] for c in result["calls"]] == [True, True, False, True, True, True, True, True, False]
    two_shot = {2: [False, False, False, False, True, True, True, True, False],     # from 2 rows per program
                3: [False, False, False, False, True, False, True, False, False]}   # from 3
    assert [c["two_shot"] for c in result["calls"]] == (two_shot[world] if mode == "two-shot" else [False] * 9)
    for call in result["calls"]:
        assert call["out"] == [0.0] * world and call["residual"] == [0.0] * world, call
    peer_calls = sum(c["peer"] for c in result["calls"])
    for rank, pads in enumerate(result["pads"]):     # slot p * world + r: rank r's last meeting with program p
        own = [v for i, v in enumerate(pads) if i % world == rank]              # ... or, for r = rank, its calls
        signals = [v for i, v in enumerate(pads) if i % world != rank]
        assert set(own) == {peer_calls} and set(signals) == {2 * peer_calls}


def test_on_the_cpu_the_norm_all_reduces_then_adds_and_normalizes(monkeypatch):
    from atom_aot.models.layers import RMSNorm
    from atom_aot.models.parallel import PartialSums
    monkeypatch.setattr(collectives, "_groups", {})
    collectives.register_stand_in()                    # the group's all-reduce returns its input
    x, residual, norm = torch.randn(3, 32), torch.randn(3, 32), RMSNorm(32, 1e-6, torch.float32)
    weight = norm.weight.data.copy_(torch.randn(32))
    out, residual_out = norm(x, residual, PartialSums(2, None))
    assert torch.equal(residual_out, x + residual) and torch.equal(out, rms_norm(x + residual, weight, 1e-6))
    with pytest.raises(ValueError, match="runs on GPUs"):
        collectives.all_reduce_add_rms_norm(x, residual, weight, 1e-6, None, 2)
    assert not collectives.summed_in_norm_kernel(x)    # the CPU never takes the peer path
    collectives.unregister_tp_group()


def test_tensor_parallel_layers_hand_their_partial_sums_to_the_norms():
    from factories import TINY
    from atom_aot.models import ModelConfig
    from atom_aot.models.llama import LlamaForCausalLM
    from atom_aot.models.parallel import Split
    cfg = ModelConfig.from_hf_dict({**TINY, "architectures": ["LlamaForCausalLM"], "vocab_size": 384})
    for tp, deferred in ((1, False), (2, True)):
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg, torch.float32, split=Split(tp=tp))
        layers = model.model.layers
        assert all(layer.attn_partial == layer.mlp_partial == deferred for layer in layers)
        assert all(layer.self_attn.defer_reduce == layer.mlp.defer_reduce == deferred for layer in layers)


@pytest.mark.parametrize("ep", [False, True])
def test_a_moe_block_hands_its_partial_sums_to_the_norm_and_they_add_up(ep, monkeypatch):
    """Over 2 ranks a Qwen3-MoE block's output is its rank's partial sums (the next norm all-reduces them), and the
    ranks' outputs add up to the whole block's; with one rank it is the whole output."""
    from moe_checks import one_layer_qwen3_moe
    from atom_aot.weights.shard import shard_state_dict
    from atom_aot.models import model_class, parallel
    from atom_aot.models.parallel import Split
    cfg, whole = one_layer_qwen3_moe()
    assert not whole.model.layers[0].mlp_partial and not whole.model.layers[0].mlp.defer_reduce
    hidden = torch.randn(5, 32)
    expected = whole.model.layers[0].mlp(hidden)
    calls = []
    monkeypatch.setattr(parallel, "all_reduce", lambda x: calls.append(x) or x)
    partial_sums = []
    for rank in range(2):
        with torch.device("meta"):
            part = model_class(cfg.architecture)(cfg, torch.float32, split=Split(2, ep))
        part.load_state_dict(shard_state_dict(whole.state_dict(), cfg, Split(2, ep), rank), assign=True)
        layer = part.model.layers[0]
        assert layer.mlp_partial and layer.mlp.defer_reduce
        partial_sums.append(layer.mlp(hidden))
    assert calls == []                                   # the block itself all-reduced nothing
    torch.testing.assert_close(partial_sums[0] + partial_sums[1], expected, rtol=1e-5, atol=1e-5)


def test_a_package_that_reads_a_peer_table_is_bound_to_the_process_table():
    """The table is the runtime's (runtime/loading/compiled.py): never a stored weight, always the one tensor that
    registering a group refills, so the package and atom::all_reduce_unless_fused agree."""
    from atom_aot.runtime.loading.compiled import CompiledModel

    class Loader:
        def get_constant_fqns(self):
            return ["model.embed_tokens.weight", "model.all_reduce_peers"]

        def load_constants(self, constants, *flags):
            self.bound = constants
    compiled = CompiledModel.__new__(CompiledModel)
    compiled._loader, compiled.device = Loader(), torch.device("cpu")
    weight = torch.randn(4, 2)
    compiled.bind({"model.embed_tokens.weight": weight, "unused": weight})
    bound = compiled._loader.bound
    assert set(bound) == {"model.embed_tokens.weight", "model.all_reduce_peers"}
    assert bound["model.all_reduce_peers"] is collectives.peer_table(torch.device("cpu"))
    assert bound["model.all_reduce_peers"].tolist() == peer_table.empty_table()
