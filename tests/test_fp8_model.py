"""An FP8 W8A8 tiny model against its unquantized twin (same weights before quantization).

Metric: over every position of three prompts (prefill, all logits returned), the logits' relative
error ||fp8 - ref|| / ||ref|| and the top-1 agreement (share of positions whose argmax is the same).
A random tiny model has no structure to absorb rounding and many near-tied logits, so even the
weights alone in FP8 move its logits by 7-9% (measured); the bound that matters is that quantizing
the activations too adds little on top of that (W8A8 error < 1.6x the weight-only error).
"""
import pytest
import torch

from atom_aot.models.quant_layers import Fp8Linear
from atom_aot.ops.fp8 import dequantize_weight
from atom_aot.weights.convert import quantize_weights
from atom_aot.weights.kv_scales import prefill_inputs
from model_factories import tiny_model

LENGTHS = (48, 33, 20)


def prefill_step(model, kv_dtype: torch.dtype, seed: int = 0):
    """Random prompts of LENGTHS in one step from an empty cache, with logits for every token."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]
    return prefill_inputs(model.config, prompts, kv_dtype, "cpu", logits="all")


def fp8_twin(model, dtype: torch.dtype, quant: str = "fp8"):
    """`model` with its decoder linears quantized as `atom-build --quant fp8` (or `quant`) does."""
    cls = type(model)
    with torch.device("meta"):
        twin = cls(model.config, dtype, quant, model.model.rotary.cos_sin_cache.shape[0])
    expected = twin.state_dict()
    state = {name: t.to(expected[name].dtype) for name, t in quantize_weights(model.state_dict(), expected, quant)}
    twin.load_state_dict(state, assign=True)
    return twin.eval()


class WeightOnlyGemm:
    """The weight-only baseline: the FP8 weight widened, activations left as they are."""

    def __call__(self, x, weight, weight_scale, input_scale, bias):
        return torch.nn.functional.linear(x, dequantize_weight(weight, weight_scale).to(x.dtype), bias)


def weight_only(twin):
    for module in twin.modules():
        if isinstance(module, Fp8Linear):
            module.gemm = WeightOnlyGemm()
    return twin


def compare(reference, quantized, dtype):
    with torch.no_grad():
        ref = reference(prefill_step(reference, dtype))
        got = quantized(prefill_step(quantized, dtype))
    rel = ((got - ref).norm() / ref.norm()).item()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return rel, agree


@pytest.mark.parametrize("arch,dtype", [("Qwen3ForCausalLM", torch.float32), ("LlamaForCausalLM", torch.float32),
                                        ("Qwen3ForCausalLM", torch.bfloat16)])
def test_fp8_logits_close_to_unquantized_twin(arch, dtype):
    model = tiny_model(seed=5, architectures=[arch]).to(dtype)
    rel, agree = compare(model, fp8_twin(model, dtype), dtype)
    rel_weight_only, _ = compare(model, weight_only(fp8_twin(model, dtype)), dtype)
    assert rel < 0.15 and agree >= 0.75, (rel, agree)
    assert rel < 1.6 * rel_weight_only, (rel, rel_weight_only)


def test_fp8_model_runs_on_the_quantized_op():
    """Every decoder linear is an Fp8Linear whose weight is e4m3 (the GEMM consumes FP8, no bf16 copy)."""
    twin = fp8_twin(tiny_model(seed=7), torch.float32)
    linears = [m for m in twin.modules() if isinstance(m, Fp8Linear)]
    assert len(linears) == 4 * twin.config.num_hidden_layers
    assert all(m.weight.dtype == torch.float8_e4m3fn and m.weight_scale.shape == (m.weight.shape[0],)
               for m in linears)



def test_export_keeps_the_fp8_op():
    """torch.export keeps atom::fp8_linear opaque (its fake impl gives the shapes), one call per linear."""
    from atom_aot.artifact.phase import Phase
    from atom_aot.build.export import export_model
    twin = fp8_twin(tiny_model(seed=8), torch.float32)
    exported = export_model(twin, torch.float32, 16, 128, torch.device("cpu"), Phase.MIXED)
    calls = [n for n in exported.graph.nodes if n.target is torch.ops.atom.fp8_linear.default]
    assert len(calls) == 4 * twin.config.num_hidden_layers


@pytest.mark.slow
def test_compiled_fp8_artifact_matches_its_eager_twin(tiny_llama_dir, build_artifact):
    """AOTInductor compiles the FP8 model (atom::fp8_linear stays an extern call; the fp8 KV cache
    reads its scales from the weights) and generates what the eager module generates."""
    from atom_aot import LLMEngine, SamplingParams
    from factories import random_prompts
    prompts = random_prompts(4, 380, seed=12)
    params = SamplingParams(temperature=0, max_tokens=12)
    options = dict(quant="fp8", kv_cache_dtype="fp8")
    outs = [[o["token_ids"] for o in LLMEngine(str(build_artifact(tiny_llama_dir, compile=c, **options)))
             .generate(prompts, params)] for c in ("none", "aoti")]
    assert outs[0] == outs[1]


def test_norms_that_quantize_give_the_twins_logits_and_export():
    """With the row's rms_norm_quant (`inductor`: the torch code, the CPU's), every norm with a residual hands its
    qkv / gate_up projection a QuantizedInput: the logits stay those of the plain fp8 path (the same quantization,
    computed before the GEMM instead of in it), and the model exports with those projections off the opaque fp8
    op: o_proj, down_proj and the first layer's qkv_proj (no residual yet) keep it."""
    from atom_aot.artifact.phase import Phase
    from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
    from atom_aot.build.export import export_model
    from atom_aot.models.quant_layers import use_linear_kernels
    twin = fp8_twin(tiny_model(seed=9), torch.float32)
    with torch.no_grad():
        plain = twin(prefill_step(twin, torch.float32))
        use_linear_kernels(twin, PhaseTuning({"fp8_linear": BackendChoice("aten"),
                                              "rms_norm_quant": BackendChoice("inductor")}))
        fused = twin(prefill_step(twin, torch.float32))
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
    exported = export_model(twin, torch.float32, 16, 128, torch.device("cpu"), Phase.MIXED)
    calls = [n for n in exported.graph.nodes if n.target is torch.ops.atom.fp8_linear.default]
    assert len(calls) == 2 * twin.config.num_hidden_layers + 1
