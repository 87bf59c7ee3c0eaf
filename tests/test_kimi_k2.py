"""Kimi-K2-class configs: DeepSeek-V3's architecture (`DeepseekV3ForCausalLM`) with model_type kimi_k2, one group
of many experts (n_group 1, topk_group 1), its own routed scaling and YaRN (beta_fast = beta_slow = 1), no MTP layer.
A tiny random one decodes greedy token for token equal to transformers' DeepseekV3ForCausalLM (one prompt prefilled
in chunks, prefix caching, -tp 2 --ep); its remote-code entries (config and tokenizer auto_map) do not trip the
build, and a tokenizer only remote code could load is refused saying so; Kimi-K2's own config.json parses, splits
and ropes as transformers does."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from atom_aot.build.config import BuildConfig
from atom_aot.build.pipeline import plan
from atom_aot.errors import BuildError
from atom_aot.models import ModelConfig, model_class
from atom_aot.models.parallel import Split, check_splittable, rank_shapes
from atom_aot.ops.rope import rope_attention_factor, rope_inverse_frequencies, yarn_softmax_scale
from atom_aot.weights.random_draw import parameter_shapes
from deepseek_factories import make_tiny_kimi
from factories import hf_greedy, make_config_folder, random_prompts
from test_parity import MAX_NEW, check_shared_prefixes, engine_greedy

KIMI_K2 = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "configs" / "kimi-k2.json"


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory):
    return make_tiny_kimi(tmp_path_factory.mktemp("models") / "tiny-kimi", seed=17)


@pytest.fixture(scope="module")
def kimi(kimi_dir, build_artifact):
    """(eager artifact, 7 prompts (the last 200 tokens long), transformers' greedy tokens)."""
    prompts = random_prompts(6, 380, seed=23) + random_prompts(1, 380, seed=24, lengths=(200, 200))
    return build_artifact(kimi_dir, compile="none"), prompts, hf_greedy(kimi_dir, prompts, MAX_NEW)


class TestParity:
    def test_batch_with_a_chunked_prompt_matches_hf(self, kimi):
        artifact, prompts, expected = kimi
        engine, got = engine_greedy(artifact, prompts)
        assert len(prompts[-1]) > engine.core.scheduler.config.max_num_batched_tokens     # prefilled in chunks
        assert got == expected

    def test_prefix_caching(self, kimi_dir, kimi):
        check_shared_prefixes(kimi_dir, kimi[0])

    def test_tensor_parallel_expert_parallel_matches_hf(self, kimi_dir, kimi, build_artifact):
        """-tp 2 --ep (gloo, ranks as processes): 16 of the 32 experts whole per rank, every token routed over
        all 32 (n_group 1) on both ranks."""
        _, prompts, expected = kimi
        ep2 = build_artifact(kimi_dir, compile="none", tensor_parallel_size=2, enable_expert_parallel=True)
        engine, got = engine_greedy(ep2, prompts[:5], num_kv_blocks=64, num_threads=1)
        engine.close()
        assert got == expected[:5]


class TestRemoteCode:
    def test_the_folder_builds_as_deepseek_v3(self, kimi_dir):
        """model_type kimi_k2 and the auto_map entries of config.json and tokenizer_config.json are not what the
        build reads: the architecture names the model class, tokenizer.json the tokenizer."""
        config = json.loads((kimi_dir / "config.json").read_text())
        assert config["model_type"] == "kimi_k2" and "AutoTokenizer" in json.loads(
            (kimi_dir / "tokenizer_config.json").read_text())["auto_map"]
        _, cfg, _, _ = plan(str(kimi_dir), BuildConfig(arch="cpu", compile="none"))
        assert cfg.architecture == "DeepseekV3ForCausalLM" and cfg.grouped_moe.n_group == 1

    def test_a_tokenizer_only_remote_code_loads_is_refused(self, kimi_dir, tmp_path):
        """Kimi-K2 as the Hub ships it: tiktoken.model and tokenization_kimi.py, no tokenizer.json."""
        folder = tmp_path / "kimi-hub-tokenizer"
        shutil.copytree(kimi_dir, folder)
        (folder / "tokenizer.json").unlink()
        (folder / "tiktoken.model").write_text("placeholder: what tokenization_kimi.py reads\n")
        with pytest.raises(BuildError, match=r"auto_map names tokenization_kimi.TikTokenTokenizer for AutoTokenizer, "
                                             r"which transformers loads only with trust_remote_code, and atom-aot "
                                             r"runs no remote code .* Put a tokenizer.json"):
            plan(str(folder), BuildConfig(arch="cpu", compile="none"))

    def test_random_weights_of_a_kimi_config(self, tmp_path):
        """--load-format dummy takes transformers' parameters of the architecture's config class (DeepseekV3Config):
        kimi_k2 is no transformers model type."""
        d = json.loads(KIMI_K2.read_text()) | dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                                   q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
                                                   qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=24,
                                                   vocab_size=384, bos_token_id=0, eos_token_id=1)
        shapes = parameter_shapes(make_config_folder(tmp_path / "kimi", d))
        assert shapes["model.layers.1.mlp.gate.weight"] == (24, 64)
        assert not any(name.startswith("model.layers.2.") for name in shapes)     # num_nextn_predict_layers 0


class TestConfig:
    def test_kimi_k2_config(self):
        """Kimi-K2's config.json: 384 experts in one group (top-8), 64 heads, routed scaling 2.827, no MTP layer;
        -tp 8 --ep gives each rank 48 experts (the MLA heads split 8 per rank)."""
        cfg = ModelConfig.from_json(KIMI_K2)
        grouped = cfg.grouped_moe
        assert (cfg.architecture, cfg.num_experts, cfg.num_experts_per_tok, cfg.num_attention_heads) == (
            "DeepseekV3ForCausalLM", 384, 8, 64)
        assert (grouped.n_group, grouped.topk_group, grouped.routed_scaling_factor, cfg.num_nextn_predict_layers) == (
            1, 1, 2.827, 0)
        check_splittable(cfg, Split(8, ep=True))
        assert rank_shapes(cfg, Split(8, ep=True)).num_experts == 48
        with torch.device("meta"):
            model = model_class(cfg.architecture)(ModelConfig.from_hf_dict(json.loads(KIMI_K2.read_text())
                                                                           | {"num_hidden_layers": 2}), torch.bfloat16)
        assert len(model.mtp) == 0 and model.model.layers[1].mlp.experts.w13.shape == (384, 4096, 7168)

    def test_its_yarn_rope_is_transformers(self):
        """beta_fast = beta_slow = 1 (a ramp of zero width, HF's guard), factor 32, mscale = mscale_all_dim = 1:
        the inverse frequencies, the cos/sin factor and the softmax scale as transformers computes them."""
        from transformers import DeepseekV3Config
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale
        d = json.loads(KIMI_K2.read_text())
        hf = DeepseekV3Config(**{k: v for k, v in d.items() if k not in ("auto_map", "model_type")})
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
        cfg = ModelConfig.from_hf_dict(d)
        ours = rope_inverse_frequencies(cfg.deepseek.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling_dict)
        assert torch.equal(ours, inv_freq)
        assert rope_attention_factor(cfg.rope_scaling_dict) == attention_factor
        scale = cfg.deepseek.qk_head_dim ** -0.5
        assert yarn_softmax_scale(scale, cfg.rope_scaling_dict) == pytest.approx(yarn_apply_mscale(hf.rope_parameters,
                                                                                                  scale), rel=1e-12)
