"""GLM-4-MoE (GLM-4.5, GLM-4.5-Air; transformers' `Glm4MoeForCausalLM`): the dense decoder's attention with
q/k/v biases (`attention_bias`), per-head QK-norm when `use_qk_norm`, and rope on the first
`partial_rotary_factor` of each head's dims (0.5, transformers' default for the family), neox halves inside that
part and the rest passed through, as transformers' `apply_rotary_pos_emb` does (ops/rope.py); then
`first_k_dense_replace` dense layers and DeepSeek-V3's MoE block after them (sigmoid scores with
`e_score_correction_bias`, grouped top-k over `n_group` / `topk_group`, `norm_topk_prob`, `routed_scaling_factor`,
`n_shared_experts` shared experts: models/deepseek_moe.py, the router ops/moe.py `grouped_sigmoid_topk`).

The checkpoint's MTP layers (`num_nextn_predict_layers`, stored as layers num_hidden_layers + i, as GLM-4.5
ships one) are not built: the build skips their tensors and logs it, and `--method mtp` is refused for the family.
"""
from __future__ import annotations

import logging
from typing import Iterable, Iterator

import torch
from torch import nn

from atom_aot.errors import BuildError
from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import GatedMLP
from atom_aot.models.deepseek_moe import DeepseekMoE
from atom_aot.models.moe import MoEForCausalLM
from atom_aot.models.parallel import ONE_RANK, Split

log = logging.getLogger("atom_aot")


class Glm4MoeForCausalLM(MoEForCausalLM):
    PARTIAL_ROTARY_FACTOR = 0.5      # transformers' Glm4MoeConfig sets it when config.json does not

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: str = "none", max_positions: int | None = None,
                 split: Split = ONE_RANK):
        if cfg.grouped_moe is None:
            raise BuildError(f"{cfg.architecture}'s config.json has no n_routed_experts: GLM-4-MoE's layers from "
                             f"first_k_dense_replace on are mixtures of experts")
        super().__init__(cfg, dtype, quant, max_positions, split)

    @property
    def qk_norm(self) -> bool:
        """QK-norm is the config's choice in this family (`use_qk_norm`: GLM-4.5 has it, GLM-4.5-Air not)."""
        return self.config.use_qk_norm

    @property
    def o_proj_bias(self) -> bool:
        """GLM's `attention_bias` covers q, k and v only: its o_proj has none (transformers' Glm4MoeAttention)."""
        return False

    def make_mlp(self, layer: int, dtype: torch.dtype, quant: str) -> nn.Module:
        if self.config.is_moe_layer(layer):
            return DeepseekMoE(self.config, dtype, quant, self.split)
        return GatedMLP(self.config, dtype, quant, self.split.tp)

    @classmethod
    def adapt_checkpoint(cls, cfg: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]]
                         ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors but its MTP layers' (`model.layers.{num_hidden_layers + i}.*`), not built."""
        mtp_prefixes = tuple(f"model.layers.{cfg.num_hidden_layers + i}." for i in range(cfg.num_nextn_predict_layers))
        if mtp_prefixes:
            log.info("%s: config.json has num_nextn_predict_layers=%d; its MTP layer(s) are not built (their "
                     "tensors %s* are skipped): the artifact serves without them, and --method mtp is refused for it",
                     cfg.architecture, cfg.num_nextn_predict_layers, mtp_prefixes[0])
        for name, tensor in tensors:
            if not name.startswith(mtp_prefixes):
                yield name, tensor
