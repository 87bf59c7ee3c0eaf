"""GPT-OSS: greedy decoding token for token equal to transformers (fp32, same weights) through the engine, with
sliding windows shorter than the prompts, chunked prefill across the window, prefix-cache hits and preemption;
the triton backends inside the model equal the reference ones; how its config and weights are read and split."""
import pytest
import torch

from atom_aot.errors import BuildError
from atom_aot.models import ModelConfig, model_class
from atom_aot.models.parallel import Split
from atom_aot.weights.shard import shard_state_dict
import factories
from factories import hf_greedy

MAX_NEW = 20
SLIDING, FULL = "sliding_attention", "full_attention"
FAMILIES = {    # name -> config overrides (3 layers, 4 query heads over 2 kv heads of 16, 64 wide)
    # transformers' default layer types (sliding, full, sliding); a window inside one 16-token block
    "w8-6x2": dict(num_local_experts=6, num_experts_per_tok=2, intermediate_size=32, sliding_window=8,
                   swiglu_limit=1.0),
    # a window across blocks, two sliding layers first; top-3 of 5 experts
    "w20-5x3": dict(num_local_experts=5, num_experts_per_tok=3, intermediate_size=40, sliding_window=20,
                    layer_types=[SLIDING, SLIDING, FULL], swiglu_limit=1.5),
}


@pytest.fixture(scope="module")
def family(request, tmp_path_factory, build_artifact):
    """(model folder, eager artifact, 9 prompts, transformers' greedy tokens) of FAMILIES[request.param]."""
    return factories.parity_case(tmp_path_factory.mktemp("gpt-oss") / request.param, "GptOssForCausalLM",
                                 build_artifact, MAX_NEW, seed=3, lengths=(3, 70), **FAMILIES[request.param])


class TestParity:
    @pytest.mark.parametrize("family", sorted(FAMILIES), indirect=True)
    def test_batch_matches_hf(self, family):
        _, artifact, prompts, expected = family
        assert max(map(len, prompts)) > 3 * 20                 # prompts past every window
        assert factories.engine_greedy(artifact, prompts, MAX_NEW)[1] == expected

    @pytest.mark.parametrize("family", sorted(FAMILIES), indirect=True)
    def test_preemption_and_chunked_prefill_across_the_window_match_hf(self, family):
        """24-token chunks: a chunk's queries see keys of the chunk before (both windows reach back across it)."""
        _, artifact, prompts, expected = family
        engine, got = factories.engine_greedy(artifact, prompts, MAX_NEW, num_kv_blocks=10, max_num_batched_tokens=24,
                                             max_model_len=96)
        assert got == expected
        assert engine.core.scheduler.num_preemptions > 0

    @pytest.mark.parametrize("family", ["w20-5x3"], indirect=True)
    def test_prefix_cache_hits_match_hf(self, family):
        """The suffixes' windows reach into the cached prefix's blocks."""
        model_dir, artifact, _, _ = family
        engine, prompts, got = factories.prefix_cached_greedy(artifact, 6, MAX_NEW)
        assert got == hf_greedy(model_dir, prompts, MAX_NEW)
        assert engine.core.block_manager.prefix_hits >= 5 * (40 // 16)

    @pytest.mark.parametrize("family", ["w8-6x2"], indirect=True)
    def test_the_prompts_depend_on_the_window_and_the_sinks(self, family):
        """transformers' own greedy tokens change without the window, and without the sinks: the parity above
        checks both."""
        from transformers import AutoModelForCausalLM
        model_dir, _, prompts, expected = family
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

        def greedy():
            out = []
            for ids in prompts[:4]:
                with torch.no_grad():
                    tokens = model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                                            eos_token_id=None, pad_token_id=0)
                out.append(tokens[0, len(ids):].tolist())
            return out
        model.config.sliding_window = 10 ** 6
        assert greedy() != [e[:MAX_NEW] for e in expected[:4]]
        model.config.sliding_window = FAMILIES["w8-6x2"]["sliding_window"]
        for layer in model.model.layers:
            layer.self_attn.sinks.data.zero_()
        assert greedy() != [e[:MAX_NEW] for e in expected[:4]]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["w20-5x3"], indirect=True)
def test_compiled_artifact_matches_hf(family, build_artifact):
    """The AOTInductor package (attention and the MoE op with their new options, through the dispatcher) decodes
    like transformers."""
    model_dir, _, prompts, expected = family
    engine, got = factories.engine_greedy(build_artifact(model_dir, compile="aoti"), prompts, MAX_NEW)
    assert engine.loaded.manifest.compiled.kind == "aotinductor"
    assert got == expected


GPT_OSS = dict(architectures=["GptOssForCausalLM"], vocab_size=64, hidden_size=32, intermediate_size=16,
               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
               num_experts_per_tok=2, sliding_window=16, attention_bias=True, swiglu_alpha=1.702, swiglu_limit=7.0,
               max_position_embeddings=64)


class TestConfig:
    def test_windows_per_layer(self):
        cfg = ModelConfig.from_hf_dict(GPT_OSS)
        model = model_class(cfg.architecture)(cfg, torch.float32)
        assert [layer.self_attn.sliding_window for layer in model.model.layers] == [16, None, 16, None]
        given = ModelConfig.from_hf_dict(dict(GPT_OSS, layer_types=[FULL, SLIDING, SLIDING, FULL]))
        model = model_class(given.architecture)(given, torch.float32)
        assert [layer.self_attn.sliding_window for layer in model.model.layers] == [None, 16, 16, None]
        assert model.model.layers[0].self_attn.sinks.shape == (4,)

    def test_other_families_windows(self):
        qwen3 = dict(GPT_OSS, architectures=["Qwen3ForCausalLM"], use_sliding_window=True, max_window_layers=2)
        cfg = ModelConfig.from_hf_dict(qwen3)
        assert [model_class(cfg.architecture).layer_window(cfg, i) for i in range(4)] == [None, None, 16, 16]
        moe = ModelConfig.from_hf_dict(dict(qwen3, architectures=["Qwen3MoeForCausalLM"], num_experts=4,
                                            moe_intermediate_size=16))
        assert [model_class(moe.architecture).layer_window(moe, i) for i in range(4)] == [16] * 4    # every layer
        assert ModelConfig.from_hf_dict(dict(qwen3, use_sliding_window=False)).sliding_window is None
        llama = ModelConfig.from_hf_dict(dict(qwen3, architectures=["LlamaForCausalLM"]))
        with pytest.raises(BuildError, match="transformers' Llama has no sliding window"):
            model_class(llama.architecture)(llama, torch.float32)

    @pytest.mark.parametrize("fields,match", [(dict(layer_types=[FULL] * 3), "each of the 4 layers"),
                                              (dict(layer_types=["local"] * 4), "layer_types must name"),
                                              (dict(sliding_window=0), "sliding_window must be >= 1")])
    def test_bad_fields_refused(self, fields, match):
        with pytest.raises(ValueError, match=match):
            ModelConfig.from_hf_dict(dict(GPT_OSS, **fields))

    def test_swiglu_fields_default_as_in_transformers(self):
        cfg = ModelConfig.from_hf_dict({k: v for k, v in GPT_OSS.items() if k not in ("swiglu_alpha", "swiglu_limit")})
        experts = model_class(cfg.architecture)(cfg, torch.float32).model.layers[0].mlp.experts
        assert (experts.activation.alpha, experts.activation.limit) == (1.702, 7.0)
        given = ModelConfig.from_hf_dict(dict(GPT_OSS, swiglu_limit=3.0))
        assert model_class(given.architecture)(given, torch.float32).model.layers[0].mlp.experts.activation.limit == 3.0

    def test_mxfp4_stacks_have_their_rows_reordered_as_the_bf16_ones(self):
        """An MXFP4 checkpoint's blocks and scales (rows = outputs, gate and up interleaved) get gate's rows first,
        as the bf16 stacks and the biases do; down's pass on unchanged; anything else of the experts is refused."""
        cls, cfg = model_class("GptOssForCausalLM"), ModelConfig.from_hf_dict(GPT_OSS)
        rows = torch.arange(32, dtype=torch.uint8).view(1, 32, 1, 1).expand(4, 32, 1, 16).contiguous()
        tensors = dict(cls.adapt_checkpoint(cfg, [("m.experts.gate_up_proj_blocks", rows),
                                                  ("m.experts.down_proj_scales", rows[..., 0])]))
        assert tensors["m.experts.gate_up_proj_blocks"][0, :, 0, 0].tolist() == [*range(0, 32, 2), *range(1, 32, 2)]
        assert torch.equal(tensors["m.experts.down_proj_scales"], rows[..., 0])
        with pytest.raises(BuildError, match="not an expert tensor"):
            list(cls.adapt_checkpoint(cfg, [("m.experts.gate_up_proj_other", rows)]))


@pytest.mark.parametrize("family", ["w8-6x2"], indirect=True)
def test_tp2_and_ep2_greedy_equal_tp1(family, build_artifact):
    """Ranks as processes (gloo): each rank's heads and sinks, biases added once over the ranks' partial sums."""
    model_dir, artifact, prompts, _ = family
    greedy = dict(max_new=8, num_kv_blocks=64, num_threads=1)
    expected = factories.engine_greedy(artifact, prompts[:5], **greedy)[1]
    for layout in (dict(tensor_parallel_size=2), dict(tensor_parallel_size=2, enable_expert_parallel=True)):
        engine, got = factories.engine_greedy(build_artifact(model_dir, compile="none", **layout), prompts[:5],
                                              **greedy)
        engine.close()
        assert got == expected, layout


def test_tensor_parallel_ranks_split_sinks_and_add_biases_once():
    """Over two ranks: each holds its heads' sinks, o_proj's and the experts' down biases sit on rank 0 only (the
    partial sums add them once), the experts' gate/up biases split with their columns."""
    cfg = ModelConfig.from_hf_dict(GPT_OSS)
    whole = model_class(cfg.architecture)(cfg, torch.float32)
    for p in whole.parameters():
        torch.nn.init.normal_(p)
    state = whole.state_dict()
    ranks = [shard_state_dict(state, cfg, Split(tp=2), r) for r in (0, 1)]
    layer = "model.layers.1."
    assert torch.equal(torch.cat([r[layer + "self_attn.sinks"] for r in ranks]), state[layer + "self_attn.sinks"])
    for name in ("self_attn.o_proj.bias", "mlp.experts.w2_bias"):
        assert torch.equal(ranks[0][layer + name], state[layer + name])
        assert torch.equal(ranks[1][layer + name], torch.zeros_like(state[layer + name]))
    b13 = state[layer + "mlp.experts.w13_bias"]                  # [E, 2I]: gate's columns, then up's
    gate, up = b13.chunk(2, dim=1)
    assert torch.equal(ranks[1][layer + "mlp.experts.w13_bias"], torch.cat([gate[:, 8:], up[:, 8:]], dim=1))
    split = model_class(cfg.architecture)(cfg, torch.float32, split=Split(tp=2))
    assert {n: tuple(t.shape) for n, t in ranks[1].items()} == {n: tuple(t.shape) for n, t in split.state_dict().items()}


def test_mxfp4_experts_as_shipped_decode_as_transformers_does_on_their_dequantization(tmp_path, build_artifact):
    """GPT-OSS's released format: every layer's experts in mxfp4 bytes (fresh random ones, interleaved gate/up rows,
    with their bf16 biases), the rest unquantized; greedy equal to transformers on its own dequantization of them,
    a sliding window shorter than the prompts."""
    from mxfp4_checks import write_mxfp4_moe
    src = factories.make_tiny_model(tmp_path / "src", "GptOssForCausalLM", seed=4, num_local_experts=4,
                                    num_experts_per_tok=2, intermediate_size=32, sliding_window=8, swiglu_limit=1.0)
    mxfp4, reference = write_mxfp4_moe(src, tmp_path / "mxfp4", tmp_path / "reference", seed=5, router="router")
    artifact = build_artifact(mxfp4, compile="none")
    from safetensors.torch import load_file

    from atom_aot.artifact.reader import Artifact
    art = Artifact.open(artifact)
    weights = load_file(str(art.member_path("weights/rank0.safetensors")))
    assert art.manifest.quantization.weights == "mxfp4" and weights["model.layers.0.mlp.experts.w13"].dtype == torch.uint8
    prompts = factories.random_prompts(6, 380, seed=6, lengths=(3, 40))
    assert factories.engine_greedy(artifact, prompts, MAX_NEW)[1] == hf_greedy(reference, prompts, MAX_NEW)
