"""Export the model once with torch.export and compile it with AOTInductor.

The package holds code only (`package_constants_in_so=False`): weights live in
`weights/rank{r}.safetensors` and are handed to the compiled model at load, so they are stored
once and memory-mapped. The token count, batch size, block-table width, KV pool size and number
of logits rows are dynamic, so one package serves every batch. Attention stays a call to the
`atom::paged_attention` custom op, which the runtime registers before loading.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.export import Dim

from atom_aot.models.decoder import DecoderForCausalLM

MAX_TOKENS_PER_STEP = 1 << 16
MAX_SEQS = 1 << 12
MAX_KV_BLOCKS = 1 << 24


def example_inputs(model: DecoderForCausalLM, kv_dtype: torch.dtype, block_size: int, device: torch.device):
    """Small inputs whose dynamic sizes are pairwise distinct and >= 2, so none gets specialized."""
    cfg = model.config
    num_tokens, num_seqs, max_blocks, num_blocks = 11, 3, 5, 37
    kv_cache = torch.zeros(cfg.num_hidden_layers, 2, num_blocks, block_size, cfg.num_key_value_heads,
                           cfg.head_dim, dtype=kv_dtype, device=device)
    counts = [5, 4, 2]
    starts = torch.tensor([0, 5, 9, 11], dtype=torch.int32, device=device)
    positions = torch.cat([torch.arange(n) for n in counts]).to(device)
    block_tables = torch.arange(num_seqs * max_blocks, dtype=torch.int32, device=device).view(num_seqs, max_blocks)
    slots = torch.cat([block_tables[b, p // block_size].long() * block_size + p % block_size
                       for b, n in enumerate(counts) for p in [torch.arange(n, device=device)]])
    return (
        torch.randint(0, cfg.vocab_size, (num_tokens,), device=device),
        positions, kv_cache, slots, block_tables,
        torch.tensor(counts, dtype=torch.int32, device=device), starts,
        torch.tensor([4, 10], dtype=torch.int64, device=device),
    )


def dynamic_shapes(max_model_len: int, block_size: int) -> tuple:
    tokens = Dim("num_tokens", min=1, max=MAX_TOKENS_PER_STEP)
    seqs = Dim("num_seqs", min=1, max=MAX_SEQS)
    blocks_per_seq = Dim("max_blocks_per_seq", min=1, max=max_model_len // block_size + 1)
    kv_blocks = Dim("num_kv_blocks", min=2, max=MAX_KV_BLOCKS)
    logits_rows = Dim("num_logits", min=1, max=MAX_TOKENS_PER_STEP)
    return ({0: tokens}, {0: tokens}, {2: kv_blocks}, {0: tokens}, {0: seqs, 1: blocks_per_seq},
            {0: seqs}, {0: seqs + 1}, {0: logits_rows})


def export_model(model: DecoderForCausalLM, kv_dtype: torch.dtype, block_size: int, max_model_len: int,
                 device: torch.device) -> torch.export.ExportedProgram:
    """Trace `model` (real weights, on `device`) with the dynamic dimensions above."""
    args = example_inputs(model, kv_dtype, block_size, device)
    with torch.no_grad():
        return torch.export.export(model, args, dynamic_shapes=dynamic_shapes(max_model_len, block_size))


def compile_package(exported: torch.export.ExportedProgram, out_path: Path) -> Path:
    """AOTInductor-compile the exported program into a code-only package at `out_path`."""
    import torch._inductor
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch._inductor.aoti_compile_and_package(
        exported, package_path=str(out_path),
        inductor_configs={"aot_inductor.package_constants_in_so": False})
    return out_path
