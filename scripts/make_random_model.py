"""Write a Hugging Face model folder with random weights of a real architecture's shapes.

No weights can be downloaded on the GPU machine; performance of dense models does not depend on
weight values, and correctness is checked against transformers on the same random weights.
Tensors are drawn one at a time on the chosen device (fast even for 8B) from the parameter names
and shapes of transformers' own model class, built on the meta device (the same draw as
`atom-build --load-format dummy`, atom_aot/weights/random_draw.py), and written in shards of at
most --shard-gb (with transformers' model.safetensors.index.json when there are several), so host
memory holds one shard at a time: a 61 GB Qwen3-30B-A3B is written on a 128 GB machine.

  python scripts/make_random_model.py --config CONFIG.json --tokenizer TOKENIZER_DIR --out DIR [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from atom_aot.ops.fp8 import quantize_weight_blocks
from atom_aot.weights.experts import STACKED_TENSOR
from atom_aot.weights.random_draw import DEFAULT_SEED, DEFAULT_STD, parameter_shapes, random_tensors


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, type=Path, help="a config.json of the architecture")
    p.add_argument("--tokenizer", type=Path, help="folder with tokenizer.json (+ tokenizer_config.json)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--std", type=float, default=0.02, help="std of the normal the matrices are drawn from")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--override", default="{}", help="JSON of config fields to change (e.g. fewer layers)")
    p.add_argument("--shard-gb", type=float, default=4.0, help="the most bytes of one safetensors file, in GiB")
    p.add_argument("--hub-expert-names", action="store_true",
                   help="write stacked experts one tensor per expert, as checkpoints on the Hub name them (vLLM "
                        "loads those; transformers 5 and atom-build read both)")
    p.add_argument("--fp8-blocks", action="store_true",
                   help="write the linear weights as DeepSeek ships its FP8 checkpoints: e4m3 with a float32 "
                        "`weight_scale_inv` per 128x128 block (experts one tensor per expert: needs "
                        "--hub-expert-names), embeddings, lm_head, routers and norms as drawn, and the config's "
                        "quantization_config saying so")
    args = p.parse_args(argv)
    if args.fp8_blocks and not args.hub_expert_names:
        p.error("--fp8-blocks writes each expert's weights as a tensor of its own: add --hub-expert-names")
    return args


# the 2-d weights DeepSeek-V3's FP8 checkpoint keeps in bf16: the embeddings, the output heads and the routers
FP8_KEPT_MODULES = ("embed_tokens", "lm_head", "gate", "head")
FP8_BLOCK_CONFIG = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                    "weight_block_size": [128, 128]}


def make_random_model(config_path: Path, out: Path, tokenizer: Path | None = None, dtype: str = "bfloat16",
                      device: str = "cpu", std: float = DEFAULT_STD, seed: int = DEFAULT_SEED,
                      override: dict | None = None, shard_bytes: int = 4 << 30, hub_expert_names: bool = False,
                      fp8_blocks: bool = False) -> Path:
    """The same tensors `atom-build --load-format dummy` draws for this config on `device` (weights/random_draw.py);
    `fp8_blocks`: those tensors block-quantized as DeepSeek's FP8 checkpoints hold them."""
    out.mkdir(parents=True, exist_ok=True)
    config_dict = {**json.loads(config_path.read_text()), **(override or {}), "torch_dtype": dtype}
    (out / "config.json").write_text(json.dumps(config_dict, indent=1))
    shapes = parameter_shapes(out)
    if fp8_blocks:       # after the draw's listing: transformers would build an FP8 model for the listing
        config_dict["quantization_config"] = FP8_BLOCK_CONFIG
        (out / "config.json").write_text(json.dumps(config_dict, indent=1))
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    shards = plan_shards({name: shape.numel() * itemsize for name, shape in shapes.items()}, shard_bytes)
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))] \
        if len(shards) > 1 else ["model.safetensors"]
    tensors = random_tensors(out, getattr(torch, dtype), seed, std, device)
    weight_map, total_size = {}, 0
    for names, file in zip(shards, files):
        shard = dict(next(tensors) for _ in names)
        assert list(shard) == names
        if hub_expert_names:
            shard = dict(item for name, tensor in shard.items() for item in per_expert(name, tensor))
        if fp8_blocks:
            shard = dict(item for name, tensor in shard.items() for item in fp8_block_weights(name, tensor))
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
        total_size += sum(t.numel() * t.element_size() for t in shard.values())
        del shard
    if len(files) > 1:          # transformers' and vLLM's index of a sharded checkpoint
        index = {"metadata": {"total_size": total_size},
                 "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    eos = config_dict.get("eos_token_id")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": config_dict.get("bos_token_id"),
                                                            "eos_token_id": eos}, indent=1))
    if tokenizer is not None:
        for f in tokenizer.iterdir():
            if f.is_file() and f.name != "LICENSE":
                shutil.copy(f, out / f.name)
    return out


def fp8_block_weights(name: str, tensor: torch.Tensor):
    """A linear's 2-d weight as e4m3 and its `weight_scale_inv` [ceil(N/128), K/128] (atom_aot/ops/fp8.py
    quantize_weight_blocks); the tensors DeepSeek keeps in bf16, and every other, as they are."""
    module, _, leaf = name.rpartition(".")
    if leaf != "weight" or tensor.dim() != 2 or module.rpartition(".")[2] in FP8_KEPT_MODULES:
        yield name, tensor
        return
    q, scale = quantize_weight_blocks(tensor)
    yield name, q
    yield f"{module}.weight_scale_inv", scale


def per_expert(name: str, tensor: torch.Tensor):
    """transformers 5's stacked `<block>.experts.gate_up_proj` [E, 2I, H] (gate rows, then up rows: its
    conversion concatenates them so) and `down_proj` [E, H, I] as the Hub's per-expert tensors; others as they are."""
    match = STACKED_TENSOR.fullmatch(name)
    if match is None:
        yield name, tensor
        return
    block, half = match["block"], tensor.shape[1] // 2
    for e in range(tensor.shape[0]):
        if match["proj"] == "gate_up_proj":
            yield f"{block}.{e}.gate_proj.weight", tensor[e, :half].clone()
            yield f"{block}.{e}.up_proj.weight", tensor[e, half:].clone()
        else:
            yield f"{block}.{e}.down_proj.weight", tensor[e].clone()


def plan_shards(sizes: dict[str, int], shard_bytes: int) -> list[list[str]]:
    """Tensor names in order, cut into shards of at most shard_bytes (a larger tensor alone in its own)."""
    shards, current, total = [], [], 0
    for name, size in sizes.items():
        if current and total + size > shard_bytes:
            shards.append(current)
            current, total = [], 0
        current.append(name)
        total += size
    return shards + ([current] if current else [])


if __name__ == "__main__":
    a = parse_args()
    path = make_random_model(a.config, a.out, a.tokenizer, a.dtype, a.device, a.std, a.seed, json.loads(a.override),
                             int(a.shard_gb * (1 << 30)), a.hub_expert_names, a.fp8_blocks)
    print(path)
