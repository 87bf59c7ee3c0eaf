"""Which quantization a checkpoint ships with, read from config.json's `quantization_config`.

The formats are those of the Hugging Face ecosystem; each maps onto one runtime scheme of
atom_aot/models/quant_layers.py (its layout is loaded as-is, never dequantized and requantized):

    quant_method       config                                               runtime scheme
    fp8                weight_block_size [128, 128], activation_scheme dynamic   fp8-block
    fp8                no block size, activation_scheme dynamic                  fp8 (per-token activations)
    fp8                no block size, activation_scheme static                   fp8-static
    fbgemm_fp8         per-channel weights, dynamic per-row activations          fp8
    compressed-tensors float 8-bit weights (tensor | channel | block 128x128)   fp8 / fp8-static / fp8-block
                       with float 8-bit activations (dynamic token | tensor, static tensor, dynamic group 128)
    compressed-tensors int 8-bit symmetric weights (tensor | channel) with       int8 / int8-static
                       symmetric int 8-bit activations (dynamic token | tensor, static tensor)
    gptq               bits 4, group_size 128 | -1, sym true | false, desc_act false  int4-w4a16 / -channel
    awq                bits 4, group_size 128, zero_point true, version gemm          int4-w4a16
    mxfp4              the MoE experts in e2m1 + e8m0 blocks of 32 (GPT-OSS), the rest unquantized  mxfp4

Dynamic per-tensor activations run per token (a finer scale, never a coarser one). Anything else
(compressed-tensors int4 `pack-quantized`, GPTQ act-order (desc_act) or other widths than 4 bits,
AWQ gemv / other versions, asymmetric int8, int8 group/block weights, weight-only int8 or float8,
other block sizes) is refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass

from atom_aot.errors import BuildError

SUPPORTED = ("fp8 (per-tensor or 128x128 blocks; dynamic or static activations), fbgemm_fp8, "
             "compressed-tensors float8 W8A8 (tensor/channel/128x128-block weights), "
             "compressed-tensors int8 W8A8 (symmetric tensor/channel weights; symmetric dynamic per-token or "
             "static per-tensor activations), gptq 4-bit (group 128 or per channel, sym or asym, no desc_act), "
             "awq 4-bit (gemm, group 128, zero points), mxfp4 (MoE experts, GPT-OSS)")
INT8_FORMATS = (None, "int-quantized", "naive-quantized")    # compressed-tensors formats that store int8 as is


@dataclass(frozen=True)
class CheckpointQuant:
    """A pre-quantized checkpoint's format, as the build loads it."""
    method: str                    # quant_method as config.json spells it
    scheme: str                    # runtime scheme: fp8 | fp8-static | fp8-block | fp8-ub | int8 | int8-static
    ignored: tuple[str, ...]       # the checkpoint's ignore list (modules it left unquantized)
    description: str               # for the manifest and `inspect`
    kv_cache_scheme: bool = False  # the checkpoint says it carries k/v scales
    activation_scale_ub: float | None = None   # fbgemm_fp8: the bound on per-token activation amax
    int4_packing: str = ""         # gptq (zeros stored - 1) | gptq_v2 (zeros as they are) | awq
    group_size: int = 0            # int4: inputs per scale/zero group (-1: the whole row)


def detect_checkpoint_quant(config: dict) -> CheckpointQuant | None:
    """The checkpoint's quantization, None for an unquantized one, a BuildError for one we cannot run."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    method = qc.get("quant_method")
    readers = {"fp8": _hf_fp8, "fbgemm_fp8": _fbgemm_fp8, "compressed-tensors": _compressed_tensors,
               "gptq": _gptq, "awq": _awq, "mxfp4": _mxfp4}
    if method not in readers:
        raise BuildError(f"the checkpoint is quantized with quant_method {method!r}, which atom-aot cannot load. "
                         f"Supported: {SUPPORTED}. Use an unquantized (bf16) checkpoint, optionally with "
                         f"--quant fp8 or --quant int8.")
    return readers[method](qc)


def _refuse(method: str, what: str) -> BuildError:
    return BuildError(f"the checkpoint's quantization ({method}: {what}) is not supported by atom-aot. "
                      f"Supported: {SUPPORTED}.")


def _ignored(qc: dict, *keys: str) -> tuple[str, ...]:
    return tuple(str(name) for key in keys for name in (qc.get(key) or ()))


def _hf_fp8(qc: dict) -> CheckpointQuant:
    block = qc.get("weight_block_size")
    activations = qc.get("activation_scheme", "dynamic")
    if activations not in ("dynamic", "static"):
        raise _refuse("fp8", f"activation_scheme {activations!r}")
    ignored = _ignored(qc, "ignored_layers", "modules_to_not_convert")
    if block is not None:
        if list(block) != [128, 128] or activations != "dynamic":
            raise _refuse("fp8", f"weight_block_size {block} with activation_scheme {activations}; "
                                 f"blocks must be [128, 128] with dynamic activations")
        return CheckpointQuant("fp8", "fp8-block", ignored, "fp8, 128x128 weight blocks, dynamic 1x128 activations")
    scheme = "fp8" if activations == "dynamic" else "fp8-static"
    return CheckpointQuant("fp8", scheme, ignored, f"fp8, per-tensor weights, {activations} activations")


def _fbgemm_fp8(qc: dict) -> CheckpointQuant:
    ignored = _ignored(qc, "modules_to_not_convert")
    ub = qc.get("activation_scale_ub")
    if ub is None:
        return CheckpointQuant("fbgemm_fp8", "fp8", ignored, "fbgemm_fp8, per-channel weights, dynamic per-token "
                                                             "activations")
    if not isinstance(ub, (int, float)) or isinstance(ub, bool) or not ub > 0:
        raise _refuse("fbgemm_fp8", f"activation_scale_ub {ub!r} (a positive number is the bound on a token's "
                                    f"activation amax)")
    return CheckpointQuant("fbgemm_fp8", "fp8-ub", ignored, f"fbgemm_fp8, per-channel weights, dynamic per-token "
                           f"activations with amax bounded by activation_scale_ub={float(ub):g}",
                           activation_scale_ub=float(ub))


def _compressed_tensors(qc: dict) -> CheckpointQuant:
    groups = list((qc.get("config_groups") or {}).values())
    if not groups or any(g != groups[0] for g in groups):
        raise _refuse("compressed-tensors", f"{len(groups)} differing config_groups; one scheme for every "
                                            f"Linear is supported")
    weights, activations = groups[0].get("weights") or {}, groups[0].get("input_activations")
    weight_type = f"{weights.get('type')}{weights.get('num_bits')}"
    if weight_type == "int8":
        return _compressed_int8(qc, weights, activations)
    if weight_type != "float8":
        raise _refuse("compressed-tensors", f"{weight_type} weights (int4 pack-quantized and other widths are "
                                            f"left: only 8-bit W8A8 runs; int4 runs from gptq / awq checkpoints)")
    if not activations or f"{activations.get('type')}{activations.get('num_bits')}" != "float8":
        raise _refuse("compressed-tensors", "float8 weights without float8 activations (weight-only)")
    strategy, act_strategy = weights.get("strategy"), activations.get("strategy")
    dynamic = bool(activations.get("dynamic"))
    scheme = _compressed_scheme(strategy, weights.get("block_structure"), act_strategy, dynamic)
    when = "dynamic" if dynamic else "static"
    return CheckpointQuant("compressed-tensors", scheme, _ignored(qc, "ignore"),
                           f"compressed-tensors float8, {strategy} weights, {when} {act_strategy} activations",
                           kv_cache_scheme=bool(qc.get("kv_cache_scheme")))


def _compressed_scheme(strategy, block, act_strategy, dynamic: bool) -> str:
    if strategy == "block" and list(block or ()) == [128, 128] and dynamic and act_strategy == "group":
        return "fp8-block"
    if strategy in ("tensor", "channel") and dynamic and act_strategy in ("token", "tensor"):
        return "fp8"
    if strategy in ("tensor", "channel") and not dynamic and act_strategy == "tensor":
        return "fp8-static"
    raise _refuse("compressed-tensors", f"{strategy} weights (block {block}) with "
                                        f"{'dynamic' if dynamic else 'static'} {act_strategy} activations")


def _compressed_int8(qc: dict, weights: dict, activations: dict | None) -> CheckpointQuant:
    """compressed-tensors W8A8 int8 (RedHatAI / neuralmagic "...-quantized.w8a8"): symmetric only."""
    strategy = weights.get("strategy")
    if qc.get("format") not in INT8_FORMATS:
        raise _refuse("compressed-tensors", f"int8 weights stored as {qc.get('format')!r} (int-quantized is read)")
    if not weights.get("symmetric", True):
        raise _refuse("compressed-tensors", "asymmetric int8 weights (zero points)")
    if strategy not in ("tensor", "channel"):
        raise _refuse("compressed-tensors", f"int8 {strategy} weights (group size {weights.get('group_size')}); "
                                            f"per-channel or per-tensor int8 weights run")
    if not activations or f"{activations.get('type')}{activations.get('num_bits')}" != "int8":
        raise _refuse("compressed-tensors", "int8 weights without int8 activations (weight-only W8A16)")
    if not activations.get("symmetric", True):
        raise _refuse("compressed-tensors", "asymmetric int8 activations (zero points)")
    dynamic, act_strategy = bool(activations.get("dynamic")), activations.get("strategy")
    if dynamic and act_strategy in ("token", "tensor"):
        scheme = "int8"
    elif not dynamic and act_strategy == "tensor":
        scheme = "int8-static"
    else:
        raise _refuse("compressed-tensors", f"int8 {strategy} weights with {'dynamic' if dynamic else 'static'} "
                                            f"{act_strategy} int8 activations")
    when = "dynamic" if dynamic else "static"
    return CheckpointQuant("compressed-tensors", scheme, _ignored(qc, "ignore"),
                           f"compressed-tensors int8, {strategy} weights, {when} {act_strategy} activations",
                           kv_cache_scheme=bool(qc.get("kv_cache_scheme")))


def _gptq(qc: dict) -> CheckpointQuant:
    """AutoGPTQ / GPTQModel / optimum checkpoints (qweight, qzeros, scales, g_idx)."""
    bits, group, sym = qc.get("bits"), qc.get("group_size"), qc.get("sym", True)
    packing = qc.get("checkpoint_format", "gptq")
    if bits != 4:
        raise _refuse("gptq", f"{bits}-bit weights (4-bit runs)")
    if qc.get("desc_act"):
        raise _refuse("gptq", "desc_act true (act-order: g_idx permutes the groups along K)")
    if group not in (128, -1):
        raise _refuse("gptq", f"group_size {group} (128 or -1 runs)")
    if packing not in ("gptq", "gptq_v2"):
        raise _refuse("gptq", f"checkpoint_format {packing!r} (gptq or gptq_v2 is read)")
    if qc.get("lm_head") or qc.get("dynamic"):
        raise _refuse("gptq", "a quantized lm_head or per-module `dynamic` overrides")
    scheme = "int4-w4a16" if group == 128 else "int4-w4a16-channel"
    groups = "groups of 128" if group == 128 else "per channel"
    return CheckpointQuant("gptq", scheme, _ignored(qc, "modules_to_not_convert"),
                           f"gptq 4-bit ({packing}), {groups}, {'symmetric' if sym else 'asymmetric'}, W4A16",
                           int4_packing=packing, group_size=group)


def _awq(qc: dict) -> CheckpointQuant:
    """AutoAWQ checkpoints (bits / w_bit, group_size / q_group_size as transformers or AutoAWQ spell them)."""
    bits, group = qc.get("bits", qc.get("w_bit")), qc.get("group_size", qc.get("q_group_size"))
    version = str(qc.get("version", "gemm")).lower()
    if bits != 4:
        raise _refuse("awq", f"{bits}-bit weights (4-bit runs)")
    if version != "gemm":
        raise _refuse("awq", f"version {version!r} (its packing differs; version gemm is read)")
    if group != 128:
        raise _refuse("awq", f"group_size {group} (128 runs)")
    if not qc.get("zero_point", True):
        raise _refuse("awq", "zero_point false")
    return CheckpointQuant("awq", "int4-w4a16", _ignored(qc, "modules_to_not_convert"),
                           "awq 4-bit (gemm), groups of 128, zero points, W4A16", int4_packing="awq", group_size=128)


MXFP4_FIELDS = ("quant_method", "modules_to_not_convert", "dequantize")    # transformers' Mxfp4Config


def _mxfp4(qc: dict) -> CheckpointQuant:
    """OpenAI's GPT-OSS format (transformers' Mxfp4Config): the experts' `*_blocks` / `*_scales`, loaded as stored
    (weights/experts.py); everything else in the checkpoint is unquantized."""
    unknown = sorted(set(qc) - set(MXFP4_FIELDS))
    if unknown:
        raise _refuse("mxfp4", f"the field(s) {', '.join(unknown)} (read: {', '.join(MXFP4_FIELDS)})")
    if qc.get("dequantize"):
        raise _refuse("mxfp4", "dequantize true (transformers' option to widen the experts to bf16 at load; "
                               "atom-aot serves them as stored: drop the field)")
    ignored = _ignored(qc, "modules_to_not_convert")
    experts = [name for name in ignored if "experts" in name]
    if experts:
        raise _refuse("mxfp4", f"modules_to_not_convert names experts ({', '.join(experts)}): every MoE layer's "
                               f"experts are read as mxfp4")
    return CheckpointQuant("mxfp4", "mxfp4", ignored, "mxfp4 experts (e2m1, e8m0 scale per 32 values), "
                                                      "the rest unquantized")


@dataclass(frozen=True)
class QuantPlan:
    """How the build gets the decoder linears' runtime scheme and the fp8 KV cache's scales."""
    scheme: str                          # none or a quantized scheme of quant_layers.py
    origin: str                          # none | build (atom-build --quant fp8 | int8) | checkpoint
    checkpoint: CheckpointQuant | None   # the pre-quantized checkpoint's format, if it is one
    kv_scales: str = "none"              # none (no fp8 cache) | checkpoint | calibrated (at build)

    def manifest_details(self) -> dict:
        """The Quantization fields (artifact/manifest.py) this decides."""
        return {"weights_origin": self.origin, "ignored": self.checkpoint.ignored if self.checkpoint else (),
                "checkpoint_format": self.checkpoint.description if self.checkpoint else ""}


def resolve_quant_plan(hf_config: dict, quant_flag: str, fp8_kv_cache: bool = False,
                       checkpoint_has_kv_scales: bool = False) -> QuantPlan:
    """--quant fp8 / int8 quantizes an unquantized checkpoint (W8A8, dynamic per-token activations); a
    pre-quantized checkpoint runs in its own scheme, and asking to quantize it again is an error.
    An fp8 KV cache takes the checkpoint's k/v scales, or has the build calibrate them."""
    kv_scales = ("checkpoint" if checkpoint_has_kv_scales else "calibrated") if fp8_kv_cache else "none"
    checkpoint = detect_checkpoint_quant(hf_config)
    if checkpoint is not None:
        if quant_flag != "none":
            raise BuildError(f"the checkpoint is already quantized ({checkpoint.description}); build it without "
                             f"--quant {quant_flag}: its own scheme is loaded as stored")
        return QuantPlan(checkpoint.scheme, "checkpoint", checkpoint, kv_scales)
    if quant_flag in ("fp8", "int8"):
        return QuantPlan(quant_flag, "build", None, kv_scales)
    return QuantPlan("none", "none", None, kv_scales)
