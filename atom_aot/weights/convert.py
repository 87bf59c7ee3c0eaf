"""Checkpoint tensors -> the runtime's exact parameters (fused, cast, quantized).

The model class's PACKED_MODULES table says which checkpoint tensors fuse into which parameter;
the result must match, name for name and shape for shape, the state dict of the model built on
the meta device, so the runtime loads it with a plain assign.
"""
from __future__ import annotations

import logging
from typing import Iterable, Iterator

import torch

from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import DecoderForCausalLM
from atom_aot.models.parallel import ONE_RANK, Split
from atom_aot.ops.fp8 import quantize_expert_stack, quantize_weight_per_channel
from atom_aot.ops.int8 import quantize_weight_int8
from atom_aot.ops.rope import rope_cos_sin_cache
from atom_aot.weights.experts import ExpertStacker
from atom_aot.weights.kv_scales import kv_scale_target
from atom_aot.weights.prequantized import finish_fused, normalize_checkpoint
from atom_aot.weights.quant_config import CheckpointQuant

log = logging.getLogger("atom_aot")

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# --quant: the per-output-channel quantizer, w [out, in] -> (q [out, in], scale [out] float32)
WEIGHT_QUANTIZERS = {"fp8": quantize_weight_per_channel, "int8": quantize_weight_int8}


def build_meta_model(model_cls: type[DecoderForCausalLM], cfg: ModelConfig, dtype: torch.dtype, quant: str,
                     max_positions: int, split: Split = ONE_RANK) -> DecoderForCausalLM:
    with torch.device("meta"):
        return model_cls(cfg, dtype, quant, max_positions, split)


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
                       quant: str, on_tensor=lambda name: None,
                       checkpoint_quant: CheckpointQuant | None = None) -> dict[str, torch.Tensor]:
    """Fuse, cast and quantize `tensors` into the state dict of `model` (a meta-device instance).

    `quant` "fp8" or "int8" quantizes an unquantized checkpoint here; a pre-quantized one (`checkpoint_quant`)
    is loaded in its own scheme, as stored."""
    if checkpoint_quant is None:
        return dict(converted_tensors(tensors, model, cfg, quant, on_tensor))
    expected = model.state_dict()
    tensors = normalize_checkpoint(dict(tensors), checkpoint_quant).items()
    out = finish_fused(dict(assembled_tensors(tensors, model, cfg, on_tensor)), expected, checkpoint_quant)
    return dict(_checked(out.items(), expected))


def converted_tensors(tensors: Iterable[tuple[str, torch.Tensor]], model: DecoderForCausalLM, cfg: ModelConfig,
                      quant: str, on_tensor=lambda name: None) -> Iterator[tuple[str, torch.Tensor]]:
    """convert_state_dict of an unquantized checkpoint, one finished parameter at a time: each is
    quantized and cast as soon as its parts are in, so a caller that shards or moves it on holds one
    model, not two."""
    expected = model.state_dict()
    assembled = assembled_tensors(tensors, model, cfg, on_tensor)
    if quant in WEIGHT_QUANTIZERS:
        assembled = _quantized(assembled, expected, quant)
    return _checked(assembled, expected)


def assembled_tensors(tensors: Iterable[tuple[str, torch.Tensor]], model: DecoderForCausalLM, cfg: ModelConfig,
                      on_tensor=lambda name: None) -> Iterator[tuple[str, torch.Tensor]]:
    """Runtime-named parameters as they complete: fused q/k/v and gate/up, stacked experts, the layers'
    kv scales and the rotary table last. Raises if a fused parameter or an expert stack stays incomplete."""
    expected = model.state_dict()
    packed, renames = type(model).PACKED_MODULES, type(model).MODULE_RENAMES
    experts = ExpertStacker(type(model).EXPERT_MODULES, expected)
    num_parts = {fused: 1 + max(i for f, i in packed.values() if f == fused) for fused, _ in packed.values()}
    pending: dict[str, dict[int, torch.Tensor]] = {}
    kv_scales: dict[str, torch.Tensor] = {}
    for name, tensor in type(model).adapt_checkpoint(cfg, tensors):
        on_tensor(name)
        if name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        if _take_kv_scale(name, tensor, kv_scales):
            continue
        name = renamed(name, renames)
        if experts.add(name, tensor):
            yield from experts.take_complete()
            continue
        target, index = runtime_name(name, packed)
        if index is None:
            yield target, tensor
            continue
        parts = pending.setdefault(target, {})
        parts[index] = tensor
        if len(parts) == num_parts[target.split(".")[-2]]:
            yield target, torch.cat([parts[i] for i in sorted(parts)], dim=0)
            del pending[target]
    if pending or experts.incomplete:
        raise ValueError(f"the checkpoint does not match the model: incomplete fused {sorted(pending)[:5]}, "
                         f"incomplete experts {experts.incomplete[:5]}")
    yield from ((n, kv_scales.get(n, torch.ones(2))) for n in expected if n.endswith("self_attn.kv_scale"))
    max_positions, rotary_dim = expected["model.rotary.cos_sin_cache"].shape
    yield "model.rotary.cos_sin_cache", rope_cos_sin_cache(rotary_dim, cfg.rope_theta, cfg.rope_scaling_dict,
                                                           max_positions)


def _checked(tensors: Iterable[tuple[str, torch.Tensor]], expected: dict) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter in the model's dtype, contiguous, after checking its name and shape; at the end,
    that every parameter of the model came."""
    seen, unexpected = set(), []
    for name, tensor in tensors:
        if name not in expected:
            unexpected.append(name)
            continue
        meta = expected[name]
        if tuple(tensor.shape) != tuple(meta.shape):
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(meta.shape)}")
        seen.add(name)
        yield name, tensor.to(meta.dtype).contiguous()
    missing = sorted(set(expected) - seen)
    if unexpected or missing:
        raise ValueError("the checkpoint does not match the model: "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {sorted(unexpected)[:5]}{'...' if len(unexpected) > 5 else ''}")


def _take_kv_scale(name: str, tensor: torch.Tensor, kv_scales: dict[str, torch.Tensor]) -> bool:
    """A checkpoint's k/v scale goes into its slot of the layer's kv_scale [2] (weights/kv_scales.py)."""
    target = kv_scale_target(name)
    if target is None:
        return False
    runtime, slots = target
    kv_scales.setdefault(runtime, torch.ones(2))[list(slots)] = tensor.float().reshape(())
    return True


def quantize_weights(state: dict[str, torch.Tensor], expected: dict,
                     quant: str = "fp8") -> Iterator[tuple[str, torch.Tensor]]:
    """Per-output-channel quantization (e4m3 or int8) of every weight the model declares with a scale."""
    return _quantized(state.items(), expected, quant)


def _quantized(tensors: Iterable[tuple[str, torch.Tensor]], expected: dict,
               quant: str) -> Iterator[tuple[str, torch.Tensor]]:
    quantize = WEIGHT_QUANTIZERS[quant]
    for name, tensor in tensors:
        scale_name = name.removesuffix("weight") + "weight_scale"
        if name.endswith(".weight") and scale_name in expected:
            weight, scale = quantize(tensor)                        # [out, in] e4m3 | int8, [out]
            yield name, weight
            yield scale_name, scale
        elif name.endswith((".experts.w13", ".experts.w2")) and name + "_scale" in expected:
            weight, scale = quantize_expert_stack(tensor)           # fp8 experts only declare scales (models/moe.py)
            yield name, weight
            yield name + "_scale", scale
        else:
            yield name, tensor
