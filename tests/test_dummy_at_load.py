"""`atom-build --load-format dummy-at-load`: the weights are drawn at every load, not stored. The
drawn weights must be, tensor for tensor, what a `--load-format dummy` build of the same config
stores (same seed, same device type); the artifact keeps only what a draw cannot reproduce."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from factories import make_config_folder, make_tokenizer
from safetensors.torch import load
from test_dummy_weights import CONFIG as TINY_MOE

from atom_aot.artifact.layout import weights_member
from atom_aot.artifact.reader import Artifact
from atom_aot.errors import ArtifactError
from atom_aot.runtime.inspect import describe
from atom_aot.runtime.loading.drawn_weights import draw_artifact_weights
from atom_aot.runtime.loading.loader import load_artifact
from atom_aot.runtime.loading.safetensors_view import metadata_of
from atom_aot.weights.random_draw import DRAW_ORDER_KEY, draw_order_metadata, recorded_draw_order

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17]]


@pytest.fixture(scope="module")
def moe_config_dir(tmp_path_factory) -> Path:
    """The tiny Qwen3-MoE config of test_dummy_weights.py with a tokenizer, no weights."""
    return make_config_folder(tmp_path_factory.mktemp("dummy-at-load") / "qwen3-moe-config", TINY_MOE)


@pytest.fixture(scope="module")
def deepseek_config_dir(tmp_path_factory) -> Path:
    """A tiny DeepSeek-V3 config (MLA, MoE, an MTP layer transformers leaves out) with a tokenizer."""
    from deepseek_factories import TINY_DEEPSEEK
    folder = tmp_path_factory.mktemp("dummy-at-load") / "deepseek-config"
    folder.mkdir()
    tokenizer = make_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps({
        **TINY_DEEPSEEK, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id, "eos_token_id": 2,
        "torch_dtype": "float32"}))
    return folder


def stored(path: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    """The tensors an artifact's weights member holds."""
    return load(Artifact.open(path).member_bytes(weights_member(rank)))


def assert_same_tensors(drawn: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert drawn.keys() == expected.keys()
    unequal = [n for n in expected if drawn[n].dtype != expected[n].dtype or not torch.equal(drawn[n], expected[n])]
    assert not unequal, unequal[:5]


def pair(build_artifact, model: Path, **options) -> tuple[Path, Path]:
    """A --load-format dummy and a --load-format dummy-at-load artifact of the same config and options."""
    return tuple(build_artifact(model, compile="none", load_format=f, **options) for f in ("dummy", "dummy-at-load"))


@pytest.mark.parametrize("model", ["tiny_qwen3_dir", "moe_config_dir", "deepseek_config_dir"])
def test_drawn_weights_are_the_dummy_artifact_s(model, request, build_artifact):
    dummy, at_load = pair(build_artifact, request.getfixturevalue(model))
    loaded = load_artifact(at_load)
    assert_same_tensors(loaded.weights, stored(dummy))
    assert loaded.timings["draw weights"] > 0 and loaded.execution == "eager"


def test_greedy_output_is_the_dummy_artifact_s(moe_config_dir, build_artifact):
    from atom_aot import LLMEngine, SamplingParams
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = [[o["token_ids"] for o in LLMEngine(path).generate(PROMPTS, params)]
            for path in pair(build_artifact, moe_config_dir)]
    assert outs[0] == outs[1] and all(len(t) == 8 for t in outs[0])


def test_the_artifact_stores_no_weights_and_is_keyed_apart(tiny_qwen3_dir, build_artifact):
    dummy, at_load = pair(build_artifact, tiny_qwen3_dir)
    assert "-dummy-at-load-" in at_load.name and "-dummy-cpu-" in dummy.name
    art = Artifact.open(at_load)
    assert art.manifest.build_key != Artifact.open(dummy).manifest.build_key
    assert stored(at_load) == {}
    recorded = draw_order_metadata(tiny_qwen3_dir)
    assert metadata_of(art.member_buffer(weights_member(0))) == recorded      # the draw order, in the header
    assert art.manifest.members[weights_member(0)].size < 100 + 2 * len(recorded[DRAW_ORDER_KEY])   # escaped in the header
    art.verify(full=True)
    assert "--load-format dummy-at-load" in art.manifest.rebuild_command()


def test_a_load_draws_in_the_recorded_order_without_asking_transformers(moe_config_dir, build_artifact, monkeypatch):
    """transformers' import and meta model took 4-9 s of each such start on the GPU machines."""
    from atom_aot.weights import random_draw as dummy
    dummy_art, at_load = pair(build_artifact, moe_config_dir, tensor_parallel_size=2, enable_expert_parallel=True)

    def asked(folder):
        raise AssertionError("the load asked transformers for the parameters")
    monkeypatch.setattr(dummy, "parameter_shapes", asked)
    for rank in (0, 1):
        assert_same_tensors(load_artifact(at_load, rank=rank).weights, stored(dummy_art, rank))


def test_an_artifact_without_a_recorded_order_draws_in_transformers_order_and_says_so(moe_config_dir,
                                                                                      build_artifact, caplog):
    dummy_art, at_load = pair(build_artifact, moe_config_dir)
    with caplog.at_level("INFO", logger="atom_aot"):
        drawn = draw_artifact_weights(Artifact.open(at_load), 0, torch.device("cpu"), {}, metadata={})
    assert_same_tensors(drawn, stored(dummy_art))
    assert "does not record its draw order" in caplog.text


@pytest.mark.parametrize("bad", ["not json", '[["a.weight", ["x"]]]', '{"a": 1}', '[["a.weight"]]'])
def test_a_malformed_recorded_order_is_refused_by_name(bad):
    with pytest.raises(ArtifactError, match=DRAW_ORDER_KEY):
        recorded_draw_order({DRAW_ORDER_KEY: bad})


def test_inspect_says_the_weights_are_drawn_at_load(tiny_qwen3_dir, build_artifact):
    dummy, at_load = pair(build_artifact, tiny_qwen3_dir)
    text = describe(Artifact.open(at_load))
    assert "RANDOM weights, not stored: drawn on the device at every load (--load-format dummy-at-load)" in text
    assert "no model weights: only what a draw at load cannot reproduce" in text
    assert "RANDOM weights (--load-format dummy)" in describe(Artifact.open(dummy))
    assert "sampling     top-p / min-p masks by sorting the vocabulary (torch; the artifact has no `sample` package)" \
        in text                                                 # a CPU artifact: no Triton kernel to package


def test_fp8_calibrated_kv_scales_are_stored_and_used(tiny_qwen3_dir, build_artifact):
    dummy, at_load = pair(build_artifact, tiny_qwen3_dir, quant="fp8", kv_cache_dtype="fp8")
    scales = stored(at_load)
    expected = stored(dummy)
    assert scales and all(n.endswith("self_attn.kv_scale") for n in scales)
    assert_same_tensors(scales, {n: expected[n] for n in scales})
    assert not all(torch.equal(t, torch.ones(2)) for t in scales.values())      # calibrated, not the default
    loaded = load_artifact(at_load)
    assert_same_tensors(loaded.weights, expected)
    assert any(t.dtype == torch.float8_e4m3fn for t in loaded.weights.values())


@pytest.mark.parametrize("model, ep", [("tiny_qwen3_dir", False), ("moe_config_dir", True)])
def test_a_tensor_parallel_rank_draws_its_own_part(model, ep, request, build_artifact):
    dummy, at_load = pair(build_artifact, request.getfixturevalue(model), tensor_parallel_size=2,
                          enable_expert_parallel=ep)
    for rank in (0, 1):
        assert_same_tensors(load_artifact(at_load, rank=rank).weights, stored(dummy, rank))
