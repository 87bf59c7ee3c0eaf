"""`atom-build --load-format dummy`: random weights of the config's shapes, drawn at build time, as
vLLM's `--load-format dummy`. For benchmarks of models whose real weights are not on the machine:
speed does not depend on weight values, and a 61 GB model then needs one copy on disk (the
artifact), not two (a random checkpoint folder and the artifact).

`--load-format dummy-at-load` stores none of them (for models too big for the disk): the build draws
and uses them as `dummy` does (tuning, KV-scale calibration, export), but each rank's weights member
keeps only what a draw cannot reproduce (`stored_at_load`) and, in its metadata, the names and shapes in
the order drawn (`draw_order_metadata`); the runtime draws the rest on its device at every load through
`draw_rank_state`, the same functions the build ran, so the numbers are the same as a `dummy` artifact's
for the same config, seed and device type.

The names and shapes are transformers' own for the architecture (its model class built on the meta
device), so the build's usual checkpoint mapping reads them; tensors are drawn one at a time (on the
target's device) and handed over in host memory at build. The same (config, seed, std, device type)
always gives the same tensors, also as `scripts/make_random_model.py` writes them to a folder. The
manifest records `load_format` and `atom-run ART inspect` says the weights are random.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Iterator

import torch
import xxhash

from atom_aot.artifact.build_options import LOAD_FORMATS  # noqa: F401  (the one list; random_weights() tests it)
from atom_aot.dtypes import torch_dtype
from atom_aot.errors import ArtifactError, BuildError
from atom_aot.models import ModelConfig, model_class
from atom_aot.models.parallel import Split
from atom_aot.weights.convert import build_meta_model, converted_tensors
from atom_aot.weights.shard import shard_tensors

KV_SCALE = "self_attn.kv_scale"
DRAW_ORDER_KEY = "atom_draw_order"
DEFAULT_STD = 0.02
DEFAULT_SEED = 0


def parameter_shapes(folder: Path) -> dict[str, torch.Size]:
    """transformers' checkpoint names -> shapes for the folder's config.json, in its module order (a tied
    lm_head left out). Kept per config: a dummy-at-load build asks twice (the draw, the recorded order),
    and each answer costs transformers' model built on the meta device."""
    return dict(_parameter_shapes(Path(folder).resolve(), (Path(folder) / "config.json").read_text()))


@functools.lru_cache(maxsize=4)
def _parameter_shapes(folder: Path, config_text: str) -> dict[str, torch.Size]:
    """`config_text` (config.json's) keys the cache: a rewritten config is listed afresh."""
    architecture = ModelConfig.from_hf_dict(json.loads(config_text)).architecture
    hf_model_class = transformers_model_class(architecture)
    hf_config = hf_model_class.config_class.from_pretrained(folder)
    with torch.device("meta"):
        model = hf_model_class(hf_config)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    shapes = {name: meta.shape for name, meta in model.state_dict().items()
              if not (name == "lm_head.weight" and tied)}
    if not model_class(architecture).BUILDS_MTP_LAYERS:      # GLM-4-MoE: not built, so not drawn
        return shapes
    return {**shapes, **mtp_layer_shapes(hf_config, shapes)}


def transformers_model_class(architecture: str):
    """transformers' class of `architecture`, whose config class reads config.json whatever its model_type: Kimi-K2's
    `kimi_k2` is no transformers model type (its config class is remote code), and reads as DeepseekV3Config."""
    import transformers
    try:
        return getattr(transformers, architecture)
    except AttributeError:
        raise BuildError(f"transformers {transformers.__version__} has no {architecture}, whose parameter "
                            f"names and shapes random weights are drawn by") from None


def mtp_layer_shapes(hf_config, shapes: dict[str, torch.Size]) -> dict[str, torch.Size]:
    """DeepSeek's MTP layers (`num_nextn_predict_layers`), which transformers' model leaves out (it skips
    them when loading a checkpoint), named as the checkpoints hold them: layer num_hidden_layers + i has
    the last decoder layer's tensors (an MoE block) plus enorm, hnorm, eh_proj, embed_tokens, shared_head."""
    count = getattr(hf_config, "num_nextn_predict_layers", 0) or 0
    if not count:
        return {}
    hidden, vocab, layers = hf_config.hidden_size, hf_config.vocab_size, hf_config.num_hidden_layers
    last = f"model.layers.{layers - 1}."
    block = {name.removeprefix(last): shape for name, shape in shapes.items() if name.startswith(last)}
    own = {"enorm.weight": (hidden,), "hnorm.weight": (hidden,), "eh_proj.weight": (hidden, 2 * hidden),
           "embed_tokens.weight": (vocab, hidden), "shared_head.norm.weight": (hidden,),
           "shared_head.head.weight": (vocab, hidden)}
    return {f"model.layers.{layers + i}.{name}": torch.Size(shape)
            for i in range(count) for name, shape in {**block, **own}.items()}


DRAW_PIECE_ELEMENTS = 1 << 27     # float32 noise drawn at once: 512 MiB


def draw(name: str, shape: torch.Size, dtype: torch.dtype, generator: torch.Generator, std: float) -> torch.Tensor:
    """One random tensor on the generator's device: norm weights near 1 (as trained models have them),
    every other tensor normal with `std`. A large tensor is drawn in pieces of rows, so the float32 noise
    never needs twice the tensor's bf16 bytes (DeepSeek-V3's stacked experts of one layer: 15 GiB of bf16,
    30 GiB of noise at once, which ran a 141 GB GPU out of memory); a tensor of one piece is drawn as before."""
    device = generator.device
    out = torch.empty(shape, dtype=dtype, device=device)
    pieces = out.split(max(1, DRAW_PIECE_ELEMENTS // max(1, out[0].numel()))) if out.dim() > 1 else (out,)
    for piece in pieces:
        noise = torch.randn(piece.shape, generator=generator, device=device)
        piece.copy_(1 + 0.1 * noise if "norm" in name else std * noise)
    return out


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def draw_order_metadata(folder: Path) -> dict[str, str]:
    """The safetensors metadata of a dummy-at-load rank file: the names and shapes the build draws, in its
    order. A load draws from it without transformers (its import and meta model: 3.7 s on a CPU for
    Qwen3-0.6B's config; a draw at load took 6-9 s on the GPU machines, how much of it this was is not
    measured) and in the build's order even where another transformers version would list the parameters
    differently."""
    return {DRAW_ORDER_KEY: json.dumps([[name, list(shape)] for name, shape in parameter_shapes(folder).items()])}


def recorded_draw_order(metadata: dict[str, str]) -> dict[str, torch.Size] | None:
    """The draw order a rank file records (draw_order_metadata), or None for an artifact built without it."""
    if DRAW_ORDER_KEY not in metadata:
        return None
    try:
        order = json.loads(metadata[DRAW_ORDER_KEY])
        return {str(name): torch.Size([int(d) for d in shape]) for name, shape in order}
    except (ValueError, TypeError) as e:
        raise ArtifactError(f"the weights file's {DRAW_ORDER_KEY} metadata is not a list of [name, shape] "
                            f"({type(e).__name__}: {e}). Rebuild the artifact with atom-build.") from None


def random_tensors(folder: Path, dtype: torch.dtype, seed: int = DEFAULT_SEED, std: float = DEFAULT_STD,
                   device: str | torch.device | None = None, to_host: bool = True,
                   shapes: dict[str, torch.Size] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) one at a time, in transformers' order (or `shapes`', the order a build recorded):
    moved to host memory for the build, left on the device (`to_host=False`) when the runtime draws at load."""
    generator = torch.Generator(device=device or default_device()).manual_seed(seed)
    for name, shape in (parameter_shapes(folder) if shapes is None else shapes).items():
        tensor = draw(name, shape, dtype, generator, std)
        yield name, tensor.cpu() if to_host else tensor


def stored_at_load(state: dict[str, torch.Tensor], kv_scales: str) -> dict[str, torch.Tensor]:
    """What a dummy-at-load artifact stores of a rank's weights: only what a draw at load cannot reproduce,
    the fp8 KV cache's per-layer scales when the build calibrated them on the drawn model (`kv_scales` is
    the quantization plan's origin of the scales). Everything else follows from the config and seed."""
    if kv_scales != "calibrated":
        return {}
    return {name: tensor for name, tensor in state.items() if name.endswith(KV_SCALE)}


def draw_rank_state(config_dir: Path, dtype: torch.dtype, quant: str, max_positions: int, split: Split, rank: int,
                    device: torch.device, shapes: dict[str, torch.Size] | None = None) -> dict[str, torch.Tensor]:
    """Rank `rank`'s parameters as a --load-format dummy build of config_dir/config.json stores them, drawn and
    converted on `device` (random_tensors -> converted_tensors -> shard_tensors): one source tensor, or
    one layer's expert stack, at a time beside the rank's own weights."""
    hf_config = json.loads((config_dir / "config.json").read_text())
    cfg = ModelConfig.from_hf_dict(hf_config)
    model = build_meta_model(model_class(cfg.architecture), cfg, dtype, quant, max_positions)
    tensors = random_tensors(config_dir, config_dtype(hf_config), device=device, to_host=False, shapes=shapes)
    converted = converted_tensors(tensors, model, cfg, quant)
    state = dict(converted) if split.world_size == 1 else shard_tensors(converted, cfg, split, rank)
    return {name: tensor.to(device) for name, tensor in state.items()}    # the small CPU-made ones too


def config_dtype(config: dict) -> torch.dtype:
    name = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return torch_dtype(name)


def dummy_weights_hash(config: dict, device: str, seed: int = DEFAULT_SEED, std: float = DEFAULT_STD) -> str:
    """What the drawn weights depend on (stands for the weight files' hash in the build key): the same
    seed draws other numbers on another device type."""
    h = xxhash.xxh3_128()
    h.update(json.dumps({"load_format": "dummy", "config": config, "seed": seed, "std": std,
                         "device": torch.device(device).type}, sort_keys=True).encode())
    return h.hexdigest()
