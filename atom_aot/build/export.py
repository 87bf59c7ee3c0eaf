"""Export the model once with torch.export and compile it with AOTInductor.

The package holds code only (`package_constants_in_so=False`): weights live in
`weights/rank{r}.safetensors` and are handed to the compiled model at load, so they are stored
once and memory-mapped. The token count, batch size, block-table width, KV pool size and number
of logits rows are dynamic. One package per phase: `mixed` serves any batch; on GPUs a `decode`
package (one new token per sequence) carries the decode kernel configs and is what the runtime
replays in CUDA graphs. Attention stays a call to the
`atom::paged_attention` custom op, which the runtime registers before loading.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import torch
from torch.export import Dim

from atom_aot.models.decoder import DecoderForCausalLM

MAX_TOKENS_PER_STEP = 1 << 16
MAX_SEQS = 1 << 12
MAX_KV_BLOCKS = 1 << 24


def example_inputs(model: DecoderForCausalLM, kv_dtype: torch.dtype, block_size: int, device: torch.device,
                   phase: str):
    """Small inputs whose dynamic sizes are pairwise distinct and >= 2, so none gets specialized.

    `mixed`: 3 sequences computing 5, 4 and 2 tokens (11 in all), 2 of them sampling.
    `decode`: 3 sequences computing one token each, all sampling (tokens = sequences = logits rows).
    """
    cfg = model.config
    num_blocks, max_blocks = 37, 5
    kv_cache = torch.zeros(cfg.num_hidden_layers, 2, num_blocks, block_size, cfg.num_key_value_heads,
                           cfg.head_dim, dtype=kv_dtype, device=device)
    counts, context = ([5, 4, 2], [5, 4, 2]) if phase == "mixed" else ([1, 1, 1], [6, 19, 2])
    block_tables = torch.arange(len(counts) * max_blocks, dtype=torch.int32, device=device).view(len(counts), -1)
    positions = torch.cat([torch.arange(c - n, c) for n, c in zip(counts, context)]).to(device)
    rows = torch.repeat_interleave(torch.arange(len(counts), device=device), torch.tensor(counts, device=device))
    slots = block_tables[rows, positions // block_size].long() * block_size + positions % block_size
    starts = torch.tensor([0] + list(itertools.accumulate(counts)), dtype=torch.int32, device=device)
    ends = (starts[1:] - 1).long()
    logits_rows = ends[:2] if phase == "mixed" else ends
    return (torch.randint(0, cfg.vocab_size, (sum(counts),), device=device), positions, kv_cache, slots,
            block_tables, torch.tensor(context, dtype=torch.int32, device=device), starts, logits_rows)


def dynamic_shapes(max_model_len: int, block_size: int, phase: str) -> tuple:
    seqs = Dim("num_seqs", min=1, max=MAX_SEQS)
    tokens = seqs if phase == "decode" else Dim("num_tokens", min=1, max=MAX_TOKENS_PER_STEP)
    logits_rows = seqs if phase == "decode" else Dim("num_logits", min=1, max=MAX_TOKENS_PER_STEP)
    blocks_per_seq = Dim("max_blocks_per_seq", min=1, max=max_model_len // block_size + 1)
    kv_blocks = Dim("num_kv_blocks", min=2, max=MAX_KV_BLOCKS)
    return ({0: tokens}, {0: tokens}, {2: kv_blocks}, {0: tokens}, {0: seqs, 1: blocks_per_seq},
            {0: seqs}, {0: seqs + 1}, {0: logits_rows})


def export_model(model: DecoderForCausalLM, kv_dtype: torch.dtype, block_size: int, max_model_len: int,
                 device: torch.device, phase: str = "mixed") -> torch.export.ExportedProgram:
    """Trace `model` (real weights, on `device`) with the dynamic dimensions of `phase`."""
    args = example_inputs(model, kv_dtype, block_size, device, phase)
    with torch.no_grad():
        return torch.export.export(model, args, dynamic_shapes=dynamic_shapes(max_model_len, block_size, phase))


def compile_package(exported: torch.export.ExportedProgram, out_path: Path) -> Path:
    """AOTInductor-compile the exported program into a code-only package at `out_path`."""
    import torch._inductor
    from atom_aot.build.cxx import wrapper_compiler
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with torch._inductor.config.patch({"cpp.cxx": (wrapper_compiler()["cxx"],)}):
        torch._inductor.aoti_compile_and_package(
            exported, package_path=str(out_path),
            inductor_configs={"aot_inductor.package_constants_in_so": False})
    return out_path
