"""MXFP4 experts on the CPU: the dequantization against an independent float64 reading (every code at every
exponent) and transformers', the reference `fused_moe` on mxfp4 stacks against float64 math, the checkpoint format
(config, tensors, refusals), the experts' split over ranks, and the build's tuning on mxfp4 experts."""
import pytest
import torch

from mxfp4_checks import (MOE_CONFIG, e2m1_float64, every_code_at_every_exponent, mxfp4_float64, mxfp4_problem,
                          naive_moe_biased, random_experts, random_mxfp4)
from triton_kernel_checks import rel_error

from atom_aot.artifact.manifest import Quantization
from atom_aot.errors import BuildError
from atom_aot.models import ModelConfig
from atom_aot.models.moe import MoEExperts
from atom_aot.models.parallel import Split
from atom_aot.ops.expert_formats import format_of
from atom_aot.ops.moe import fused_moe_reference
from atom_aot.ops.mxfp4 import FP4_VALUES, dequantize_mxfp4
from atom_aot.weights.experts import ExpertStacker, check_expert_only_model
from atom_aot.weights.quant_config import detect_checkpoint_quant, resolve_quant_plan
from atom_aot.weights.shard import shard_state_dict

GPT_OSS_QUANT = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                            "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}


class TestDequantize:
    def test_the_table_is_e2m1(self):
        assert FP4_VALUES == tuple(e2m1_float64(c) for c in range(16))

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_every_code_at_every_exponent_is_exact(self, dtype):
        """Exactly the float64 value rounded to `dtype` (which is no rounding: inf beyond the range, NaN at 255)."""
        blocks, scales = every_code_at_every_exponent()
        got = dequantize_mxfp4(blocks, scales, dtype)
        expected = mxfp4_float64(blocks, scales)
        assert got.dtype == dtype and got.shape == (256, 32)
        assert torch.equal(got.isnan(), expected.isnan()) and expected[255].isnan().all()
        rounded = expected.to(dtype).double()
        representable = rounded.isfinite()
        assert torch.equal(rounded[representable], expected[representable])     # no value is rounded, only inf
        assert torch.equal(got.double()[~expected.isnan()], rounded[~expected.isnan()])
        assert got[1].abs().min() == 0 and got[0][got[0] != 0].abs().min() == 2.0 ** -128    # e = 0: subnormals

    def test_nibble_order_low_first(self):
        blocks = torch.zeros(1, 16, dtype=torch.uint8)
        blocks[0, 0] = 0x21                      # k = 0: code 1 (0.5), k = 1: code 2 (1.0)
        blocks[0, 1] = 0x9F                              # k = 2: code 15 (-6), k = 3: code 9 (-0.5)
        got = dequantize_mxfp4(blocks, torch.full((1, 1), 128, dtype=torch.uint8), torch.float32)
        assert got[0, :4].tolist() == [1.0, 2.0, -12.0, -1.0]

    def test_transformers_reads_the_same_values(self):
        """transformers' own dequantization of GPT-OSS's tensors ([E, N, K/32, 16] blocks, transposed out) agrees
        for every exponent but 255 (NaN here, its ldexp makes 2^128)."""
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors
        g = torch.Generator().manual_seed(0)
        blocks, scales = random_mxfp4(3, 40, 64, (0, 255), g)
        scales[0, 0, 0], scales[0, 0, 1] = 0, 254
        theirs = convert_moe_packed_tensors(blocks.unflatten(-1, (2, 16)), scales, dtype=torch.float32)   # [E, K, N]
        assert torch.equal(dequantize_mxfp4(blocks, scales, torch.float32), theirs.transpose(1, 2))

    def test_mismatched_shapes_refused(self):
        with pytest.raises(ValueError, match="do not match"):
            dequantize_mxfp4(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8),
                             torch.float32)


def dequantized_stacks(stacks):
    return mxfp4_float64(stacks["w13"], stacks["w13_scale"]), mxfp4_float64(stacks["w2"], stacks["w2_scale"])


class TestReferenceOp:
    @pytest.mark.parametrize("tokens,experts,top_k,biases", [(1, 4, 2, False), (9, 6, 3, True), (33, 5, 1, True),
                                                              (4, 4, 4, False)])
    def test_matches_float64_over_the_dequantized_weights(self, tokens, experts, top_k, biases):
        x, stacks, weights, ids = mxfp4_problem(tokens, experts, top_k, seed=tokens, biases=biases)
        assert format_of(stacks["w13"], stacks["w13_scale"]).name == "mxfp4"
        got = fused_moe_reference(x, stacks["w13"], stacks["w2"], weights, ids, stacks["w13_scale"],
                                  stacks["w2_scale"], stacks.get("w13_bias"), stacks.get("w2_bias"))
        expected = naive_moe_biased(x, *dequantized_stacks(stacks), weights, ids, stacks.get("w13_bias"),
                                    stacks.get("w2_bias"))
        assert rel_error(got.double(), expected) < 1e-6

    def test_a_spread_of_exponents_with_extremes(self):
        """Exponents 0..140 (weights from 2^-128 to 6 * 2^13): tiny and huge weights side by side in one GEMM."""
        x, stacks, weights, ids = mxfp4_problem(7, 4, 2, seed=3, exponents=(0, 141))
        stacks["w13_scale"][0, :, 0], stacks["w2_scale"][1, :, 0] = 0, 140
        got = fused_moe_reference(x, stacks["w13"], stacks["w2"], weights, ids, stacks["w13_scale"],
                                  stacks["w2_scale"])
        assert got.isfinite().all()
        assert rel_error(got.double(), naive_moe_biased(x, *dequantized_stacks(stacks), weights, ids)) < 1e-6

    def test_experts_without_tokens_and_masked_ids(self):
        starve = torch.zeros(6)
        starve[[1, 4]] = -1e4
        x, stacks, weights, ids = mxfp4_problem(12, 6, 2, seed=5, router_bias=starve, biases=True)
        assert not set(ids.flatten().tolist()) & {1, 4}
        masked = torch.where(ids % 3 == 0, -1, ids)
        args = (stacks["w13_scale"], stacks["w2_scale"], stacks["w13_bias"], stacks["w2_bias"])
        got = fused_moe_reference(x, stacks["w13"], stacks["w2"], weights, masked, *args)
        expected = naive_moe_biased(x, *dequantized_stacks(stacks), weights, masked, stacks["w13_bias"],
                                    stacks["w2_bias"])
        assert rel_error(got.double(), expected) < 1e-6

    def test_bf16_activations(self):
        x, stacks, weights, ids = mxfp4_problem(10, 4, 2, seed=6)
        got = fused_moe_reference(x.bfloat16(), stacks["w13"], stacks["w2"], weights, ids, stacks["w13_scale"],
                                  stacks["w2_scale"])
        assert got.dtype == torch.bfloat16
        assert rel_error(got.double(), naive_moe_biased(x, *dequantized_stacks(stacks), weights, ids)) < 2e-2


class TestCheckpointFormat:
    def test_gpt_oss_config_is_the_mxfp4_scheme(self):
        quant = detect_checkpoint_quant({"quantization_config": GPT_OSS_QUANT})
        assert (quant.method, quant.scheme) == ("mxfp4", "mxfp4")
        assert quant.ignored == tuple(GPT_OSS_QUANT["modules_to_not_convert"])
        plan = resolve_quant_plan({"quantization_config": GPT_OSS_QUANT}, "none")
        assert (plan.scheme, plan.origin) == ("mxfp4", "checkpoint")
        with pytest.raises(BuildError, match="already quantized"):
            resolve_quant_plan({"quantization_config": GPT_OSS_QUANT}, "fp8")

    @pytest.mark.parametrize("extra,named", [({"dequantize": True}, "dequantize true"),
                                             ({"group_size": 32}, "group_size"),
                                             ({"modules_to_not_convert": ["model.layers.3.mlp.experts"]},
                                              "model.layers.3.mlp.experts")])
    def test_fields_not_implemented_are_refused_by_name(self, extra, named):
        with pytest.raises(BuildError, match=named):
            detect_checkpoint_quant({"quantization_config": {**GPT_OSS_QUANT, **extra}})
        detect_checkpoint_quant({"quantization_config": {**GPT_OSS_QUANT, "dequantize": False}})

    def test_manifest_says_the_linears_are_unquantized_and_the_experts_mxfp4(self):
        q = Quantization("mxfp4", weights_origin="checkpoint")
        assert set(q.groups.values()) == {"none"}
        assert q.experts.startswith("mxfp4: e2m1")

    def test_stacked_blocks_scales_and_biases_are_taken_whole(self):
        meta = MoEExperts(4, 64, 32, torch.float32, quant="mxfp4", bias=True).to("meta")
        expected = {f"m.experts.{k}": v for k, v in meta.state_dict().items()}
        stacker = ExpertStacker({"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}, expected)
        blocks = torch.randint(0, 256, (4, 64, 2, 16), dtype=torch.uint8)
        assert stacker.add("m.experts.gate_up_proj_blocks", blocks)
        assert stacker.add("m.experts.gate_up_proj_scales", torch.zeros(4, 64, 2, dtype=torch.uint8))
        assert stacker.add("m.experts.down_proj_bias", torch.zeros(4, 64))
        done = dict(stacker.take_complete())
        assert torch.equal(done["m.experts.w13"], blocks.flatten(-2)) and done["m.experts.w13"].shape == (4, 64, 32)
        assert set(done) == {"m.experts.w13", "m.experts.w13_scale", "m.experts.w2_bias"}

    def test_unquantized_experts_for_an_mxfp4_model_and_blocks_for_a_bf16_one_are_refused(self):
        mapping = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}
        mx = {f"m.experts.{k}": v for k, v in MoEExperts(4, 64, 32, torch.float32, quant="mxfp4").to("meta")
              .state_dict().items()}
        with pytest.raises(ValueError, match="stored unquantized"):
            ExpertStacker(mapping, mx).add("m.experts.gate_up_proj", torch.zeros(4, 64, 64))
        plain = {f"m.experts.{k}": v for k, v in MoEExperts(4, 64, 32, torch.float32).to("meta").state_dict().items()}
        with pytest.raises(ValueError, match="does not say so"):
            ExpertStacker(mapping, plain).add("m.experts.gate_up_proj_blocks",
                                              torch.zeros(4, 64, 2, 16, dtype=torch.uint8))


class TestBuildChecks:
    def test_a_model_without_experts_is_refused(self):
        dense = ModelConfig.from_hf_dict({**MOE_CONFIG, "architectures": ["Qwen3ForCausalLM"], "num_experts": 0})
        with pytest.raises(BuildError, match="has none"):
            check_expert_only_model(dense, Split(), "mxfp4", torch.bfloat16)

    def test_a_split_that_cuts_a_scale_block_is_refused_naming_ep(self):
        cfg = ModelConfig.from_hf_dict(MOE_CONFIG)
        check_expert_only_model(cfg, Split(2), "mxfp4", torch.bfloat16)          # 32 per rank: whole blocks
        check_expert_only_model(cfg, Split(4, ep=True), "mxfp4", torch.bfloat16)  # whole experts
        with pytest.raises(BuildError, match="--ep"):
            check_expert_only_model(cfg, Split(4), "mxfp4", torch.bfloat16)      # 16 per rank
        with pytest.raises(BuildError, match="--dtype bfloat16"):
            check_expert_only_model(cfg, Split(), "mxfp4", torch.float16)


@pytest.mark.parametrize("split", [Split(2), Split(2, ep=True)], ids=["tp2", "ep2"])
def test_the_ranks_partial_sums_add_up_to_the_whole_layer(split):
    """The build's shards of mxfp4 experts with biases (tp: each expert's width in whole scale blocks, w2's bias on
    rank 0; ep: whole experts), each run as its rank's MoEExperts: the partial sums add up to one rank's output."""
    whole = random_experts()
    x, _, weights, ids = mxfp4_problem(11, 4, 2, seed=9)
    state = {f"model.layers.0.mlp.experts.{k}": v for k, v in whole.state_dict().items()}
    cfg = ModelConfig.from_hf_dict(MOE_CONFIG)
    total = torch.zeros_like(x, dtype=torch.float64)
    for rank in range(2):
        part = MoEExperts(4, 64, 64, torch.float32, split, quant="mxfp4", bias=True)
        shard = shard_state_dict(state, cfg, split, rank)
        prefix = "model.layers.0.mlp.experts."
        part.load_state_dict({k.removeprefix(prefix): v for k, v in shard.items() if k.startswith(prefix)})
        total += part(x, weights, ids, deferred=True).double()
    assert rel_error(total, whole(x, weights, ids).double()) < 1e-6
