"""torch.export of a step that calls the atom_triton ops: what AOTInductor will be handed.

Runs in a subprocess without TRITON_INTERPRET (export traces the kernels on fake tensors and never
launches them, so no GPU is needed). Checks that
- the tuned launch configs are plain int arguments in the exported graph (token count, batch,
  block-table width and KV pool size all dynamic);
- with the triton ops decomposed (what AOTInductor does), every kernel launch is a
  `triton_kernel_wrapper_functional` whose grid is an expression of the dynamic token count
  and batch size, and nothing reads a tensor value on the host (no `.item()`).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = r'''
import torch
from torch.export import Dim, export
import atom_aot.ops.triton  # noqa: F401  registers atom_triton::*

class Step(torch.nn.Module):
    def forward(self, q, k, v, positions, cos_sin, q_w, k_w, kv_cache, slots, block_tables, seq_lens, starts):
        q = torch.ops.atom_triton.qk_norm_rope_cache_write(q, k, v, positions, cos_sin, q_w, k_w, 1e-6,
                                                           kv_cache, 1, slots, 4, 4)
        return torch.ops.atom_triton.paged_attention(q, kv_cache, 1, block_tables, seq_lens, starts, 0.125,
                                                     16, 64, 8, 4, 2)

T, B, H, HKV, D = 7, 3, 4, 2, 64
args = (torch.randn(T, H, D), torch.randn(T, HKV, D), torch.randn(T, HKV, D), torch.zeros(T, dtype=torch.int64),
        torch.randn(32, D), torch.randn(D), torch.randn(D), torch.randn(2, 2, 10, 16, HKV, D),
        torch.zeros(T, dtype=torch.int64), torch.zeros(B, 4, dtype=torch.int32), torch.ones(B, dtype=torch.int32),
        torch.arange(B + 1, dtype=torch.int32))
t, b, w = Dim("T", min=2, max=8192), Dim("B", min=2, max=512), Dim("W", min=2, max=1024)
blocks = Dim("num_blocks", min=2)   # the KV pool is sized at run time
tok = {0: t}
dynamic = (tok, tok, tok, tok, None, None, None, {2: blocks}, tok, {0: b, 1: w}, {0: b}, {0: b + 1})
ep = export(Step(), args, dynamic_shapes=dynamic)
calls = [n for n in ep.graph.nodes if n.op == "call_function" and "atom_triton" in str(n.target)]
print("OPS", sorted({str(n.target) for n in calls}))
attention = next(n for n in calls if "paged_attention" in str(n.target))
print("ATTENTION_CONFIG", list(attention.args[-5:]))

decomposed = ep.run_decompositions(decompose_custom_triton_ops=True)
launches = [n for n in decomposed.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
for n in launches:
    kernel = kernel_side_table.get_kernel(n.kwargs["kernel_idx"])
    while not hasattr(kernel, "arg_names") or not hasattr(kernel, "fn") or hasattr(kernel, "configs"):
        kernel = kernel.fn
    grid = n.kwargs["grid"][0]
    symbolic = [str(g) for g in grid if not isinstance(g, int)]
    print("LAUNCH", kernel.fn.__name__, "symbolic_grid" if symbolic else "static_grid")
reads = [n for n in decomposed.graph.nodes if "_local_scalar_dense" in str(n.target)]   # what .item() becomes
print("HOST_READS", len(reads))
'''


def test_export_carries_configs_and_shape_only_grids():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    ops = next(line for line in lines if line.startswith("OPS"))
    for name in ("paged_attention", "qk_norm_rope_cache_write"):
        assert f"atom_triton.{name}.default" in ops
    assert "ATTENTION_CONFIG [16, 64, 8, 4, 2]" in lines
    launches = [line.split()[1:] for line in lines if line.startswith("LAUNCH")]
    kernels = {name for name, _ in launches}
    assert kernels == {"qk_norm_rope_cache_write_kernel", "paged_attention_kernel", "merge_splits_kernel"}
    # every launch scales with the dynamic token count (none was specialized to the example's T)
    assert all(kind == "symbolic_grid" for _, kind in launches), launches
    assert "HOST_READS 0" in lines
