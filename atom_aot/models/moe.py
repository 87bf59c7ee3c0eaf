"""The mixture-of-experts layer and the decoder families built on it (Qwen3-MoE, Mixtral).

`MoEExperts` owns one layer's stacked expert weights (and biases, where the family has them) and runs them
through the `moe` backend the tuning row names (atom_aot/ops/backends/moe.py); `SparseMoeBlock` adds the router
(a linear gate, with a bias where the family has one, and a softmax top-k, run by the same backend). What differs
between the families that share the block is one `MoEBlockSpec` from the model class. A family with other routing
(DeepSeek's grouped sigmoid, shared experts) reuses `MoEExperts` with its own block. `MoEForCausalLM` is the dense
decoder with a per-layer choice of feed-forward block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from atom_aot.artifact.manifest import expert_format_name
from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import DecoderForCausalLM
from atom_aot.models.layers import Linear
from atom_aot.models.parallel import ONE_RANK, Split, gather_ranks_tokens, reduce_partial_sums, scatter_token_sums
from atom_aot.ops.backends import make_backend
from atom_aot.ops.backends.moe import MoEBackend
from atom_aot.ops.expert_formats import FORMATS, ExpertFormat
from atom_aot.ops.moe import SILU, ExpertActivation, ExpertWeights


@dataclass(frozen=True)
class MoEBlockSpec:
    """What a family's SparseMoeBlock computes, beyond the config's sizes (a fact of its model class)."""
    renormalize: bool = False           # softmax over the experts, its top k renormalized to sum to 1
    top_k_first: bool = False           # the top k of the logits, a softmax over those k (GPT-OSS; no renormalize)
    router_bias: bool = False           # the router linear has a bias
    expert_bias: bool = False           # each expert's projections have biases (w13_bias, w2_bias)
    activation: ExpertActivation = SILU


class MoEExperts(nn.Module):
    """E experts of one layer, stacked as the `fused_moe` op reads them (atom_aot/ops/moe.py).

    With `tp` ranks (models/parallel.py) a rank holds 1/tp of every expert's width, or, with `ep`,
    E/tp whole experts: the router's ids are then mapped to local ids, with -1 for an expert of
    another rank, which the op skips. Either way the rank's output is a partial sum, all-reduced here;
    with data-parallel attention (`dp` ranks, each holding E/dp experts) SparseMoeBlock reduce-scatters it.

    The weights scheme `quant` fixes how the stacks are stored (`expert_format`: in the model dtype, e4m3 with
    per-row or 128x128-block scales, mxfp4; ops/expert_formats.py); `bias` adds float32 biases `w13_bias [E, 2I]`
    and `w2_bias [E, H]` (under tp without ep, w2's bias is rank 0's alone: the partial sums add it once);
    `activation`: SiLU-mul, or GPT-OSS's clamped SwiGLU (ops/moe.py ExpertActivation).
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, dtype: torch.dtype,
                 split: Split = ONE_RANK, quant: str = "none", bias: bool = False, activation: ExpertActivation = SILU):
        super().__init__()
        self.tp, self.ep, self.activation = split.tp, split.ep, activation
        local_experts, width = ((num_experts // split.world_size, intermediate_size) if split.ep
                                else (num_experts, intermediate_size // split.tp))
        stored = expert_format(quant)
        shapes = stored.stack_shapes(local_experts, width, hidden_size)
        if bias:
            shapes |= {"w13_bias": (local_experts, 2 * width), "w2_bias": (local_experts, hidden_size)}
        self.w13_scale = self.w2_scale = self.w13_bias = self.w2_bias = None
        for name, shape in shapes.items():
            setattr(self, name, nn.Parameter(torch.empty(shape, dtype=stored.stack_dtype(name, dtype)),
                                             requires_grad=False))
        if split.ep:   # rank * E/ranks: a weight, not a constant, so the ranks' graphs are the same
            self.register_buffer("expert_start", torch.empty((), dtype=torch.int64))
        # the reference backend until use_moe_kernels sets the phase's choice
        self.moe_backend: MoEBackend = make_backend("moe", BackendChoice("reference"))

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                deferred: bool = False) -> torch.Tensor:
        # hidden: [T, H]; topk_weights: [T, k] float32; topk_ids: [T, k] int32 (global ids) -> [T, H]
        # deferred: the partial sums are handed back for the caller (or the next RMSNorm) to all-reduce
        if self.ep:
            local = topk_ids - self.expert_start                                    # [T, k]
            mine = (local >= 0) & (local < self.w13.shape[0])
            topk_ids = torch.where(mine, local, -1).to(torch.int32)
        partial = self.moe_backend(hidden, self.weights(), topk_weights, topk_ids, self.activation)
        return reduce_partial_sums(partial, self.tp, deferred)     # tp is 1 under dp: the block reduce-scatters

    def weights(self) -> ExpertWeights:
        """This layer's stacks, scales and biases as the backends take them."""
        return ExpertWeights(self.w13, self.w2, self.w13_scale, self.w2_scale, self.w13_bias, self.w2_bias)



def expert_format(quant: str) -> ExpertFormat:
    """How a model of weights scheme `quant` stores its experts: e4m3 with a scale per row (`--quant fp8`, and
    per-row or per-tensor fp8 checkpoints with dynamic activations; fbgemm_fp8's bound on activations concerns the
    linears only) or per 128x128 block (block-scaled checkpoints), mxfp4 (mxfp4 checkpoints), all weight-only;
    otherwise in the model dtype."""
    return FORMATS[expert_format_name(quant)]


class SparseMoeBlock(nn.Module):
    """Router (`gate`, unquantized: it decides the experts) + softmax top-k + experts, as `spec` says.

    With data-parallel attention (`dp` > 1) the rank's T tokens are its own sequences': the block
    gathers the dp ranks' tokens (all-gather: every rank steps with the same T), routes and runs its
    experts on all dp * T, and reduce-scatters the partial sums back to each rank's T (vLLM's
    all-gather / reduce-scatter dispatch: dense, no token counts to exchange, CUDA-graph friendly)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, spec: MoEBlockSpec, split: Split = ONE_RANK,
                 quant: str = "none"):
        super().__init__()
        self.top_k, self.renormalize, self.top_k_first, self.dp = (cfg.num_experts_per_tok, spec.renormalize,
                                                                   spec.top_k_first, split.dp)
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, spec.router_bias, dtype)
        self.experts = MoEExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, dtype, split, quant,
                                  spec.expert_bias, spec.activation)
        self.defer_reduce = False      # True: the output stays partial sums for the next norm (parallel.py)

    def route(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, ids [T, k] int32) of hidden [T, H], by the experts' backend."""
        logits, backend = self.gate(hidden), self.experts.moe_backend                # [T, E]
        if self.top_k_first:
            return backend.route_top_k_softmax(logits, self.top_k)
        return backend.route(logits, self.top_k, self.renormalize)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = gather_ranks_tokens(hidden, self.dp)                                 # [dp * T, H]
        weights, ids = self.route(hidden)                                             # [dp * T, k]
        return scatter_token_sums(self.experts(hidden, weights, ids, self.defer_reduce), self.dp)


def use_moe_kernels(model: nn.Module, choice: BackendChoice) -> None:
    """Run every `MoEExperts` in `model` through the backend `choice` names."""
    backend = make_backend("moe", choice)
    for module in model.modules():
        if isinstance(module, MoEExperts):
            module.moe_backend = backend


class MoEForCausalLM(DecoderForCausalLM):
    """A decoder whose layers have experts where `ModelConfig.is_moe_layer` says, a dense MLP elsewhere.

    Subclasses set `EXPERT_MODULES` (checkpoint expert projection -> (stacked parameter, part)), and
    `MODULE_RENAMES` where the checkpoint names the block otherwise than `mlp`; weights/convert.py reads both.
    """

    EXPERT_MODULES = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}
    MODULE_RENAMES: dict[str, str] = {}

    def routing_renormalizes(self) -> bool:
        return self.config.norm_topk_prob

    def moe_block_spec(self) -> MoEBlockSpec:
        """What this family's expert layers compute (Qwen3-MoE and Mixtral: softmax top-k, SiLU experts)."""
        return MoEBlockSpec(renormalize=self.routing_renormalizes())

    def make_mlp(self, layer: int, dtype: torch.dtype, quant: str) -> nn.Module:
        if self.config.is_moe_layer(layer):
            return SparseMoeBlock(self.config, dtype, self.moe_block_spec(), self.split, quant)
        return super().make_mlp(layer, dtype, quant)

    def use_kernels(self, row: PhaseTuning) -> "MoEForCausalLM":
        super().use_kernels(row)
        use_moe_kernels(self, row.op("moe"))
        return self
