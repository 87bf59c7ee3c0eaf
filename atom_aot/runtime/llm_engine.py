"""The offline Python API: `LLMEngine(model=...)`, `generate`, `add_request`, `step`, `is_finished`.

`model` may be an artifact (`.atom` file or folder) or a model (HF folder, GGUF file, or None for
the embedded default); a model is built into the artifact cache first, so both run one path.
"""
from __future__ import annotations

import itertools
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from atom_aot.arch import detect_arch
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.output_processor import OutputProcessor, RequestOutput, StreamCallback
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.startup import load_and_start
from atom_aot.runtime.tokenizer import apply_chat_template, encode_prompt, load_artifact_tokenizer

log = logging.getLogger("atom_aot")

BUILD_OPTIONS = {"dtype", "quant", "kv_cache_dtype", "capture_sizes", "block_size", "compile", "cache_dir",
                 "tensor_parallel_size"}


def is_artifact(path: str | Path | None) -> bool:
    if path is None:
        return False
    p = Path(path)
    return p.suffix == ".atom" or (p.is_dir() and (p / "manifest.json").exists())


def resolve_artifact(model: str | None, options: dict, max_model_len: int | None) -> Path:
    """An artifact path for `model`: itself, or the cached build of it for this machine."""
    if is_artifact(model):
        return Path(model)
    from atom_aot.build.cache import default_cache_dir
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.isolated import build_isolated
    from atom_aot.build.pipeline import check_arch_present, plan
    cache_dir = Path(options.pop("cache_dir", None) or default_cache_dir())
    config = BuildConfig(arch=detect_arch(), max_model_len=max_model_len, **options)
    check_arch_present(config.arch)
    _, _, key, _ = plan(model, config)
    result = build_isolated(model, config, cache_dir, key)
    log.info("artifact %s (%s)", result["path"], "cached" if result["cached"] else "built")
    return result["path"]


class LLMEngine:
    def __init__(self, model: str | None = None, **config):
        unknown = set(config) - BUILD_OPTIONS - RuntimeConfig.field_names()
        if unknown:
            raise TypeError(f"unknown LLMEngine options: {', '.join(sorted(unknown))}")
        build_options = {k: v for k, v in config.items() if k in BUILD_OPTIONS}
        self.config = RuntimeConfig(**{k: v for k, v in config.items() if k in RuntimeConfig.field_names()})
        self.artifact_path = resolve_artifact(model, build_options, self.config.max_model_len)
        # The tokenizer (parsing tokenizer.json, ~0.5 s for large vocabularies) loads beside the model.
        with ThreadPoolExecutor(1) as pool:
            tokenizer = pool.submit(load_artifact_tokenizer, self.artifact_path)
            self.loaded, self.core = load_and_start(self.artifact_path, self.config)
            self.tokenizer, self.loaded.timings["tokenizer (overlapped)"] = tokenizer.result()
        self.output_processor = OutputProcessor(self.tokenizer)
        self._request_ids = itertools.count()

    def apply_chat_template(self, messages: list[dict]) -> str:
        return apply_chat_template(self.tokenizer, messages)

    def add_request(self, prompt_or_tokens_list: list[str | list[int]],
                    sampling_params_list: SamplingParams | list[SamplingParams] | None = None,
                    stream_callback: StreamCallback | None = None) -> list[str]:
        """Queue prompts (strings or token-id lists); returns their request ids."""
        prompts = list(prompt_or_tokens_list)
        params = sampling_params_list if sampling_params_list is not None else SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        ids = []
        for prompt, p in zip(prompts, params):
            token_ids = encode_prompt(self.tokenizer, prompt)
            request_id = str(next(self._request_ids))
            self.core.add_request(token_ids, p, request_id)
            self.output_processor.add_request(request_id, token_ids, p, stream_callback)
            ids.append(request_id)
        return ids

    def abort(self, request_id: str) -> None:
        self.output_processor.abort(request_id)
        self.core.abort(request_id)

    def step(self) -> list[RequestOutput]:
        """One engine step; returns the updates of the requests that advanced."""
        updates, stopped = self.output_processor.process(self.core.step())
        for request_id in stopped:
            self.core.abort(request_id, reason="stop")
        return updates

    def is_finished(self) -> bool:
        return not self.core.has_unfinished()

    def generate(self, prompts: list[str | list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[dict]:
        """Run prompts to completion: one dict per prompt (text, token_ids, latency, finish_reason,
        num_tokens_input, num_tokens_output, ttft, tpot)."""
        ids = self.add_request(prompts, sampling_params)
        finished: dict[str, RequestOutput] = {}
        while not self.is_finished():
            for update in self.step():
                if update.finished:
                    finished[update.request_id] = update
        return [finished[i].as_dict() for i in ids]
