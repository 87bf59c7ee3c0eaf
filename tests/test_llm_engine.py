"""The public `LLMEngine` (atom_aot/entrypoints/llm.py) on an eager tiny artifact: what it refuses
before loading anything, stop strings end to end, and the compile counter it always installs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from atom_aot import LLMEngine, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_llama_eager_artifact):
    return LLMEngine(str(tiny_llama_eager_artifact), num_kv_blocks=64)


@pytest.mark.parametrize("options", [dict(tensor_parallel_size=2), dict(kv_cache_dtype="fp8"), dict(quant="fp8"),
                                     dict(dtype="float16"), dict(compile="none", block_size=32)])
def test_build_options_with_an_artifact_are_refused_naming_atom_build(tiny_llama_eager_artifact, options):
    with pytest.raises(ValueError, match="atom-build") as info:
        LLMEngine(str(tiny_llama_eager_artifact), **options)
    assert all(name in str(info.value) for name in options)


def test_unknown_options_are_refused():
    with pytest.raises(TypeError, match="max_num_seq"):
        LLMEngine("any.atom", max_num_seq=4)


def test_runtime_options_are_checked_before_anything_loads(tmp_path):
    """The artifact does not even exist: the bad option is what is reported."""
    with pytest.raises(ValueError, match=r"max_num_seqs \(--max-num-seqs\) must be an integer >= 1, got 0"):
        LLMEngine(str(tmp_path / "missing.atom"), max_num_seqs=0)


def test_a_max_model_len_above_the_artifacts_is_refused_not_clamped(tiny_llama_eager_artifact):
    from atom_aot.artifact.reader import Artifact
    from atom_aot.errors import StartupError
    limit = Artifact.open(tiny_llama_eager_artifact).manifest.numerics.max_model_len
    with pytest.raises(StartupError, match=f"above this artifact's limit of {limit}"):
        LLMEngine(str(tiny_llama_eager_artifact), num_kv_blocks=64, max_model_len=limit + 1)
    assert LLMEngine(str(tiny_llama_eager_artifact), num_kv_blocks=64,
                     max_model_len=limit // 2).core.scheduler.config.max_model_len == limit // 2


def test_the_start_freezes_the_heap_and_close_unfreezes_it(tiny_llama_eager_artifact):
    import gc
    gc.unfreeze()
    engine = LLMEngine(str(tiny_llama_eager_artifact), num_kv_blocks=64)
    assert gc.get_freeze_count() > 1000          # the start's objects: out of the step loop's collections
    engine.close()
    assert gc.get_freeze_count() == 0            # so the close's collection sees the engine's cycles


def test_engines_space_out_full_collections_and_the_last_close_restores_them(tiny_llama_eager_artifact, monkeypatch):
    """Python's full collections (each walks every object made since the start, stalling the step loop) run 100x
    rarer while an engine of the process runs; the last close puts Python's default back; a threshold the process
    set itself is kept."""
    import gc
    from atom_aot.runtime import heap
    monkeypatch.setattr(heap._FullCollections, "engines", 0)      # engines other tests left open
    monkeypatch.setattr(heap._FullCollections, "before", None)
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, heap.PYTHON_FULL_COLLECTION_AFTER)
        first = LLMEngine(str(tiny_llama_eager_artifact), num_kv_blocks=64)
        second = LLMEngine(str(tiny_llama_eager_artifact), num_kv_blocks=64)
        assert gc.get_threshold() == (700, 10, heap.FULL_COLLECTION_AFTER)
        first.close()
        assert gc.get_threshold() == (700, 10, heap.FULL_COLLECTION_AFTER)      # the second still runs
        second.close()
        assert gc.get_threshold() == (700, 10, heap.PYTHON_FULL_COLLECTION_AFTER)
        gc.set_threshold(700, 10, 50)
        third = LLMEngine(str(tiny_llama_eager_artifact), num_kv_blocks=64)
        assert gc.get_threshold() == (700, 10, 50)
        third.close()
        assert gc.get_threshold() == (700, 10, 50)
    finally:
        gc.set_threshold(*before)


def test_a_prompt_token_outside_the_vocabulary_is_refused_and_the_engine_goes_on(engine):
    from atom_aot.errors import RequestError
    vocab = engine.loaded.model_config.vocab_size
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with pytest.raises(RequestError, match=f"prompt token id {vocab} is outside the model's vocabulary"):
        engine.generate([[3, 4], [3, vocab, 5]], greedy)               # all or none: the first is not queued
    assert engine.is_finished()
    [out] = engine.generate([[3, vocab - 1, 5]], greedy)
    assert out["num_tokens_output"] == 4 and engine.is_finished()


def test_a_stop_string_ends_the_request_and_frees_its_blocks(engine):
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    [free] = engine.generate([[3, 4, 5, 6]], greedy)
    text = free["text"]
    stop = text[len(text) // 2:][:3]
    assert stop.strip(), text
    [stopped] = engine.generate([[3, 4, 5, 6]], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                              stop_strings=[stop]))
    assert (stopped["finish_reason"], stopped["text"]) == ("stop", text[:text.find(stop)])
    assert stopped["num_tokens_output"] < 16
    assert engine.is_finished()
    assert engine.core.block_manager.num_free_blocks == engine.core.block_manager.num_blocks


HOOK_CALL = """
# what Triton calls after each JIT compilation; None here means nothing installed the counter
triton.knobs.runtime.jit_post_compile_hook(key="k", repr="kernel", fn=None, compile={}, is_manual_warmup=False,
                                          already_compiled=False)
"""
ENGINE_SCRIPT = """
import json, sys
from atom_aot import LLMEngine
from atom_aot.runtime.loading.compile_counter import compile_counts
engine = LLMEngine(sys.argv[1])
import triton
before = compile_counts()["triton_jit"]
""" + HOOK_CALL + """
print(json.dumps([before, compile_counts()["triton_jit"]]))
"""
LATE_IMPORT_SCRIPT = """
import importlib.util, json, sys
from atom_aot.runtime.loading.compile_counter import TRITON, compile_counts
TRITON.install()
assert "triton" not in sys.modules
importlib.util.find_spec("triton")   # how torch asks whether triton is there, without importing it
import triton
before = compile_counts()["triton_jit"]
""" + HOOK_CALL + """
print(json.dumps([before, compile_counts()["triton_jit"]]))
"""


def _run(script: str, *args: str) -> list[int]:
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                            env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_llm_engine_counts_triton_compilations_without_being_asked(tiny_llama_eager_artifact):
    """A fresh process that only makes an LLMEngine: its compile counts include Triton's."""
    pytest.importorskip("triton")
    assert _run(ENGINE_SCRIPT, str(tiny_llama_eager_artifact)) == [0, 1]


def test_the_counter_waits_for_a_triton_imported_after_it_was_installed():
    pytest.importorskip("triton")
    assert _run(LATE_IMPORT_SCRIPT) == [0, 1]
