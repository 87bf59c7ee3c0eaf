"""torch.export of a MoE block that calls atom_triton::fused_moe with a three-bucket config table.

Runs in a subprocess without TRITON_INTERPRET (export traces on fake tensors and launches nothing).
Checks that the table stays an int argument of the op; that decomposed (as AOTInductor compiles
it) every launch's grid is an expression of the dynamic token count and nothing reads a tensor on
the host (no .item(), so CUDA graphs capture it); and that the graph, run at several token counts
with launches recorded, gives programs only to the kernels of the bucket that T falls in, with the
tile bound min(T*k, cdiv(T*k + E*(BLOCK_M-1), BLOCK_M)) x column tiles. A whole tiny Qwen3-MoE with the triton
moe backend exports the same way in both phases (mixed and decode).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
E, K, H, I = 6, 3, 64, 48
# first token count, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages
TABLE = [1, 16, 16, 32, 1, 2, 2, 4, 32, 32, 32, 4, 4, 2, 16, 64, 64, 32, 8, 4, 3]
TOKENS = (1, 3, 4, 15, 16, 40)

SCRIPT = r'''
import json, sys
import torch
from torch.export import Dim, export
import atom_aot.ops.triton  # noqa: F401  registers atom_triton::*
from export_recording import RecordingInterpreter, host_reads, launch_kinds

E, K, H, I, TABLE, TOKENS = json.loads(sys.argv[1])

class Block(torch.nn.Module):
    def forward(self, x, w13, w2, weights, ids):
        return torch.ops.atom_triton.fused_moe(x, w13, w2, weights, ids, TABLE)

def inputs(tokens):
    return (torch.randn(tokens, H), torch.randn(E, 2 * I, H), torch.randn(E, H, I), torch.rand(tokens, K),
            torch.randint(0, E, (tokens, K), dtype=torch.int32))

t = Dim("T", min=1, max=8192)
ep = export(Block(), inputs(7), dynamic_shapes=({0: t}, None, None, {0: t}, {0: t}))
op = next(n for n in ep.graph.nodes if "fused_moe" in str(n.target))
print("TABLE", json.dumps(list(op.args[-1])))
decomposed = ep.run_decompositions(decompose_custom_triton_ops=True)
print("LAUNCHES", json.dumps(launch_kinds(decomposed)))
print("HOST_READS", host_reads(decomposed))
for tokens in TOKENS:
    graph = RecordingInterpreter(decomposed.graph_module)
    graph.run(*inputs(tokens))
    print("RUN", json.dumps({"tokens": tokens, "launches": [(l["kernel"], l["grid"][0], l["args"].get("BLOCK_M"))
                                                            for l in graph.launches]}))
'''


MODEL_SCRIPT = r'''
import torch
from model_factories import TINY_QWEN3, tiny_model
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
from atom_aot.build.export import export_model
from export_recording import host_reads, launch_kinds

import sys
quant = sys.argv[1]
mxfp4 = quant == "mxfp4"       # its scale blocks want widths and K steps in multiples of 32
model = tiny_model(quant=quant, **dict(TINY_QWEN3, architectures=["Qwen3MoeForCausalLM"], num_experts=5,
                                       num_experts_per_tok=3, moe_intermediate_size=64 if mxfp4 else 48,
                                       mlp_only_layers=[0]))
moe = BackendChoice("triton", {"fused_moe@1": (16, 16, 32, 1, 2, 1),
                               "fused_moe@8": (32, 32, 32 if mxfp4 else 16, 2, 4, 2)})
model.use_kernels(PhaseTuning({"attention": BackendChoice("reference"), "moe": moe, "fp8_linear": BackendChoice("aten")}))
assert (model.model.layers[1].mlp.experts.w13_scale is not None) == (quant != "none")
for phase in (Phase.MIXED, Phase.DECODE):
    decomposed = export_model(model, torch.float32, 16, 128, torch.device("cpu"), phase).run_decompositions(
        decompose_custom_triton_ops=True)
    kinds = launch_kinds(decomposed)
    grouped = [symbolic for name, symbolic in kinds if name in ("moe_gate_up_kernel", "moe_down_kernel")]
    sorts = [symbolic for name, symbolic in kinds if name == "sort_by_expert_kernel"]
    routers = [symbolic for name, symbolic in kinds if name == "softmax_topk_kernel"]
    print("PHASE", phase.value, len(kinds), len(grouped), all(grouped), len(sorts), any(sorts), len(routers), all(routers),
          host_reads(decomposed))
'''


ROUTER_SCRIPT = r'''
import torch
from torch.export import Dim, export
import atom_aot.ops.triton  # noqa: F401  registers atom_triton::*
from export_recording import host_reads, launch_kinds

class Routers(torch.nn.Module):
    def forward(self, logits, bias):
        w1, i1 = torch.ops.atom_triton.softmax_topk(logits, 8, True)
        w2, i2 = torch.ops.atom_triton.grouped_sigmoid_topk(logits, bias, 8, 4, 8, True, 2.5)
        return w1 + w2, i1 + i2

t = Dim("T", min=1, max=8192)
ep = export(Routers(), (torch.randn(7, 64), torch.randn(64)), dynamic_shapes=({0: t}, None))
decomposed = ep.run_decompositions(decompose_custom_triton_ops=True)
print("ROUTERS", launch_kinds(decomposed), host_reads(decomposed))
'''


def run_script(script: str, *args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.splitlines()


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return run_script(SCRIPT, json.dumps([E, K, H, I, TABLE, TOKENS]))


@pytest.mark.parametrize("quant", ["none", "fp8", "mxfp4"])
def test_whole_moe_model_exports_in_both_phases(quant):
    """A tiny Qwen3-MoE (one dense, one MoE layer) with the triton moe backend: 2 buckets x 2 kernels per
    phase, all symbolic in T, beside one sort by expert (E + 1 programs whatever T) and the router's kernel (a
    program per token), no host reads; with fp8 experts (e4m3 stacks and their row scales) and mxfp4 experts
    (packed stacks and e8m0 scales) too."""
    assert [line for line in run_script(MODEL_SCRIPT, quant) if line.startswith("PHASE")] == [
        "PHASE mixed 6 4 True 1 False 1 True 0", "PHASE decode 6 4 True 1 False 1 True 0"]


def cdiv(a, b):
    return -(-a // b)


def test_export_keeps_table_and_symbolic_grids(lines):
    assert f"TABLE {json.dumps(TABLE)}" in lines
    launches = json.loads(next(line for line in lines if line.startswith("LAUNCHES"))[9:])
    assert [name for name, _ in launches] == ["sort_by_expert_kernel"] + ["moe_gate_up_kernel"] * 3 + ["moe_down_kernel"] * 3
    assert not launches[0][1] and all(symbolic for _, symbolic in launches[1:]), launches
    assert "HOST_READS 0" in lines


def test_each_token_count_runs_only_its_bucket(lines):
    runs = {run["tokens"]: run["launches"] for run in (json.loads(line[4:]) for line in lines if line.startswith("RUN "))}
    assert set(runs) == set(TOKENS)
    buckets = [(1, 16, 16), (4, 32, 32), (16, 64, 64)]     # (first tokens, BLOCK_M, BLOCK_N)
    for tokens, launches in runs.items():
        active = max(i for i, (first, _, _) in enumerate(buckets) if tokens >= first)
        assert launches[0][:2] == ["sort_by_expert_kernel", E + 1]
        for i, (_, block_m, block_n) in enumerate(buckets):
            gate_up, down = launches[1 + i], launches[1 + len(buckets) + i]     # the gate_ups, then the downs
            assert gate_up[2] == down[2] == block_m
            slots = tokens * K
            tiles = min(slots, cdiv(slots + E * (block_m - 1), block_m))
            expected = (tiles * cdiv(I, block_n), tiles * cdiv(H, block_n)) if i == active else (0, 0)
            assert (gate_up[1], down[1]) == expected, (tokens, i)


def test_both_routers_export_with_a_program_per_token():
    """The routers' kernels (Qwen3-MoE / Mixtral softmax top-k, DeepSeek's grouped sigmoid top-k) export with a
    grid of T (symbolic) and no host reads."""
    assert run_script(ROUTER_SCRIPT)[-1] == "ROUTERS [('softmax_topk_kernel', True), ('grouped_sigmoid_topk_kernel', True)] 0"
