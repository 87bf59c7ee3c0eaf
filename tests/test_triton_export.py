"""torch.export of a step that calls the atom_triton ops: what AOTInductor will be handed.

Runs in a subprocess without TRITON_INTERPRET (export traces the kernels on fake tensors and never
launches them, so no GPU is needed). Checks that
- the tuned launch configs are plain int arguments in the exported graph (token count, batch,
  block-table width and KV pool size all dynamic);
- with the triton ops decomposed (what AOTInductor does), every kernel launch is a
  `triton_kernel_wrapper_functional` whose grid is an expression of the dynamic token count
  and batch size, and nothing reads a tensor value on the host (no `.item()`);
- run on decode batches of 1 .. 300 sequences (kernel launches recorded, not made), that graph
  computes from the sizes alone the same launches as the eager op: the key-split count, the
  grids and the workspace shapes follow the batch. The eager op's results at those batch sizes
  are checked against the reference in test_triton_attention.py.
On a GPU, the same attention graph is AOTInductor-compiled once and run, and replayed in CUDA
graphs, at batches that split their keys differently.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from triton_kernel_checks import rel_error  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DECODE_CONFIG = (16, 16, 4, 2, 48, 16)    # block_m, block_n, num_warps, num_stages, target_programs, max_splits
DECODE_BATCHES = {1: 16, 3: 8, 12: 2, 64: 1, 300: 1}   # batch -> key splits (Hkv = 2: ceil(48 / 2B), at most 16)

SCRIPT = r'''
import json
import sys
import torch
from torch.export import Dim, export
import atom_aot.ops.triton  # noqa: F401  registers atom_triton::*
from atom_aot.ops.triton import paged_attention as attention_module
from triton_aot_check import record_launches
from export_recording import RecordingInterpreter, describe, host_reads, launch_kinds

CONFIG, BATCHES = json.loads(sys.argv[1]), json.loads(sys.argv[2])

class Step(torch.nn.Module):
    def forward(self, q, k, v, positions, cos_sin, q_w, k_w, kv_cache, slots, block_tables, seq_lens, starts):
        q = torch.ops.atom_triton.qk_norm_rope_cache_write(q, k, v, positions, cos_sin, q_w, k_w, 1e-6,
                                                           kv_cache, 1, slots, 4, 4)
        return torch.ops.atom_triton.paged_attention(q, kv_cache, 1, block_tables, seq_lens, starts, 0.125, *CONFIG)

H, HKV, D = 4, 2, 64

def step_inputs(num_tokens, num_seqs, num_blocks=10, width=4):
    T, B = num_tokens, num_seqs
    return (torch.randn(T, H, D), torch.randn(T, HKV, D), torch.randn(T, HKV, D), torch.zeros(T, dtype=torch.int64),
            torch.randn(32, D), torch.randn(D), torch.randn(D), torch.randn(2, 2, num_blocks, 16, HKV, D),
            torch.zeros(T, dtype=torch.int64), torch.zeros(B, width, dtype=torch.int32),
            torch.ones(B, dtype=torch.int32), torch.arange(B + 1, dtype=torch.int32))

t, b, w = Dim("T", min=1, max=8192), Dim("B", min=1, max=512), Dim("W", min=2, max=1024)
blocks = Dim("num_blocks", min=2)   # the KV pool is sized at run time
tok = {0: t}
dynamic = (tok, tok, tok, tok, None, None, None, {2: blocks}, tok, {0: b, 1: w}, {0: b}, {0: b + 1})
ep = export(Step(), step_inputs(7, 3), dynamic_shapes=dynamic)
calls = [n for n in ep.graph.nodes if n.op == "call_function" and "atom_triton" in str(n.target)]
print("OPS", sorted({str(n.target) for n in calls}))
attention = next(n for n in calls if "paged_attention" in str(n.target))
print("ATTENTION_CONFIG", list(attention.args[-len(CONFIG):]))

decomposed = ep.run_decompositions(decompose_custom_triton_ops=True)
for name, symbolic in launch_kinds(decomposed):
    print("LAUNCH", name, "symbolic_grid" if symbolic else "static_grid")
print("HOST_READS", host_reads(decomposed))

for batch in BATCHES:   # decode: one token per sequence
    inputs = step_inputs(batch, batch, num_blocks=5 + batch, width=3)
    graph = RecordingInterpreter(decomposed.graph_module)
    graph.run(*inputs)
    q, kv_cache, tables, lens, starts = torch.empty(batch, H, D), inputs[7], inputs[9], inputs[10], inputs[11]
    eager = record_launches(attention_module, attention_module.launch_paged_attention,
                            q, kv_cache, 1, tables, lens, starts, 0.125, *CONFIG)
    attention_kernels = ("paged_attention_kernel", "merge_splits_kernel")
    print("RUN", json.dumps({"batch": batch,
                             "graph": [l for l in graph.launches if l["kernel"] in attention_kernels],
                             "eager": [describe(l.kernel, l.grid, l.args) for l in eager]}))
'''


def run_export_script() -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(DECODE_CONFIG), json.dumps(list(DECODE_BATCHES))],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.splitlines()


@pytest.fixture(scope="module")
def export_lines() -> list[str]:
    return run_export_script()


def test_export_carries_configs_and_shape_only_grids(export_lines):
    lines = export_lines
    ops = next(line for line in lines if line.startswith("OPS"))
    for name in ("paged_attention", "qk_norm_rope_cache_write"):
        assert f"atom_triton.{name}.default" in ops
    assert f"ATTENTION_CONFIG {list(DECODE_CONFIG)}" in lines
    launches = [line.split()[1:] for line in lines if line.startswith("LAUNCH")]
    kernels = {name for name, _ in launches}
    assert kernels == {"qk_norm_rope_cache_write_kernel", "paged_attention_kernel", "merge_splits_kernel"}
    # every launch scales with the dynamic token count / batch (none was specialized to the example's)
    assert all(kind == "symbolic_grid" for _, kind in launches), launches
    assert "HOST_READS 0" in lines


def test_exported_graph_splits_keys_by_the_batch_at_run_time(export_lines):
    runs = {run["batch"]: run for run in (json.loads(line[4:]) for line in export_lines if line.startswith("RUN "))}
    assert set(runs) == set(DECODE_BATCHES)
    for batch, splits in DECODE_BATCHES.items():
        graph, eager = runs[batch]["graph"], runs[batch]["eager"]
        assert graph == eager, batch      # same kernels, grids, ints and workspace shapes as the eager op
        tile, merge = graph
        assert tile["kernel"] == "paged_attention_kernel" and merge["kernel"] == "merge_splits_kernel"
        assert tile["grid"][2] == tile["args"]["num_splits"] == splits, batch
        assert tile["args"]["part_ptr"][0] == [batch, 4, splits, 64]    # workspace sized by this batch's splits
        # one split: the tile kernel writes the output and the merge launch has no programs
        assert merge["grid"] == [batch if splits > 1 else 0, 4, 1], batch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_aoti_package_splits_by_batch_at_run_time(tmp_path):
    """One AOTInductor package serves batches with 16, 8, 2 and 1 key splits, also replayed in CUDA graphs."""
    from torch.export import Dim, export

    import atom_aot.ops.triton  # noqa: F401  registers atom_triton::*
    from atom_aot.ops.attention import reference_attention
    from atom_aot.ops.triton.batch_inputs import make_paged_batch

    class Attention(torch.nn.Module):
        def forward(self, q, kv_cache, block_tables, seq_lens, starts):
            return torch.ops.atom_triton.paged_attention(q, kv_cache, 1, block_tables, seq_lens, starts, 0.125,
                                                         *DECODE_CONFIG)

    def decode_inputs(batch: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        context = torch.randint(0, 300, (batch,), generator=g).tolist()
        paged = make_paged_batch(context, [1] * batch, 2, 64, dtype=torch.bfloat16, device="cuda", generator=g)
        q = torch.randn(batch, 4, 64, generator=g).to("cuda", torch.bfloat16)
        return q, paged.kv_cache, paged.block_tables, paged.seq_lens, paged.query_start_loc

    seqs = Dim("B", min=1, max=512)
    dynamic = ({0: seqs}, {2: Dim("num_blocks", min=2)}, {0: seqs, 1: Dim("W", min=1, max=1024)}, {0: seqs},
               {0: seqs + 1})
    exported = export(Attention(), decode_inputs(3, 0), dynamic_shapes=dynamic)
    # through the build's compile_package: it picks the wrapper compiler whose libstdc++ the process maps
    # (the GPU image's default CXX makes packages that crash at load, docs/artifact-format.md)
    from atom_aot.build.export import compile_package
    package = tmp_path / "attention.pt2"
    compile_package(exported, package)
    # loaded as the engine loads its packages (runtime/loading/compiled.py): the single-threaded runner, since the
    # thread-safe one queries an event before each call, which is illegal while a CUDA graph is captured
    loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", True, 1, 0)

    def model(*inputs):
        return loader.run(list(inputs))[0]

    def check(out, inputs):
        q, kv_cache, tables, lens, starts = (x.cpu() for x in inputs)
        ref = reference_attention(q.double(), kv_cache[1].double(), tables, lens, starts, 0.125)
        assert rel_error(out.cpu(), ref) < 2e-2

    for batch in DECODE_BATCHES:
        inputs = decode_inputs(batch, batch)
        check(model(*inputs), inputs)
        model(*inputs)     # warm up, then capture: any host sync in the package would fail the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(*inputs)
        lens = inputs[3]
        lens.copy_(torch.randint(1, int(lens.min()) + 1, lens.shape, device="cuda", dtype=torch.int32))
        graph.replay()   # new lengths, same shapes: the captured grid still covers them
        check(out, inputs)
