"""One rank's weights from the whole model's (tensor parallelism, Megatron layout).

Works on the converted state dict (runtime names, qkv and gate_up already fused, quantized where
asked), so fusing and quantizing stay in weights.py; the result for rank r matches, name for name
and shape for shape, the state dict of the model built with `tp` ranks, which the runtime of rank
r loads with a plain assign. Which rows and columns a rank holds is models/parallel.py's layout.
"""
from __future__ import annotations

from typing import Iterable

import torch

from atom_aot.models.config import ModelConfig
from atom_aot.models.parallel import Split, local_kv_heads, vocab_shard_size
from atom_aot.ops.fp8 import BLOCK as FP8_BLOCK

ROW_PARALLEL = ("o_proj", "down_proj")          # input columns of the weight split; scales per output row kept
VOCAB_PARALLEL = ("embed_tokens", "lm_head")    # vocabulary rows split, padded to a multiple of tp
VOCAB_START = "model.embed_tokens.vocab_start"
HEAD_ROWS = ("q_b_proj", "q_proj")          # latent attention's query projections: rows head by head
PER_HEAD = ("w_uk", "w_uv")                 # its per-head up-projections [H, ...]
WHOLE_PREFIX = "mtp."                       # the MTP layers' own embedding and head stay whole
EXPERT_START = "expert_start"                   # under --ep, each MoE layer's first expert on the rank
EXPERT_STACKS = ("w13", "w2", "w13_scale", "w2_scale", "w13_bias", "w2_bias")   # stacks, fp8 scales, biases
PER_QUERY_HEAD = ("sinks",)                 # one value per attention head [H]: this rank's heads'


def shard_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig, split: Split,
                     rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s tensors of `state` (the one-rank model's), contiguous and owning their memory."""
    return shard_tensors(state.items(), cfg, split, rank)


def shard_tensors(tensors: Iterable[tuple[str, torch.Tensor]], cfg: ModelConfig, split: Split,
                  rank: int) -> dict[str, torch.Tensor]:
    """shard_state_dict of a stream: each whole tensor can be dropped once its part is taken, so a caller
    that draws the model (weights drawn at load) holds the rank's part, not the whole model.

    Column-parallel qkv and gate_up split their output rows (weights, biases, per-row scales);
    row-parallel o_proj and down_proj split their input columns, and their biases stay on rank 0 (zero on the
    others: the partial sums add them once); attention sinks split with their heads; stacked experts split each
    expert's width, or with `ep` hand out whole experts; anything else a rank holds whole (norms, the rotary
    table, scalar scales, the router). With data-parallel attention (`dp` ranks, tp 1) a rank holds everything
    whole but its E/dp experts."""
    tp, ep = split.tp, split.ep
    out = {}
    for name, tensor in tensors:
        module, param = name.split(".")[-2:]
        if module == "experts" and param in EXPERT_STACKS:
            out.update(_expert_part(name, tensor, tp, rank, ep, split.world_size))
            continue
        if tp == 1:
            part = tensor
        elif module == "qkv_proj" and _per_row(tensor, cfg, module):
            part = _qkv_rows(tensor, cfg, tp, rank)
        elif param == "weight_scale" and tensor.dim() == 2:
            part = _block_scale_part(tensor, module, name, cfg, tp, rank)
        elif (module in HEAD_ROWS and _per_row(tensor, cfg, module)) or param in PER_HEAD:
            part = tensor.chunk(tp)[rank]          # latent attention: this rank's heads' query rows, W_UK / W_UV
        elif module == "gate_up_proj" and _per_row(tensor, cfg, module, name):
            part = torch.cat([half.chunk(tp)[rank] for half in tensor.chunk(2)])    # [gate_r; up_r]
        elif module in ROW_PARALLEL and param == "weight":
            part = tensor.chunk(tp, dim=1)[rank]
        elif module in ROW_PARALLEL and param == "bias":
            part = tensor if rank == 0 else torch.zeros_like(tensor)
        elif param in PER_QUERY_HEAD:
            part = tensor.chunk(tp)[rank]
        elif module in VOCAB_PARALLEL and not name.startswith(WHOLE_PREFIX):
            part = _vocab_rows(tensor, tp, rank)
        else:
            part = tensor
        out[name] = part.contiguous().clone()
    if tp > 1:
        out[VOCAB_START] = torch.tensor(rank * vocab_shard_size(cfg.vocab_size, tp), dtype=torch.int64)
    return out


def _expert_part(name: str, stacked: torch.Tensor, tp: int, rank: int, ep: bool,
                 ranks: int) -> dict[str, torch.Tensor]:
    """Rank's part of a stacked expert weight (w13 [E, 2I, H] = [gate; up] per expert, w2 [E, H, I]), of its
    scales (ops/expert_formats.py) or biases (w13_bias [E, 2I], w2_bias [E, H]): experts [r*E/ranks, (r+1)*E/ranks)
    whole under `ep` (and where they start), else every expert's width columns r of tp (w13, its scales and bias: of
    gate and of up, kept [gate_r; up_r]; w2: its input columns, and its block or mxfp4 scales' K blocks with them,
    its row scales whole; w2's bias on rank 0 alone, zeros elsewhere: the ranks' partial sums add it once)."""
    if ep:
        count = stacked.shape[0] // ranks
        start = name.rsplit(".", 1)[0] + "." + EXPERT_START
        return {name: stacked[rank * count:(rank + 1) * count].contiguous().clone(),
                start: torch.tensor(rank * count, dtype=torch.int64)}
    if name.endswith(("w13", "w13_scale", "w13_bias")):
        part = torch.cat([half.chunk(tp, dim=1)[rank] for half in stacked.chunk(2, dim=1)], dim=1)
    elif name.endswith("w2_bias"):
        part = stacked if rank == 0 else torch.zeros_like(stacked)
    elif name.endswith("w2_scale"):
        part = stacked.chunk(tp, dim=2)[rank] if stacked.dim() == 3 else stacked    # block scales: K blocks
    else:
        part = stacked.chunk(tp, dim=2)[rank]
    return {name: part.contiguous().clone()}


def _block_scale_part(scale: torch.Tensor, module: str, name: str, cfg: ModelConfig, tp: int,
                      rank: int) -> torch.Tensor:
    """Rank's part of a linear's 128x128 block scales [N/128, K/128], where its weight splits on block
    boundaries (pipeline.py checks block_split_problem first): rows for column-parallel linears, columns
    for row-parallel ones, whole otherwise."""
    if module in HEAD_ROWS:
        return scale.chunk(tp)[rank]
    if module == "gate_up_proj":
        return torch.cat([half.chunk(tp)[rank] for half in scale.chunk(2)])
    if module in ROW_PARALLEL:
        return scale.chunk(tp, dim=1)[rank]
    if module == "qkv_proj":        # [q | k | v] in blocks: a head is head_dim / 128 block rows
        return _qkv_rows(scale, cfg, tp, rank, FP8_BLOCK)
    return scale


def _per_row(tensor: torch.Tensor, cfg: ModelConfig, module: str, name: str = "") -> bool:
    """Whether `tensor` has one entry per output row of `module` (a scalar scale has not)."""
    if module == "gate_up_proj":
        shared = ".shared_experts." in name          # DeepSeek's / GLM's shared experts have their own width
        rows = 2 * (cfg.grouped_moe.shared_width(cfg.moe_intermediate_size) if shared else cfg.intermediate_size)
    elif module in HEAD_ROWS:
        rows = cfg.num_attention_heads * cfg.deepseek.qk_head_dim
    else:
        rows = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    return tensor.dim() >= 1 and tensor.shape[0] == rows


def _qkv_rows(tensor: torch.Tensor, cfg: ModelConfig, tp: int, rank: int, unit: int = 1) -> torch.Tensor:
    """The rows of rank's query heads and of the KV heads they read (replicated when Hkv < tp); `unit`: weight
    rows per tensor row (128 for block scales, whose rows are blocks: block_split_problem keeps the parts whole)."""
    d, heads, kv_heads = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    q, k, v = tensor.split([heads * d // unit, kv_heads * d // unit, kv_heads * d // unit])
    q_per_rank, kv_per_rank = heads // tp, local_kv_heads(cfg, tp)
    first_kv = rank * kv_heads // tp if kv_heads >= tp else rank // (tp // kv_heads)
    q_rows = slice(rank * q_per_rank * d // unit, (rank + 1) * q_per_rank * d // unit)
    kv_rows = slice(first_kv * d // unit, (first_kv + kv_per_rank) * d // unit)
    return torch.cat([q[q_rows], k[kv_rows], v[kv_rows]])


def _vocab_rows(weight: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    rows = vocab_shard_size(weight.shape[0], tp)
    padded = torch.zeros(rows * tp, *weight.shape[1:], dtype=weight.dtype, device=weight.device)
    padded[:weight.shape[0]] = weight
    return padded[rank * rows:(rank + 1) * rows]


def check_like(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], rank: int) -> None:
    """ValueError unless `state` has exactly `expected`'s names, shapes and dtypes (a meta state dict)."""
    if set(state) != set(expected):
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise ValueError(f"rank {rank}'s weights do not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for name, meta in expected.items():
        if state[name].shape != meta.shape or state[name].dtype != meta.dtype:
            raise ValueError(f"rank {rank}: {name} is {tuple(state[name].shape)} {state[name].dtype}, the model "
                             f"has {tuple(meta.shape)} {meta.dtype}")
