"""The offline engine on one artifact: `generate`, `add_request`, `step`, `is_finished`.

Artifact-only: the public `atom_aot.LLMEngine` (atom_aot/entrypoints/llm.py) also takes a model
folder or GGUF, builds it into the artifact cache first, then runs this.
"""
from __future__ import annotations

import gc
import itertools
from pathlib import Path

import torch

from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.heap import restore_full_collections
from atom_aot.runtime.launch import launch
from atom_aot.runtime.profiler import TorchProfiler
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.text.output_processor import OutputProcessor, RequestOutput, StreamCallback
from atom_aot.runtime.text.tokenizer import apply_chat_template, encode_prompt, load_artifact_tokenizer


class ArtifactEngine:
    def __init__(self, artifact_path: str | Path, config: RuntimeConfig, profiler: TorchProfiler | None = None):
        """The core comes from the composition root (runtime/launch.py `launch`): this process's engine core, or
        the ranks of a data-parallel-attention artifact behind a client with its interface."""
        self.config = config
        self.profiler = profiler or TorchProfiler(None)
        self.artifact_path = Path(artifact_path)
        # The tokenizer (parsing tokenizer.json, ~0.5 s for large vocabularies) loads beside the model.
        tokenizer: list = []          # [tokenizer, seconds], filled beside the load
        self.loaded, self.core = launch(self.artifact_path, self.config,
                                        beside=lambda: tokenizer.extend(load_artifact_tokenizer(self.artifact_path)))
        self.tokenizer, self.loaded.timings["tokenizer (overlapped)"] = tokenizer
        self.output_processor = OutputProcessor(self.tokenizer, self._abort_stopped)
        self._request_ids = itertools.count()

    def apply_chat_template(self, messages: list[dict], **template_options) -> str:
        """`template_options` go to the template (e.g. enable_thinking=False for Qwen3's)."""
        return apply_chat_template(self.tokenizer, messages, **template_options)

    def start_profile(self) -> str:
        """Start the torch profiler (needs a torch_profiler_dir); returns the trace's folder."""
        return self.profiler.start()

    def stop_profile(self) -> str:
        """Stop the torch profiler; returns the gzipped trace written under <dir>/rank_0/."""
        return self.profiler.stop()

    def add_request(self, prompt_or_tokens_list: list[str | list[int]],
                    sampling_params_list: SamplingParams | list[SamplingParams] | None = None,
                    stream_callback: StreamCallback | None = None) -> list[str]:
        """Queue prompts (strings or token-id lists); returns their request ids. All or none: every prompt is
        checked before any is queued, so a refused one leaves nothing behind for the next call."""
        prompts = list(prompt_or_tokens_list)
        params = sampling_params_list if sampling_params_list is not None else SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        encoded = [encode_prompt(self.tokenizer, prompt) for prompt in prompts]
        for token_ids, p in zip(encoded, params):
            self.core.validate(token_ids, p)
        ids = []
        for token_ids, p in zip(encoded, params):
            request_id = str(next(self._request_ids))
            self.core.add_checked(token_ids, p, request_id)
            self.output_processor.add_request(request_id, token_ids, p, stream_callback)
            ids.append(request_id)
        return ids

    def abort(self, request_id: str) -> None:
        self.output_processor.abort(request_id)
        self.core.abort(request_id)

    def step(self) -> list[RequestOutput]:
        """One engine step; returns the updates of the requests that advanced. With async scheduling
        these are the previous step's (this one is launched first), so their detokenization runs
        while the device computes."""
        return self.output_processor.process(self.core.step())

    def close(self) -> None:
        """Stop the engine's other tensor-parallel ranks (process exit does it too) and give its device memory
        back (weights, KV cache, CUDA graphs), so another engine can start in this process; this one cannot
        run after."""
        if isinstance(self.core, ClosedCore):
            return
        self.core.close()
        self.core, self.loaded = ClosedCore(), None
        release_device_memory()

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

    def print_mtp_statistics(self) -> dict:
        """ATOM's name, for every speculative method: prints the acceptance of draft tokens (per
        position, totals, mean accepted length) and returns it as a dict."""
        counters = self.core.spec_counters
        if counters is None:
            raise RuntimeError("speculative decoding is off in this engine: start it with method='ngram' (or "
                               "'draft' with draft_model=ARTIFACT) and num_speculative_tokens=K")
        print(counters.format())
        return counters.summary()

    def _abort_stopped(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.core.abort(request_id, reason="stop")


class ClosedCore:
    """Stands in for the engine core after close(): any use says so."""

    def __getattr__(self, name: str):
        raise RuntimeError("this engine is closed (LLMEngine.close()): start a new one")


def release_device_memory() -> None:
    """Free what the closed engine held on the GPU: its objects (reference cycles included) and the blocks
    torch's allocator keeps cached for reuse, which other engines and processes would otherwise see as used
    (a second engine in one process found 29 of 150 GB free on an H200). The start froze its heap
    (runtime/heap.py freeze_startup_heap): unfrozen first, or the collection would not see the engine's cycles."""
    gc.unfreeze()
    restore_full_collections()
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
