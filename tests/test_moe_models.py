"""Qwen3-MoE and Mixtral: greedy decoding token for token equal to transformers (fp32, same weights),
in continuous batches, with prefix caching and under preemption; their config fields and the
build's expert stacking."""
import pytest
import torch

from atom_aot.models import ModelConfig, model_class
from atom_aot.weights.experts import ExpertStacker
from factories import hf_greedy
import factories

MAX_NEW = 24
FAMILIES = {    # name -> (architecture, config overrides)
    "qwen3moe-6x3-norm-dense1": ("Qwen3MoeForCausalLM", dict(num_experts=6, num_experts_per_tok=3,
                                                             moe_intermediate_size=32, norm_topk_prob=True,
                                                             mlp_only_layers=[1])),
    "qwen3moe-8x2-nonorm-step2": ("Qwen3MoeForCausalLM", dict(num_experts=8, num_experts_per_tok=2,
                                                              moe_intermediate_size=40, norm_topk_prob=False,
                                                              decoder_sparse_step=2)),
    "mixtral-8x2": ("MixtralForCausalLM", dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=48)),
    "mixtral-5x3": ("MixtralForCausalLM", dict(num_local_experts=5, num_experts_per_tok=3, intermediate_size=40)),
    # every layer slides (transformers' Qwen3-MoE applies the window to all), over a window shorter than most prompts
    "qwen3moe-6x2-window12": ("Qwen3MoeForCausalLM", dict(num_experts=6, num_experts_per_tok=2,
                                                          moe_intermediate_size=32, norm_topk_prob=True,
                                                          use_sliding_window=True, sliding_window=12)),
}


@pytest.fixture(scope="module")
def family(request, tmp_path_factory, build_artifact):
    """(model folder, eager artifact, 9 prompts, transformers' greedy tokens) of FAMILIES[request.param]."""
    architecture, overrides = FAMILIES[request.param]
    return factories.parity_case(tmp_path_factory.mktemp("moe") / request.param, architecture, build_artifact,
                                 MAX_NEW, seed=11, **overrides)


def engine_greedy(artifact, prompts, **config):
    return factories.engine_greedy(artifact, prompts, MAX_NEW, **config)


class TestParity:
    """Every family in one batch; preemption and prefix caching on one Qwen3-MoE and one Mixtral each."""

    @pytest.mark.parametrize("family", sorted(FAMILIES), indirect=True)
    def test_batch_matches_hf(self, family):
        _, artifact, prompts, expected = family
        assert engine_greedy(artifact, prompts)[1] == expected

    @pytest.mark.parametrize("family", ["qwen3moe-6x3-norm-dense1", "mixtral-8x2"], indirect=True)
    def test_preemption_and_chunked_prefill_match_hf(self, family):
        _, artifact, prompts, expected = family
        engine, got = engine_greedy(artifact, prompts, num_kv_blocks=10, max_num_batched_tokens=24, max_model_len=96)
        assert got == expected
        assert engine.core.scheduler.num_preemptions > 0

    @pytest.mark.parametrize("family", ["qwen3moe-8x2-nonorm-step2", "mixtral-5x3"], indirect=True)
    def test_prefix_caching_matches_hf(self, family):
        model_dir, artifact, _, _ = family
        engine, prompts, got = factories.prefix_cached_greedy(artifact, 8, MAX_NEW)
        assert got == hf_greedy(model_dir, prompts, MAX_NEW)
        assert engine.core.block_manager.prefix_hits >= 7 * (40 // 16)


class TestConfig:
    QWEN3_MOE = dict(architectures=["Qwen3MoeForCausalLM"], vocab_size=64, hidden_size=32, intermediate_size=48,
                     num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=6,
                     num_experts_per_tok=3, moe_intermediate_size=16, norm_topk_prob=True, decoder_sparse_step=2,
                     mlp_only_layers=[3], sliding_window=64, use_sliding_window=False, router_aux_loss_coef=0.001)

    def test_qwen3_moe_fields_and_dense_layers(self):
        cfg = ModelConfig.from_hf_dict(self.QWEN3_MOE)
        assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (6, 3, 16, True)
        assert cfg.sliding_window is None                   # use_sliding_window is false
        assert [cfg.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
        model = model_class(cfg.architecture)(cfg, torch.float32)
        assert type(model.model.layers[1].mlp).__name__ == "SparseMoeBlock"
        assert type(model.model.layers[3].mlp).__name__ == "GatedMLP"
        assert model.model.layers[1].mlp.experts.w13.shape == (6, 32, 32)
        assert model.model.layers[1].mlp.experts.w2.shape == (6, 32, 16)

    def test_mixtral_fields(self):
        cfg = ModelConfig.from_hf_dict(dict(self.QWEN3_MOE, architectures=["MixtralForCausalLM"], num_experts=None,
                                            num_local_experts=8, num_experts_per_tok=2, moe_intermediate_size=None,
                                            decoder_sparse_step=None, mlp_only_layers=None, norm_topk_prob=None))
        assert (cfg.num_experts, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (8, 48, False)
        assert all(cfg.is_moe_layer(i) for i in range(6))
        assert model_class(cfg.architecture)(cfg, torch.float32, max_positions=64).routing_renormalizes()

    def test_dense_configs_have_no_experts(self):
        cfg = ModelConfig.from_hf_dict({k: v for k, v in self.QWEN3_MOE.items() if "expert" not in k}
                                       | {"architectures": ["Qwen3ForCausalLM"]})
        assert cfg.num_experts == 0 and not any(cfg.is_moe_layer(i) for i in range(6))

    def test_sliding_window_applies_to_every_layer(self):
        cfg = ModelConfig.from_hf_dict(dict(self.QWEN3_MOE, use_sliding_window=True))
        model = model_class(cfg.architecture)(cfg, torch.float32, max_positions=128)
        assert [layer.self_attn.sliding_window for layer in model.model.layers] == [64] * 6

    def test_bad_top_k_refused(self):
        with pytest.raises(ValueError, match="num_experts_per_tok"):
            ModelConfig.from_hf_dict(dict(self.QWEN3_MOE, num_experts_per_tok=7))


class TestExpertStacker:
    MAPPING = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}
    EXPECTED = {"m.experts.w13": torch.empty(3, 4, 5, device="meta", dtype=torch.bfloat16),
                "m.experts.w2": torch.empty(3, 5, 2, device="meta", dtype=torch.bfloat16)}

    def test_out_of_order_parts_land_in_their_slices(self):
        stacker = ExpertStacker(self.MAPPING, self.EXPECTED)
        parts = {(e, p): torch.randn(2, 5) for e in range(3) for p in ("gate_proj", "up_proj")}
        for (e, p) in sorted(parts, reverse=True):
            assert stacker.add(f"m.experts.{e}.{p}.weight", parts[e, p])
        assert stacker.add("m.experts.0.down_proj.weight", torch.randn(5, 2))
        assert not stacker.add("m.gate.weight", torch.randn(3, 5))       # the router is no expert
        w13 = stacker.complete["m.experts.w13"]
        assert w13.dtype == torch.bfloat16 and stacker.incomplete == ["m.experts.w2"]
        for e in range(3):
            assert torch.equal(w13[e], torch.cat([parts[e, "gate_proj"], parts[e, "up_proj"]]).bfloat16())

    def test_transformers5_stacked_tensors_taken_whole(self):
        stacker = ExpertStacker(self.MAPPING, self.EXPECTED)
        w13, w2 = torch.randn(3, 4, 5), torch.randn(3, 5, 2)
        assert stacker.add("m.experts.gate_up_proj", w13) and stacker.add("m.experts.down_proj", w2)
        assert stacker.complete["m.experts.w13"] is w13 and stacker.complete["m.experts.w2"] is w2
        assert not stacker.add("other.experts.down_proj", w2)       # no such block in the model

    @pytest.mark.parametrize("name,shape", [("m.experts.3.gate_proj.weight", (2, 5)),     # no expert 3
                                            ("m.experts.0.gate_proj.weight", (4, 5))])    # the whole w13 row
    def test_misfit_refused(self, name, shape):
        with pytest.raises(ValueError, match="does not fit"):
            ExpertStacker(self.MAPPING, self.EXPECTED).add(name, torch.randn(shape))

    def test_duplicate_refused(self):
        stacker = ExpertStacker(self.MAPPING, self.EXPECTED)
        stacker.add("m.experts.1.up_proj.weight", torch.randn(2, 5))
        with pytest.raises(ValueError, match="once per expert"):
            stacker.add("m.experts.1.up_proj.weight", torch.randn(2, 5))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3moe-6x3-norm-dense1"], indirect=True)
def test_compiled_artifact_keeps_the_op_and_matches_hf(family, build_artifact):
    """AOTInductor keeps atom::fused_moe whole (the package calls it through the dispatcher) and the
    compiled artifact decodes like transformers (the family's model, prompts and reference tokens)."""
    model_dir, _, prompts, expected = family
    engine, got = engine_greedy(build_artifact(model_dir, compile="aoti"), prompts)
    assert engine.loaded.manifest.compiled.kind == "aotinductor"
    assert got == expected
