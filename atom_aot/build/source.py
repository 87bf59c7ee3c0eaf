"""Model resolution: turn `--model` (an HF folder, a GGUF file, a Hub id, or nothing for the
default model) into one interface the rest of the build reads."""
from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
import xxhash

from atom_aot.artifact.build_options import random_weights
from atom_aot.build.hub import parse_hub_id, snapshot_folder
from atom_aot.errors import BuildError

log = logging.getLogger("atom_aot")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")


@dataclass
class ModelSource:
    name: str                     # short name for the artifact file name
    path: Path
    config: dict                  # HF config.json content
    generation_config: dict
    weight_files: list[Path]      # the files whose bytes are the weights (hashed for the build key)
    tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]]   # HF-named tensors, one at a time
    save_tokenizer: Callable[[Path], None]
    tokenizer_files: list[Path]   # hashed for the build key (a GGUF's tokenizer is inside its weights file)
    tensor_names: Callable[[], Iterable[str]]   # the HF names `tensors` gives, without reading the tensors

    def weights_hash(self) -> str:
        """xxh3-128 over the weight files' bytes: any changed value changes it."""
        h = xxhash.xxh3_128()
        for f in self.weight_files:
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    h.update(chunk)
        return h.hexdigest()

    def tokenizer_hash(self) -> str:
        h = xxhash.xxh3_128()
        for f in self.tokenizer_files:
            h.update(f.name.encode() + f.read_bytes())
        if not self.tokenizer_files:     # converted from GGUF metadata by transformers
            import transformers
            h.update(f"gguf-converted-by-transformers-{transformers.__version__}".encode())
        return h.hexdigest()


@dataclass
class DummySource(ModelSource):
    """--load-format dummy or dummy-at-load: the folder's config and tokenizer, random weights (weights/random_draw.py)."""
    device: str = "cpu"

    def weights_hash(self) -> str:
        from atom_aot.weights.random_draw import dummy_weights_hash
        return dummy_weights_hash(self.config, self.device)


def resolve_model(model: str | None, load_format: str = "auto", draw_device: str | None = None) -> ModelSource:
    """`draw_device`: where random weights are drawn (the target's device type; default: a GPU if there is one)."""
    if random_weights(load_format):
        return _dummy_source(model, load_format, draw_device)
    if model is None:
        from atom_aot.build.default_model import default_model_path
        model = default_model_path()
    if (hub_id := parse_hub_id(model)) is not None:
        return _named(_hf_folder_source(snapshot_folder(hub_id)), hub_id.name)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_source(path)
    if path.is_dir() and (path / "config.json").exists():
        return _hf_folder_source(path)
    if path.is_dir() and len(ggufs := sorted(path.glob("*.gguf"))) == 1:
        return _gguf_source(ggufs[0])
    raise FileNotFoundError(
        f"--model {model!r} is neither a Hugging Face model folder (with config.json and *.safetensors) "
        f"nor a .gguf file nor a Hugging Face Hub id (ORG/NAME[@REVISION]): pass a local path or an id, or omit "
        f"--model for the default model (SmolLM2-135M-Instruct).")


def _named(source: ModelSource, name: str) -> ModelSource:
    """A snapshot folder is named after a commit hash: the artifact is named after the repo instead."""
    source.name = name
    return source


def _dummy_source(model: str | None, load_format: str, draw_device: str | None) -> ModelSource:
    from atom_aot.weights.random_draw import config_dtype, default_device, parameter_shapes, random_tensors
    hub_id = parse_hub_id(model) if model else None
    path = snapshot_folder(hub_id, weights=False) if hub_id else Path(model).expanduser() if model else None
    if path is None or not (path / "config.json").is_file():
        raise FileNotFoundError(f"--load-format {load_format} needs --model to be a folder with config.json and a "
                                f"tokenizer (its weights, if any, are not read); got {model!r}")
    config, generation = _configs(path)
    device = draw_device or default_device()
    tokenizer_files, save_tokenizer = _tokenizer(path)
    return DummySource(hub_id.name if hub_id else path.name, path, config, generation, [],
                       lambda: random_tensors(path, config_dtype(config), device=device), save_tokenizer,
                       tokenizer_files, lambda: parameter_shapes(path).keys(), device=device)


def _configs(path: Path) -> tuple[dict, dict]:
    config = json.loads((path / "config.json").read_text())
    gen_file = path / "generation_config.json"
    return config, (json.loads(gen_file.read_text()) if gen_file.exists() else {})


def _tokenizer(path: Path) -> tuple[list[Path], Callable[[Path], None]]:
    tokenizer_files = [path / n for n in TOKENIZER_FILES if (path / n).exists()]
    _check_no_remote_code(path)
    if not any(f.name in ("tokenizer.json", "tokenizer.model") for f in tokenizer_files):
        raise FileNotFoundError(f"{path} has no tokenizer (tokenizer.json or tokenizer.model)")

    def save_tokenizer(out: Path):
        for f in tokenizer_files:
            shutil.copy(f, out / f.name)
    return tokenizer_files, save_tokenizer


def _check_no_remote_code(path: Path) -> None:
    """A tokenizer whose class is code shipped with the model (tokenizer_config.json's auto_map: Kimi-K2's tiktoken
    `TikTokenTokenizer`, which transformers loads only with trust_remote_code) is refused unless a tokenizer.json
    stands beside it: the runtime reads tokenizer.json (runtime/text/fast_tokenizer.py) and runs no model code."""
    config_file = path / "tokenizer_config.json"
    if not config_file.is_file():
        return
    remote = (json.loads(config_file.read_text()).get("auto_map") or {}).get("AutoTokenizer")
    if not remote:
        return
    names = ", ".join(n for n in (remote if isinstance(remote, list) else [remote]) if n)
    if (path / "tokenizer.json").is_file():
        log.info("tokenizer: %s's tokenizer_config.json names remote code (auto_map AutoTokenizer: %s), which is not "
                 "run; the tokenizer is read from its tokenizer.json", path.name, names)
        return
    raise BuildError(f"{path}'s tokenizer is code shipped with the model: tokenizer_config.json's auto_map names "
                     f"{names} for AutoTokenizer, which transformers loads only with trust_remote_code, and atom-aot "
                     f"runs no remote code (at build or at serve time). Put a tokenizer.json of the same vocabulary "
                     f"(the `tokenizers` library's format) in the folder: it is then read instead.")


def _hf_folder_source(path: Path) -> ModelSource:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights (pickled .bin checkpoints are not loaded; "
                                f"--load-format dummy builds random weights of the config's shapes)")
    config, generation = _configs(path)

    def tensors():
        from safetensors import safe_open
        for f in files:
            with safe_open(f, framework="pt") as fh:
                for name in fh.keys():
                    yield name, fh.get_tensor(name)

    def tensor_names():
        from safetensors import safe_open
        for f in files:
            with safe_open(f, framework="pt") as fh:     # the header only
                yield from fh.keys()

    tokenizer_files, save_tokenizer = _tokenizer(path)
    return ModelSource(path.name, path, config, generation, files, tensors, save_tokenizer, tokenizer_files,
                       tensor_names)


def _gguf_source(path: Path) -> ModelSource:
    from atom_aot.build.gguf_reader import read_gguf
    checkpoint = read_gguf(str(path))
    return ModelSource(path.stem, path, checkpoint.config, checkpoint.generation_config, [path],
                       checkpoint.tensors, lambda out: checkpoint.save_tokenizer(str(out)), [],
                       lambda: (name for name, _ in checkpoint.tensors()))
