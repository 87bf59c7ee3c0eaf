"""Tensor parallelism (Megatron layout) as the model code sees it: which part of each layer one
rank holds, and the modules whose forward needs the other ranks.

With `tp` ranks, rank r holds
  - query heads [r*H/tp, (r+1)*H/tp) and the KV heads they read: KV heads [r*Hkv/tp, ...) when
    Hkv >= tp, else the one KV head r // (tp/Hkv), replicated on tp/Hkv ranks;
  - columns r of gate/up (column-parallel: no communication) and the matching input rows of o_proj
    and down_proj (row-parallel: each rank's product is a partial sum, all-reduced);
  - vocabulary rows [r*V'/tp, (r+1)*V'/tp) of the embedding and lm_head, V' = V padded up to a
    multiple of tp (padding rows are zero and their logits are cut off);
  - in a mixture-of-experts layer, either (the default) columns r of every expert's gate/up and the
    matching rows of its down (tensor parallelism inside each expert), or, with expert parallelism
    (`ep`), experts [r*E/tp, (r+1)*E/tp) whole. Either way every rank routes every token (hidden
    states are replicated after attention's all-reduce) and the layer's partial sums are all-reduced
    once: under EP a rank adds only its experts' weighted outputs (others' ids are masked to -1).
With data-parallel attention over `dp` ranks (tp = 1), each rank holds the whole model but experts
[r*E/dp, (r+1)*E/dp), and runs its own sequences: an expert layer gathers every rank's tokens
(all-gather), routes them all, runs its own experts on them and hands each rank back the sums for its
tokens (reduce-scatter). The ranks' steps must have the same token count (runtime/parallel/attention_dp.py pads).
Nothing here depends on r: where the rank matters (the embedding's first row) it is a weight, so
every rank runs the same graph and one compiled package serves them all. tp = 1 builds exactly
the single-device model, with no collective in its graph.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn
import torch.nn.functional as F

from atom_aot.distributed.collectives import (all_gather_columns, all_gather_rows, all_reduce, peer_table,
                                              reduce_scatter_rows)
from atom_aot.distributed.peer_table import BUFFER_NAME as PEER_TABLE_BUFFER
from atom_aot.models.config import ModelConfig
from atom_aot.ops.fp8 import BLOCK as FP8_BLOCK


@dataclasses.dataclass(frozen=True)
class Split:
    """How a model is cut into one rank's part: `tp` tensor-parallel ranks; `ep`: a model's experts spread
    whole over the ranks instead of each split; `dp`: attention data-parallel over dp ranks (tp 1, `ep`),
    each holding everything but E/dp experts. The manifest's Layout says the same for an artifact."""
    tp: int = 1
    ep: bool = False
    dp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.dp

    @classmethod
    def of(cls, layout) -> "Split":
        """The split an artifact's manifest Layout records (artifact/manifest.py)."""
        return cls(layout.tensor_parallel_size, layout.expert_parallel_size > 1, layout.data_parallel_size)


ONE_RANK = Split()


def check_splittable(cfg: ModelConfig, split: Split) -> None:
    """ValueError unless `cfg` splits this way (data-parallel attention: check_attention_data_parallel)."""
    tp, ep = split.tp, split.ep
    if split.dp > 1:
        check_attention_data_parallel(cfg, split)
        return
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if ep and not cfg.num_experts:
        raise ValueError(f"--ep spreads a mixture of experts over the ranks, and {cfg.architecture} has no experts: "
                         f"build without --ep")
    if ep and tp == 1:
        raise ValueError("--ep spreads the experts over the -tp ranks (or the -dp ranks of data-parallel "
                         "attention), and both are 1: give -tp N or -dp N with --ep")
    latent = cfg.deepseek is not None       # latent attention: heads split, the latent whole (no KV heads)
    checks = [(heads % tp, f"num_attention_heads {heads} is not a multiple of tp"),
              (not latent and kv % tp and tp % kv, f"num_key_value_heads {kv} neither divides nor is a multiple of tp"),
              (cfg.intermediate_size % tp, f"intermediate_size {cfg.intermediate_size} is not a multiple of tp"),
              (cfg.num_experts and ep and cfg.num_experts % tp,
               f"num_experts {cfg.num_experts} is not a multiple of tp (--ep gives each rank E/tp experts)"),
              (cfg.num_experts and not ep and cfg.moe_intermediate_size % tp,
               f"moe_intermediate_size {cfg.moe_intermediate_size} is not a multiple of tp (try --ep)")]
    if cfg.grouped_moe is not None:
        shared = cfg.grouped_moe.shared_width(cfg.moe_intermediate_size)
        checks.append((shared % tp, f"the shared experts' width {shared} is not a multiple of tp"))
    problems = [problem for failed, problem in checks if failed]
    if problems:
        raise ValueError(f"this model does not split over tp={tp} tensor-parallel ranks: {'; '.join(problems)}. "
                         f"Build with a -tp that divides its {heads} attention heads.")


def check_attention_data_parallel(cfg: ModelConfig, split: Split) -> None:
    """ValueError unless `cfg` runs with attention data-parallel over `split.dp` ranks: every rank holds the
    whole model but 1/dp of the experts (E/dp whole experts, `ep`), and its own sequences."""
    tp, ep, dp = split.tp, split.ep, split.dp
    problems = []
    if not cfg.num_experts:
        problems.append(f"{cfg.architecture} has no experts, and data-parallel attention exists to spread a "
                        f"mixture of experts (a dense model is replicated at serve time: atom-run ART serve -dp N)")
    if not ep:
        problems.append("the experts must be spread whole over the ranks: add --ep")
    if tp != 1:
        problems.append(f"-tp {tp} with -dp {dp}: attention is either split (-tp) or data-parallel (-dp), "
                        f"not both, in this version")
    if cfg.num_experts and cfg.num_experts % dp:
        problems.append(f"num_experts {cfg.num_experts} is not a multiple of dp (each rank holds E/dp experts)")
    if problems:
        raise ValueError(f"this model does not run with data-parallel attention over dp={dp} ranks: "
                         f"{'; '.join(problems)}")


def block_split_problem(cfg: ModelConfig, split: Split, block: int = FP8_BLOCK) -> str | None:
    """Why a block-scaled fp8 model does not split over `split.tp` ranks on block boundaries (None: it does).
    Each rank's rows of a column-parallel linear and columns of a row-parallel one must be whole blocks
    (a dense model's fused qkv: each of its q, k and v parts, a replicated KV head included)."""
    tp, heads = split.tp, cfg.num_attention_heads
    if cfg.deepseek is None:
        widths = {"the query rows per rank (heads x head_dim / tp)": heads * cfg.head_dim // tp,
                  "the key / value rows per rank (KV heads x head_dim)": local_kv_heads(cfg, tp) * cfg.head_dim,
                  "o_proj's input columns per rank": heads * cfg.head_dim // tp,
                  "the MLP width per rank": cfg.intermediate_size // tp}
    else:
        ds = cfg.deepseek
        widths = {"the query rows per rank (heads x qk_head_dim / tp)": heads * ds.qk_head_dim // tp,
                  "o_proj's input columns per rank (heads x v_head_dim / tp)": heads * ds.v_head_dim // tp,
                  "the dense MLP width per rank": cfg.intermediate_size // tp}
    if cfg.grouped_moe is not None:
        widths["the shared experts' width per rank"] = cfg.grouped_moe.shared_width(cfg.moe_intermediate_size) // tp
    if cfg.num_experts and not split.ep:
        widths["each routed expert's width per rank (try --ep)"] = cfg.moe_intermediate_size // tp
    misaligned = [f"{what} is {n}" for what, n in widths.items() if n % block]
    return f"{'; '.join(misaligned)}, not a multiple of {block}" if misaligned else None


def local_kv_heads(cfg: ModelConfig, tp: int) -> int:
    return max(1, cfg.num_key_value_heads // tp)


def rank_shapes(cfg: ModelConfig, split: Split) -> ModelConfig:
    """The sizes one rank computes (heads, KV heads, MLP width, its experts' count and width; the
    vocabulary stays whole, since token ids and logits are global): what KV caches, kernels and
    tuning are sized by. Under `ep` a token's top-k falls on at most E/ranks of the rank's experts,
    the ranks being the tp ones, or the dp ones of data-parallel attention (tp is 1 then)."""
    check_splittable(cfg, split)
    tp, ranks = split.tp, split.world_size
    experts = (dict(num_experts=cfg.num_experts // ranks, num_experts_per_tok=min(cfg.num_experts_per_tok,
                                                                                  cfg.num_experts // ranks))
               if split.ep else dict(moe_intermediate_size=cfg.moe_intermediate_size // tp))
    return dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // tp,
                               num_key_value_heads=local_kv_heads(cfg, tp),
                               intermediate_size=cfg.intermediate_size // tp, **(experts if cfg.num_experts else {}))


def vocab_shard_size(vocab_size: int, tp: int) -> int:
    """Rows of the embedding and lm_head per rank (the vocabulary padded up to a multiple of tp)."""
    return -(-vocab_size // tp)


def reduce_partial_sums(x: torch.Tensor, tp: int, deferred: bool = False) -> torch.Tensor:
    """The output of a row-parallel linear: each rank's product is a partial sum of the whole. `deferred`: left
    to the next RMSNorm, which all-reduces it with its residual add (`defer_reduction`)."""
    return x if tp == 1 or deferred else all_reduce(x)


@dataclasses.dataclass(frozen=True)
class PartialSums:
    """Tells an RMSNorm that its input is this rank's partial sums, to all-reduce with the residual add
    (collectives.all_reduce_add_rms_norm): on GPUs one kernel with the add and the norm, reading `peers`."""
    world_size: int
    peers: torch.Tensor | None       # the model's peer table (GPU weights; none on the CPU)


def defer_reduction(module: nn.Module) -> bool:
    """Let `module` (attention, a dense MLP or a MoE block, whose output goes straight into a residual add and
    RMSNorm) hand back its partial sums for that norm to all-reduce; True when it does (it has `defer_reduce`)."""
    if not hasattr(module, "defer_reduce"):
        return False
    module.defer_reduce = True
    return True


def attach_peer_table(model: nn.Module, device: torch.device) -> None:
    """Give `model` (tp > 1) the peer table of `device` as its buffer `all_reduce_peers`: a constant of the compiled
    GPU packages that the runtime binds to its own (runtime/loading/compiled.py), never a stored weight."""
    if device.type == "cuda":
        model.register_buffer(PEER_TABLE_BUFFER, peer_table(device), persistent=False)


def gather_ranks_tokens(x: torch.Tensor, dp: int) -> torch.Tensor:
    """Data-parallel attention's expert layer input: every rank's [T, H] tokens, [dp * T, H] on each."""
    return x if dp == 1 else all_gather_rows(x, dp)


def scatter_token_sums(x: torch.Tensor, dp: int) -> torch.Tensor:
    """Its output: each rank's [dp * T, H] partial sums added over the ranks, rank r keeping its own T rows."""
    return x if dp == 1 else reduce_scatter_rows(x, dp)


class VocabParallelEmbedding(nn.Module):
    """Rank r's rows of the embedding: a token outside them looks up zeros, and the all-reduce
    puts together the one rank's row that holds it."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tp: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_shard_size(vocab_size, tp), hidden_size, dtype=dtype))
        # rank * rows: a weight, not a constant, so the ranks' graphs are the same
        self.register_buffer("vocab_start", torch.empty((), dtype=torch.int64))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start                           # [T]
        inside = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(torch.where(inside, local, 0), self.weight)  # [T, hidden]
        return all_reduce(rows.masked_fill(~inside.unsqueeze(-1), 0))


def make_embedding(vocab_size: int, hidden_size: int, dtype: torch.dtype, tp: int) -> nn.Module:
    if tp == 1:
        return nn.Embedding(vocab_size, hidden_size, dtype=dtype)
    return VocabParallelEmbedding(vocab_size, hidden_size, dtype, tp)


def vocab_logits(hidden: torch.Tensor, weight: torch.Tensor, vocab_size: int, tp: int) -> torch.Tensor:
    """float32 logits [N, vocab] on every rank from hidden [N, hidden] and this rank's lm_head rows."""
    logits = F.linear(hidden, weight)                         # [N, vocab / tp]
    if tp > 1:
        logits = all_gather_columns(logits, tp)[:, :vocab_size]
    return logits.float()
