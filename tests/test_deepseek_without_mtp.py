"""A DeepSeek-V3 checkpoint as transformers' save_pretrained writes it: config.json counts one MTP layer
(num_nextn_predict_layers 1) and the weights hold none of its tensors (transformers' DeepseekV3ForCausalLM has
no MTP module). It builds without the MTP layer: the build log and the manifest say so, the KV cache has no MTP
cache layer and there is no mtp step, greedy decoding equals transformers', `inspect` shows it and `--method mtp`
is refused by name. A checkpoint with only some of the MTP tensors is refused, naming those it lacks."""
import json
import logging

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from atom_aot import LLMEngine, SamplingParams
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.reader import Artifact
from atom_aot.build.config import BuildConfig
from atom_aot.build.pipeline import plan
from atom_aot.errors import BuildError, StartupError
from atom_aot.runtime.inspect import describe
from atom_aot.runtime.loading.loader import load_artifact
from deepseek_factories import make_tiny_deepseek
from factories import hf_greedy, random_prompts
from test_parity import MAX_NEW, engine_greedy

MTP_PREFIX = "model.layers.4."        # the tiny DeepSeek's 4 decoder layers, then its MTP layer


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    model_dir = make_tiny_deepseek(tmp_path_factory.mktemp("models") / "tiny-deepseek-saved", seed=13,
                                   mtp_tensors=False)
    assert json.loads((model_dir / "config.json").read_text())["num_nextn_predict_layers"] == 1
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        assert not [name for name in f.keys() if name.startswith(MTP_PREFIX)]
    return model_dir


@pytest.fixture(scope="module")
def artifact(saved_dir, build_artifact) -> str:
    return str(build_artifact(saved_dir, compile="none"))


def test_the_build_log_says_the_checkpoint_has_no_mtp_tensors(saved_dir, caplog):
    with caplog.at_level(logging.INFO, logger="atom_aot"):
        _, model_config, _, _ = plan(str(saved_dir), BuildConfig(arch="cpu", compile="none"))
    assert model_config.num_nextn_predict_layers == 0
    lines = [r.getMessage() for r in caplog.records if "MTP" in r.getMessage()]
    assert len(lines) == 1
    assert "num_nextn_predict_layers=1" in lines[0] and "no MTP tensors (model.layers.4.*" in lines[0]


def test_the_artifact_holds_no_mtp_layer(artifact):
    assert Artifact.open(artifact).manifest.model.mtp_layers == 0
    loaded = load_artifact(artifact)
    assert loaded.model_config.num_nextn_predict_layers == 0 and Phase.MTP not in loaded.forwards
    assert not [name for name in loaded.weights if name.startswith("mtp.")]
    engine = LLMEngine(artifact, num_kv_blocks=8, max_model_len=128)
    assert engine.core.runner.kv_cache.shape[0] == 4           # the decoder's cache layers, no MTP cache layer
    row = [line for line in describe(Artifact.open(artifact)).splitlines() if line.startswith("mtp layers")]
    assert len(row) == 1 and "none: config.json has num_nextn_predict_layers=1" in row[0]
    assert "no MTP tensors" in row[0] and "--method mtp is refused" in row[0]


def test_greedy_decoding_equals_transformers(saved_dir, artifact):
    prompts = random_prompts(6, 380, seed=23)
    _, got = engine_greedy(artifact, prompts)
    assert got == hf_greedy(saved_dir, prompts, MAX_NEW)


def test_method_mtp_is_refused_by_name_and_ngram_serves(artifact):
    with pytest.raises(StartupError, match=r"--method mtp needs the model's MTP layers.*built without them.*"
                                           r"num_nextn_predict_layers=1.*no MTP tensors.*--method ngram.*--method draft"):
        LLMEngine(artifact, method="mtp", num_speculative_tokens=1)
    prompts, params = random_prompts(3, 380, seed=24), SamplingParams(temperature=0, max_tokens=8)
    ngram = LLMEngine(artifact, method="ngram", num_speculative_tokens=2)
    assert ([o["token_ids"] for o in ngram.generate(prompts, params)]
            == [o["token_ids"] for o in LLMEngine(artifact).generate(prompts, params)])


@pytest.mark.parametrize("dropped", [("eh_proj.weight",), ("mlp.experts.3.up_proj.weight", "shared_head.head.weight")])
def test_a_checkpoint_with_some_mtp_tensors_is_refused_naming_what_it_lacks(tmp_path, dropped):
    model_dir = make_tiny_deepseek(tmp_path / "tiny-deepseek-part-mtp", seed=13)
    weights = load_file(str(model_dir / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if k.removeprefix(MTP_PREFIX) not in dropped},
              str(model_dir / "model.safetensors"))
    with pytest.raises(BuildError, match=r"num_nextn_predict_layers=1 and the checkpoint holds some") as info:
        plan(str(model_dir), BuildConfig(arch="cpu", compile="none"))
    assert all(f"{MTP_PREFIX}{name}" in str(info.value) for name in dropped)
    assert "lacks" in str(info.value)
