"""Artifacts: the build key, the cache, and a runtime that never compiles (damaged and forged
artifacts: test_artifact_tampering.py; the manifest itself: test_manifest.py)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from atom_aot import LLMEngine, SamplingParams
from atom_aot.artifact.reader import Artifact
from atom_aot.build.config import BuildConfig
from atom_aot.build.pipeline import build, plan

PROMPTS = [[5, 17, 99, 23], list(range(40, 90)), [7] * 20, [300, 12, 45, 46, 47, 200, 1]]


def greedy(artifact, prompts=PROMPTS, max_tokens=20, **config):
    engine = LLMEngine(str(artifact), **config)
    return engine, [o["token_ids"] for o in engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))]


def key_of(model_dir, **options):
    return plan(str(model_dir), BuildConfig(arch="cpu", **options))[2]


class TestBuildKey:
    def test_unchanged_inputs_keep_the_key(self, tiny_llama_dir):
        assert key_of(tiny_llama_dir) == key_of(tiny_llama_dir)

    @pytest.mark.parametrize("options", [{"capture_sizes": (1, 2, 4)}, {"block_size": 32}, {"quant": "fp8"},
                                         {"max_model_len": 256}, {"compile": "none"}, {"kv_cache_dtype": "bf16"}])
    def test_each_build_option_changes_the_key(self, tiny_llama_dir, options):
        assert key_of(tiny_llama_dir, **options) != key_of(tiny_llama_dir)

    def test_one_weight_value_changes_the_key(self, tiny_llama_dir, tmp_path):
        copy = Path(shutil.copytree(tiny_llama_dir, tmp_path / "m"))
        weights = load_file(copy / "model.safetensors")
        name = "model.layers.1.mlp.up_proj.weight"
        weights[name][3, 7] += 1e-3
        save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
        assert key_of(copy) != key_of(tiny_llama_dir)

    def test_one_config_field_changes_the_key(self, tiny_llama_dir, tmp_path):
        copy = Path(shutil.copytree(tiny_llama_dir, tmp_path / "m"))
        config = json.loads((copy / "config.json").read_text())
        config["rms_norm_eps"] = 1e-5
        (copy / "config.json").write_text(json.dumps(config))
        assert key_of(copy) != key_of(tiny_llama_dir)

    def test_tokenizer_changes_the_key(self, tiny_llama_dir, tmp_path):
        copy = Path(shutil.copytree(tiny_llama_dir, tmp_path / "m"))
        cfg = json.loads((copy / "tokenizer_config.json").read_text())
        cfg["model_max_length"] = 77
        (copy / "tokenizer_config.json").write_text(json.dumps(cfg))
        assert key_of(copy) != key_of(tiny_llama_dir)

    def test_print_key_matches_the_manifest(self, tiny_llama_dir, tiny_llama_artifact):
        out = subprocess.run([sys.executable, "-m", "atom_aot.build.cli", "--model", str(tiny_llama_dir),
                              "--print-key"], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == Artifact.open(tiny_llama_artifact).manifest.build_key
        assert tiny_llama_artifact.name.endswith(out.stdout.strip()[:12] + ".atom")


class TestCache:
    def test_second_build_reuses_the_artifact(self, tiny_llama_dir, tiny_llama_artifact, artifact_cache):
        mtime = tiny_llama_artifact.stat().st_mtime_ns
        again = build(str(tiny_llama_dir), BuildConfig(arch="cpu"), cache_dir=artifact_cache, show_progress=False)
        assert again.cached and again.path == tiny_llama_artifact
        assert tiny_llama_artifact.stat().st_mtime_ns == mtime
        assert "export" not in again.seconds and "compile" not in again.seconds

    def test_folder_form_serves_the_same(self, tiny_llama_dir, tiny_llama_eager_artifact, tmp_path):
        folder = build(str(tiny_llama_dir), BuildConfig(arch="cpu", compile="none"), out=tmp_path / "art",
                       show_progress=False).path
        assert folder.is_dir() and (folder / "weights" / "rank0.safetensors").exists()
        assert greedy(folder)[1] == greedy(tiny_llama_eager_artifact)[1]


class TestCompiledArtifact:
    def test_compiled_equals_engine_core_path(self, tiny_llama_artifact):
        engine, compiled = greedy(tiny_llama_artifact)
        assert engine.loaded.execution == "aotinductor"
        eager_engine, eager = greedy(tiny_llama_artifact, enforce_eager=True)
        assert eager_engine.loaded.execution == "eager"
        assert compiled == eager

    def test_batch_of_one_and_single_token_prompt(self, tiny_llama_artifact):
        """Dynamic dims at their minimum: one sequence, one token."""
        assert greedy(tiny_llama_artifact, [[42]])[1] == greedy(tiny_llama_artifact, [[42]], enforce_eager=True)[1]

    def test_smollm2_gguf_compiled_equals_engine_core_path(self, smollm2_gguf, build_artifact):
        artifact = build_artifact(smollm2_gguf, compile="aoti")
        engine = LLMEngine(str(artifact))
        prompts = [engine.apply_chat_template([{"role": "user", "content": q}])
                   for q in ("What is the capital of France?", "Name three colors.")]
        params = SamplingParams(temperature=0, max_tokens=24)
        compiled = engine.generate(prompts, params)
        eager = LLMEngine(str(artifact), enforce_eager=True).generate(prompts, params)
        assert [o["token_ids"] for o in compiled] == [o["token_ids"] for o in eager]
        assert compiled[0]["text"].startswith("The capital of France is Paris")


RUNTIME_PROBE = """
import json, sys
from atom_aot import LLMEngine, SamplingParams
from atom_aot.runtime.loading.compile_counter import compile_counts, compilers_loaded
engine = LLMEngine(sys.argv[1])
engine.generate(["Hello there", [5, 6, 7]], SamplingParams(temperature=0, max_tokens=8))
if len(sys.argv) > 2:   # positive control: compile something, the counters must see it
    import torch         # a view: Dynamo and Inductor compile its graph, with no C++ kernel to build (~9 s saved)
    torch.compile(lambda x: x.view(2, 4))(torch.randn(8))
print(json.dumps({"counts": compile_counts(), "loaded": compilers_loaded(), "path": engine.loaded.execution}))
"""


class TestZeroCompile:
    def run_probe(self, artifact, *extra):
        out = subprocess.run([sys.executable, "-c", RUNTIME_PROBE, str(artifact), *extra], capture_output=True,
                             text=True, check=True, env={**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})
        return json.loads(out.stdout.strip().splitlines()[-1])

    def test_load_and_generate_compile_nothing(self, tiny_llama_artifact):
        result = self.run_probe(tiny_llama_artifact)
        assert result["path"] == "aotinductor"
        assert result["counts"] == {"dynamo_frames": 0, "inductor_compilations": 0, "triton_jit": 0}
        assert "torch._inductor" not in result["loaded"] and "torch._dynamo" not in result["loaded"]

    def test_counters_see_a_compilation(self, tiny_llama_artifact):
        result = self.run_probe(tiny_llama_artifact, "compile-something")
        assert result["counts"]["dynamo_frames"] >= 1 and result["counts"]["inductor_compilations"] >= 1
