"""An INT8 W8A8 tiny model against its unquantized twin (same weights before quantization).

Metric (as tests/test_fp8_model.py): over every position of three prompts (101 positions), the
logits' relative error ||int8 - ref|| / ||ref|| and the top-1 agreement. Measured (seeds 5 and 6,
Qwen3 / Llama float32, Qwen3 bf16): W8A8 int8 2.3-3.2% with 92-99% agreement; its weights alone
1.6-2.4%; FP8 W8A8 on the same models 9-12% (int8 keeps 7 bits of mantissa per channel, e4m3 3).
"""
import pytest
import torch

from atom_aot.models.quant_layers import Int8Linear
from atom_aot.ops.fp8 import dequantize_weight
from model_factories import tiny_model
from test_fp8_model import compare, fp8_twin


class WeightOnlyGemm:
    """The weight-only baseline: the int8 weight widened, activations left as they are."""

    def __call__(self, x, weight, weight_scale, input_scale, bias):
        return torch.nn.functional.linear(x, dequantize_weight(weight, weight_scale).to(x.dtype), bias)


def int8_twin(model, dtype: torch.dtype, weight_only: bool = False):
    twin = fp8_twin(model, dtype, "int8")
    if weight_only:
        for module in twin.modules():
            if isinstance(module, Int8Linear):
                module.gemm = WeightOnlyGemm()
    return twin


@pytest.mark.parametrize("arch,dtype", [("Qwen3ForCausalLM", torch.float32), ("LlamaForCausalLM", torch.float32),
                                        ("Qwen3ForCausalLM", torch.bfloat16)])
def test_int8_logits_close_to_unquantized_twin(arch, dtype):
    model = tiny_model(seed=5, architectures=[arch]).to(dtype)
    rel, agree = compare(model, int8_twin(model, dtype), dtype)
    rel_weight_only, _ = compare(model, int8_twin(model, dtype, weight_only=True), dtype)
    rel_fp8, _ = compare(model, fp8_twin(model, dtype), dtype)
    assert rel < 0.05 and agree >= 0.9, (rel, agree)
    assert rel < 1.6 * rel_weight_only, (rel, rel_weight_only)
    assert rel < 0.5 * rel_fp8, (rel, rel_fp8)


def test_int8_model_runs_on_the_quantized_op():
    """Every decoder linear is an Int8Linear whose weight is int8 (the GEMM consumes int8, no bf16 copy)."""
    twin = int8_twin(tiny_model(seed=7), torch.float32)
    linears = [m for m in twin.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == 4 * twin.config.num_hidden_layers
    assert all(m.weight.dtype == torch.int8 and m.weight_scale.shape == (m.weight.shape[0],) for m in linears)


def test_export_keeps_the_int8_op():
    """torch.export keeps atom::int8_linear opaque (its fake impl gives the shapes), one call per linear."""
    from atom_aot.artifact.phase import Phase
    from atom_aot.build.export import export_model
    twin = int8_twin(tiny_model(seed=8), torch.float32)
    exported = export_model(twin, torch.float32, 16, 128, torch.device("cpu"), Phase.MIXED)
    calls = [n for n in exported.graph.nodes if n.target is torch.ops.atom.int8_linear.default]
    assert len(calls) == 4 * twin.config.num_hidden_layers


@pytest.mark.slow
def test_compiled_int8_artifact_matches_its_eager_twin(tiny_llama_dir, build_artifact):
    """AOTInductor compiles the int8 model (atom::int8_linear stays an extern call) and generates what
    the eager module generates."""
    from atom_aot import LLMEngine, SamplingParams
    from factories import random_prompts
    prompts = random_prompts(4, 380, seed=12)
    params = SamplingParams(temperature=0, max_tokens=12)
    outs = [[o["token_ids"] for o in LLMEngine(str(build_artifact(tiny_llama_dir, compile=c, quant="int8")))
             .generate(prompts, params)] for c in ("none", "aoti")]
    assert outs[0] == outs[1]
