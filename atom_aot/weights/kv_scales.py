"""The fp8 KV cache's per-layer (k, v) scales: read from the checkpoint, or calibrated at build.

Checkpoints spell them `self_attn.k_scale` / `v_scale` (compressed-tensors, HF fp8), `self_attn.kv_scale`
(one for both, older fp8) or `self_attn.{k,v}_proj.output_scale`; each becomes one slot of the runtime's
`self_attn.kv_scale` [2]. Without them the build runs the model eagerly on CALIBRATION_TEXTS with a
cache in the model dtype and takes amax(|k|) / 448 and amax(|v|) / 448 per layer from what was written
(keys after QK-norm and rope, exactly what the cache stores). A latent (MLA) cache has one vector per
token: its two scales are those of c_kv and of k_pe (ops/mla.py). A cache layer the calibration does
not write (an MTP layer's) takes the largest scale of the others.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from atom_aot.artifact.kv_cache import KVCacheLayout
from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
from atom_aot.models import ModelConfig
from atom_aot.models.step_inputs import StepInputs
from atom_aot.ops.fp8 import FP8_MAX

# checkpoint name -> (layer, the slots of kv_scale it sets: 0 k, 1 v)
_KV_SCALE_NAME = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(k_scale|v_scale|kv_scale|k_proj\.output_scale|"
                            r"v_proj\.output_scale)$")
_SLOTS = {"k_scale": (0,), "v_scale": (1,), "kv_scale": (0, 1), "k_proj.output_scale": (0,),
          "v_proj.output_scale": (1,)}
CALIBRATION_TEXTS = (
    "The history of the printing press begins in the fifteenth century, when movable type made books cheap "
    "enough that ordinary readers could own them. Within fifty years millions of volumes had been printed.",
    "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n",
    "Question: A train leaves at 3:15 pm and the trip takes 2 hours and 50 minutes. When does it arrive? "
    "Answer: 3:15 pm plus 2 hours is 5:15 pm, plus 50 minutes is 6:05 pm.",
    "User: Can you explain what a hash table is?\nAssistant: A hash table stores key-value pairs in an array; "
    "a hash function maps each key to a slot, so lookups take constant time on average.",
)
MAX_CALIBRATION_TOKENS = 256


def kv_scale_target(name: str) -> tuple[str, tuple[int, ...]] | None:
    """`model.layers.3.self_attn.k_scale` -> (`model.layers.3.self_attn.kv_scale`, (0,)); None if not a KV scale."""
    match = _KV_SCALE_NAME.match(name)
    if match is None:
        return None
    return f"model.layers.{match.group(1)}.self_attn.kv_scale", _SLOTS[match.group(2)]


def checkpoint_has_kv_scales(files: list[Path]) -> bool:
    """Whether a safetensors checkpoint carries k/v scales (reads the headers only)."""
    from safetensors import safe_open
    for f in files:
        if f.suffix == ".safetensors":
            with safe_open(f, framework="pt") as fh:
                if any(kv_scale_target(name) for name in fh.keys()):
                    return True
    return False


def prefill_inputs(cfg: ModelConfig, prompts: list[list[int]], kv_dtype: torch.dtype, device, block_size: int = 16,
                   logits: str = "last", layout: KVCacheLayout | None = None) -> StepInputs:
    """The prompts in one step from an empty cache; logits for each prompt's last token or for `all` tokens.
    `layout`: the model's cache layout (default: the dense one, per-head k and v)."""
    lengths = [len(p) for p in prompts]
    max_blocks = -(-max(lengths) // block_size)
    block_tables = torch.arange(len(prompts) * max_blocks).view(len(prompts), max_blocks)
    positions = torch.cat([torch.arange(n) for n in lengths])
    rows = torch.repeat_interleave(torch.arange(len(prompts)), torch.tensor(lengths))
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    inputs = StepInputs(
        input_ids=torch.tensor([t for p in prompts for t in p]), positions=positions,
        kv_cache=torch.zeros((layout or KVCacheLayout(cfg.num_hidden_layers, 2, cfg.num_key_value_heads, cfg.head_dim)
                              ).shape(block_tables.numel(), block_size), dtype=kv_dtype),
        slot_mapping=block_tables[rows, positions // block_size] * block_size + positions % block_size,
        block_tables=block_tables.int(), seq_lens=torch.tensor(lengths, dtype=torch.int32),
        query_start_loc=starts.int(),
        logits_indices=torch.arange(sum(lengths)) if logits == "all" else starts[1:] - 1)
    return StepInputs(*(t.to(device) for t in inputs))


def calibrate_kv_scales(model, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    """Per-layer (k, v) scales from one eager prefill of `prompts` through `model` (weights loaded)."""
    device = next(model.parameters()).device
    dtype = model.model.embed_tokens.weight.dtype
    model.use_kernels(PhaseTuning({"attention": BackendChoice("reference"), "fp8_linear": BackendChoice("aten"),
                                   "int8_linear": BackendChoice("aten"), "int4_linear": BackendChoice("aten"),
                                   "mla_attention": BackendChoice("reference"), "moe": BackendChoice("reference")}))
    layout = model.kv_cache_layout(model.config)
    inputs = prefill_inputs(model.config, prompts, dtype, device, layout=layout)
    with torch.no_grad():
        model(inputs)
    cache = inputs.kv_cache.float().abs()                                 # written slots; the rest is 0
    if layout.parts == 2:
        amax = cache.amax(dim=(2, 3, 4, 5))                               # [L, 2]: k, v
    else:                                                                 # [L, 2]: c_kv, k_pe of each latent
        rank = model.config.deepseek.kv_lora_rank
        amax = torch.stack([cache[..., :rank].amax(dim=(1, 2, 3, 4, 5)), cache[..., rank:].amax(dim=(1, 2, 3, 4, 5))], 1)
    unwritten = amax.amax(dim=1) == 0
    amax[unwritten] = amax[~unwritten].amax(dim=0)
    scales = (amax / FP8_MAX).clamp(min=1e-8).cpu()
    return {model.kv_scale_name(i): scales[i].clone() for i in range(scales.shape[0])}


def calibration_prompts(tokenizer_dir: Path, max_len: int) -> list[list[int]]:
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    limit = min(MAX_CALIBRATION_TOKENS, max_len)
    return [tokenizer.encode(text)[:limit] for text in CALIBRATION_TEXTS]
