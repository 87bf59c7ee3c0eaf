"""Checkpoint tensors -> the runtime's exact parameters (fused, cast, quantized).

The model class's PACKED_MODULES table says which checkpoint tensors fuse into which parameter;
the result must match, name for name and shape for shape, the state dict of the model built on
the meta device, so the runtime loads it with a plain assign.
"""
from __future__ import annotations

import logging
from typing import Iterable, Iterator

import torch

from atom_aot.build.experts import ExpertStacker
from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import DecoderForCausalLM
from atom_aot.ops.rope import rope_cos_sin_cache

log = logging.getLogger("atom_aot")

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def build_meta_model(model_cls: type[DecoderForCausalLM], cfg: ModelConfig, dtype: torch.dtype, quant: str,
                     max_positions: int) -> DecoderForCausalLM:
    with torch.device("meta"):
        return model_cls(cfg, dtype, quant, max_positions)


def runtime_name(name: str, packed: dict[str, tuple[str, int]]) -> tuple[str, int | None]:
    """`model.layers.0.self_attn.q_proj.weight` -> (`model.layers.0.self_attn.qkv_proj.weight`, 0)."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in packed:
        fused, index = packed[parts[-2]]
        return ".".join(parts[:-2] + [fused, parts[-1]]), index
    return name, None


def renamed(name: str, renames: dict[str, str]) -> str:
    """Module names the checkpoint spells otherwise (Mixtral's `block_sparse_moe` -> `mlp`)."""
    return ".".join(renames.get(part, part) for part in name.split(".")) if renames else name


def convert_state_dict(tensors: Iterable[tuple[str, torch.Tensor]], model: DecoderForCausalLM, cfg: ModelConfig,
                       quant: str, on_tensor=lambda name: None) -> dict[str, torch.Tensor]:
    """Fuse, cast and quantize `tensors` into the state dict of `model` (a meta-device instance)."""
    expected = model.state_dict()
    packed, renames = type(model).PACKED_MODULES, type(model).MODULE_RENAMES
    experts = ExpertStacker(type(model).EXPERT_MODULES, expected)
    num_parts = {fused: 1 + max(i for f, i in packed.values() if f == fused) for fused, _ in packed.values()}
    pending: dict[str, dict[int, torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in type(model).adapt_checkpoint(cfg, tensors):
        on_tensor(name)
        if name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        name = renamed(name, renames)
        if experts.add(name, tensor):
            continue
        target, index = runtime_name(name, packed)
        if index is None:
            out[target] = tensor
            continue
        parts = pending.setdefault(target, {})
        parts[index] = tensor
        if len(parts) == num_parts[target.split(".")[-2]]:
            out[target] = torch.cat([parts[i] for i in sorted(parts)], dim=0)
            del pending[target]
    out.update(experts.complete)
    max_positions, rotary_dim = expected["model.rotary.cos_sin_cache"].shape
    out["model.rotary.cos_sin_cache"] = rope_cos_sin_cache(rotary_dim, cfg.rope_theta, cfg.rope_scaling_dict,
                                                           max_positions)
    if quant == "fp8":
        out = dict(_quantize_fp8(out, expected))
    unexpected = sorted(set(out) - set(expected))
    missing = sorted(set(expected) - set(out))
    if unexpected or missing or pending or experts.incomplete:
        raise ValueError("the checkpoint does not match the model: "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}, "
                         f"incomplete fused {sorted(pending)[:5]}, incomplete experts {experts.incomplete[:5]}")
    for name, meta in expected.items():
        if tuple(out[name].shape) != tuple(meta.shape):
            raise ValueError(f"{name}: checkpoint shape {tuple(out[name].shape)} != model shape {tuple(meta.shape)}")
        out[name] = out[name].to(meta.dtype).contiguous()
    return out


def _quantize_fp8(state: dict[str, torch.Tensor], expected: dict) -> Iterator[tuple[str, torch.Tensor]]:
    """Per-output-channel e4m3 quantization of every weight the model declares as float8."""
    for name, tensor in state.items():
        scale_name = name.removesuffix("weight") + "weight_scale"
        if name.endswith(".weight") and scale_name in expected:
            w = tensor.float()
            scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=1e-12)    # [out]
            yield name, (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            yield scale_name, scale
        else:
            yield name, tensor
