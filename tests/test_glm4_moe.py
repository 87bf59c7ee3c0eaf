"""GLM-4-MoE (tiny, random, float32; GLM-4.5-Air's structure, and GLM-4.5's with QK-norm and grouped routing):
greedy decoding token for token equal to transformers' Glm4MoeForCausalLM in continuous batches (one prompt long
enough to be prefilled in chunks), under preemption, with prefix caching, over -tp 2 and -tp 2 --ep, and from a
compiled artifact; the checkpoint's MTP layer skipped with a log line and --method mtp refused; the config's fields
(GLM-4.5-Air's own config.json) and the fields that are refused by name."""
import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from atom_aot import LLMEngine
from atom_aot.errors import StartupError
from atom_aot.models import ModelConfig, model_class
from atom_aot.models.parallel import Split, check_splittable, rank_shapes
from atom_aot.weights.convert import build_meta_model, convert_state_dict
from atom_aot.weights.random_draw import parameter_shapes
from factories import hf_greedy, make_config_folder, random_prompts
from glm_factories import TINY_GLM_45, make_tiny_glm
from test_parity import MAX_NEW, check_shared_prefixes, engine_greedy

GLM_45_AIR = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "configs" / "glm-4.5-air.json"
VARIANTS = {"air": {}, "glm-4.5": TINY_GLM_45}
RANKS = dict(num_kv_blocks=64, num_threads=1)


@pytest.fixture(scope="module")
def glm(request, tmp_path_factory, build_artifact):
    """(model folder, eager artifact, 9 prompts (the last 200 tokens long), transformers' greedy tokens)."""
    model_dir = make_tiny_glm(tmp_path_factory.mktemp("glm") / request.param, seed=11, **VARIANTS[request.param])
    prompts = random_prompts(8, 380, seed=21) + random_prompts(1, 380, seed=22, lengths=(200, 200))
    return model_dir, build_artifact(model_dir, compile="none"), prompts, hf_greedy(model_dir, prompts, MAX_NEW)


class TestParity:
    @pytest.mark.parametrize("glm", sorted(VARIANTS), indirect=True)
    def test_batch_with_a_chunked_prompt_matches_hf(self, glm):
        _, artifact, prompts, expected = glm
        engine, got = engine_greedy(artifact, prompts)
        assert len(prompts[-1]) > engine.core.scheduler.config.max_num_batched_tokens     # prefilled in chunks
        assert got == expected

    @pytest.mark.parametrize("glm", ["air"], indirect=True)
    def test_preemption_and_chunked_prefill(self, glm):
        _, artifact, prompts, expected = glm
        engine, got = engine_greedy(artifact, prompts[:8], num_kv_blocks=10, max_num_batched_tokens=24,
                                    max_model_len=96)
        assert got == expected[:8]
        assert engine.core.scheduler.num_preemptions > 0

    @pytest.mark.parametrize("glm", ["glm-4.5"], indirect=True)
    def test_prefix_caching(self, glm):
        model_dir, artifact, _, _ = glm
        check_shared_prefixes(model_dir, artifact)

    @pytest.mark.parametrize("glm", ["air"], indirect=True)
    @pytest.mark.parametrize("ep", [False, True])
    def test_tensor_parallel_matches_hf(self, glm, build_artifact, ep):
        """-tp 2 (gloo, ranks as processes): 2 of the 4 heads and 1 of the 2 KV heads per rank (q/k/v biases
        split with their rows), half of the dense, shared-expert and (without --ep) every routed expert's
        width, or (--ep) 4 of the 8 experts whole; the router and its correction bias whole on both."""
        model_dir, _, prompts, expected = glm
        tp2 = build_artifact(model_dir, compile="none", tensor_parallel_size=2, enable_expert_parallel=ep)
        engine, got = engine_greedy(tp2, prompts[:5], **RANKS)
        engine.close()
        assert got == expected[:5]

    @pytest.mark.slow
    @pytest.mark.parametrize("glm", ["air"], indirect=True)
    def test_compiled_artifact_matches_hf(self, glm, build_artifact):
        """The AOTInductor build: the package keeps the ops whole and decodes like transformers."""
        model_dir, _, prompts, expected = glm
        engine, got = engine_greedy(build_artifact(model_dir, compile="aoti"), prompts)
        assert engine.loaded.manifest.compiled.kind == "aotinductor"
        assert got == expected


class TestMTPLayer:
    @pytest.mark.parametrize("glm", ["air"], indirect=True)
    def test_is_skipped_with_a_log_line(self, glm, caplog):
        model_dir = glm[0]
        cfg = ModelConfig.from_json(model_dir / "config.json")
        checkpoint = load_file(str(model_dir / "model.safetensors"))
        assert any(name.startswith("model.layers.3.") for name in checkpoint)           # the MTP layer is stored
        model = build_meta_model(model_class(cfg.architecture), cfg, torch.float32, "none", 64)
        with caplog.at_level(logging.INFO, logger="atom_aot"):
            state = convert_state_dict(checkpoint.items(), model, cfg, "none")
        assert "num_nextn_predict_layers=1; its MTP layer(s) are not built" in caplog.text
        assert "model.layers.3.*" in caplog.text
        assert not any(name.startswith("model.layers.3.") for name in state)

    @pytest.mark.parametrize("glm", ["air"], indirect=True)
    def test_method_mtp_is_refused_by_name(self, glm):
        with pytest.raises(StartupError, match=r"--method mtp: .*\(Glm4MoeForCausalLM\) is served without the 1 MTP"):
            LLMEngine(str(glm[1]), method="mtp", num_speculative_tokens=1)


class TestConfig:
    def test_glm_45_air_config(self):
        """GLM-4.5-Air's config.json: rope on 64 of each head's 128 dims, q/k/v biases, no QK-norm, one dense
        layer, 128 experts in one group (top-8) with a shared one; it splits over -tp 8 with or without --ep."""
        cfg = ModelConfig.from_json(GLM_45_AIR)
        cls = model_class(cfg.architecture)
        assert (cfg.head_dim, cls.rotary_dim(cfg), cfg.attention_bias, cfg.use_qk_norm) == (128, 64, True, False)
        assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob) == (128, 8, True)
        grouped = cfg.grouped_moe
        assert (grouped.n_group, grouped.topk_group, grouped.n_shared_experts, grouped.routed_scaling_factor) == (1, 1, 1, 1.0)
        assert [cfg.is_moe_layer(i) for i in range(3)] == [False, True, True]
        assert cfg.num_nextn_predict_layers == 1 and not cls.BUILDS_MTP_LAYERS
        for ep in (False, True):
            check_splittable(cfg, Split(8, ep))
        assert rank_shapes(cfg, Split(8, True)).num_experts == 16

    def test_a_two_layer_model_of_its_shapes(self):
        d = json.loads(GLM_45_AIR.read_text()) | {"num_hidden_layers": 2}
        cfg = ModelConfig.from_hf_dict(d)
        with torch.device("meta"):
            model = model_class(cfg.architecture)(cfg, torch.bfloat16, max_positions=4096)
        assert model.model.rotary.cos_sin_cache.shape == (4096, 64)
        assert model.model.layers[0].self_attn.qkv_proj.bias.shape == ((96 + 2 * 8) * 128,)
        assert model.model.layers[0].self_attn.q_norm is None
        moe = model.model.layers[1].mlp
        assert moe.experts.w13.shape == (128, 2 * 1408, 4096) and moe.shared_experts.down_proj.weight.shape == (4096, 1408)
        assert moe.gate.e_score_correction_bias.dtype == torch.float32

    def test_partial_rotary_factor_defaults_to_the_familys_half(self):
        """transformers' Glm4MoeConfig sets 0.5 when config.json names none (the top-level spelling of
        transformers 4 and the rope_parameters one of transformers 5 are both read)."""
        d = json.loads(GLM_45_AIR.read_text())
        del d["partial_rotary_factor"]
        cls = model_class(d["architectures"][0])
        assert cls.rotary_dim(ModelConfig.from_hf_dict(d)) == 64
        in_rope = d | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}}
        assert cls.rotary_dim(ModelConfig.from_hf_dict(in_rope)) == 32
        assert ModelConfig.from_hf_dict(in_rope).rope_scaling is None
        llama = dict(d, architectures=["LlamaForCausalLM"])
        assert model_class("LlamaForCausalLM").rotary_dim(ModelConfig.from_hf_dict(llama)) == 128

    @pytest.mark.parametrize("field,value,message", [
        ("hidden_act", "gelu", "hidden_act='gelu' is not supported"),
        ("scoring_func", "softmax", "scoring_func='softmax'"),
        ("moe_layer_freq", 2, "moe_layer_freq=2 is not supported"),
        ("n_group", 3, r"n_routed_experts \(128\) must be a multiple of n_group \(3\)"),
        ("topk_group", 2, r"topk_group \(2\) must be in 1..n_group \(1\)"),
        ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, "rope scaling type 'dynamic' is not supported"),
    ])
    def test_what_is_not_implemented_is_refused_by_name(self, field, value, message):
        with pytest.raises(ValueError, match=message):
            ModelConfig.from_hf_dict(json.loads(GLM_45_AIR.read_text()) | {field: value})

    def test_an_odd_rotary_dim_is_refused(self):
        cfg = ModelConfig.from_hf_dict(json.loads(GLM_45_AIR.read_text()) | {"partial_rotary_factor": 0.29})
        with pytest.raises(ValueError, match="rotates 37 of the head's 128 dims"):
            model_class(cfg.architecture).rotary_dim(cfg)

    def test_random_weights_have_no_mtp_layer_and_serve(self, tmp_path, build_artifact):
        """--load-format dummy draws transformers' parameters of the config, and no MTP layer, which this family
        does not build (DeepSeek's are drawn); the artifact decodes."""
        d = json.loads(GLM_45_AIR.read_text()) | dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                                      num_hidden_layers=2, num_attention_heads=4,
                                                      num_key_value_heads=2, head_dim=16, n_routed_experts=4,
                                                      num_experts_per_tok=2, vocab_size=384, pad_token_id=0)
        folder = make_config_folder(tmp_path / "glm", d)
        shapes = parameter_shapes(folder)
        assert "model.layers.1.mlp.gate.e_score_correction_bias" in shapes
        assert shapes["model.layers.0.self_attn.q_proj.bias"] == (64,)
        assert not any(name.startswith("model.layers.2.") for name in shapes)
        _, got = engine_greedy(build_artifact(folder, compile="none", load_format="dummy"), [[5, 6, 7]], max_new=4)
        assert len(got[0]) == 4
