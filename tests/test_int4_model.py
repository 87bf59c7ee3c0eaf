"""A W4A16 tiny model: its linears run atom::int4_linear on the packed weights, torch.export keeps the
op opaque, and the AOTInductor-compiled artifact generates what the eager one does."""
import pytest
import torch

from atom_aot.artifact.phase import Phase
from atom_aot.models.quant_layers import Int4Linear
from atom_aot.ops.int4 import pack_nibbles
from int4_factories import quantize_rtn
from model_factories import tiny_model


def int4_twin(model, scheme: str = "int4-w4a16"):
    """`model` with each decoder linear replaced by its round-to-nearest int4 values (module-level packing)."""
    with torch.device("meta"):
        twin = type(model)(model.config, torch.float32, scheme, model.model.rotary.cos_sin_cache.shape[0])
    expected, state = twin.state_dict(), {}
    for name, tensor in model.state_dict().items():
        zero_name = name.removesuffix("weight") + "weight_zero"
        if zero_name in expected:
            v = quantize_rtn(tensor, -1 if scheme.endswith("channel") else 128)
            state.update({name: pack_nibbles(v.q), zero_name: v.zero.to(torch.uint8),
                          name.removesuffix("weight") + "weight_scale": v.scale.float()})
        else:
            state[name] = tensor
    twin.load_state_dict(state, assign=True)
    return twin.eval()


def test_every_decoder_linear_is_int4():
    model = tiny_model(seed=7, hidden_size=128, intermediate_size=256, head_dim=32)
    twin = int4_twin(model)
    linears = [m for m in twin.modules() if isinstance(m, Int4Linear)]
    assert len(linears) == 4 * twin.config.num_hidden_layers
    assert all(m.weight.dtype == torch.uint8 and m.weight.shape[1] * 2 == m.weight_scale.shape[1] * 128
               for m in linears)


def test_export_keeps_the_int4_op():
    """torch.export keeps atom::int4_linear opaque (its fake impl gives the shapes), one call per linear."""
    from atom_aot.build.export import export_model
    twin = int4_twin(tiny_model(seed=8, hidden_size=128, intermediate_size=256, head_dim=32), "int4-w4a16-channel")
    exported = export_model(twin, torch.float32, 16, 128, torch.device("cpu"), Phase.MIXED)
    calls = [n for n in exported.graph.nodes if n.target is torch.ops.atom.int4_linear.default]
    assert len(calls) == 4 * twin.config.num_hidden_layers


@pytest.mark.slow
def test_compiled_int4_artifact_matches_its_eager_twin(tmp_path, build_artifact):
    """AOTInductor compiles the int4 model (atom::int4_linear stays an extern call) and generates what
    the eager module generates."""
    from atom_aot import LLMEngine, SamplingParams
    from factories import make_tiny_model, random_prompts
    from int4_factories import write_int4
    src = make_tiny_model(tmp_path / "tiny", hidden_size=128, intermediate_size=256, num_attention_heads=4,
                          num_key_value_heads=4)
    checkpoint = write_int4(src, tmp_path / "gptq", "gptq")
    prompts, params = random_prompts(4, 300, seed=12), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = [[o["token_ids"] for o in LLMEngine(str(build_artifact(checkpoint, compile=c))).generate(prompts, params)]
            for c in ("none", "aoti")]
    assert outs[0] == outs[1]


@pytest.mark.parametrize("scheme,op,kernel", [("int4-w4a16", "int4_linear", "int4_gemm"),
                                              ("fp8", "fp8_linear", "fp8_gemm")])
def test_gpu_tuning_rows_name_the_measured_backend(monkeypatch, scheme, op, kernel):
    """The GPU build's plumbing without a GPU: the fastest candidate (timings stubbed) becomes each
    phase's choice for the scheme's op, in the params form its backend reads, and `inspect`'s kernel line."""
    import atom_aot.build.tune_fp8 as tune_fp8
    from atom_aot.artifact.tuning import BackendChoice, PhaseTuning, Tuning
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.tune import _with_measured_linear
    from atom_aot.ops.backends import make_backend
    from atom_aot.models import ModelConfig
    from model_factories import TINY_QWEN3
    fast = tune_fp8.candidates(scheme)[2]

    def stub(cfg, scheme_, dtype, phase):
        return {f"{g} 1x8x8": {c: (1.0 if c == fast else 2.0) for c in tune_fp8.candidates(scheme_)}
                for g in ("qkv_proj", "down_proj")}
    monkeypatch.setattr(tune_fp8, "measure_linear", stub)
    monkeypatch.setattr(tune_fp8, "measure_small_m", lambda *a: {      # slower: the decode row stays plain
        f"{g} 1x8x8": {("small_m", 64, 256, 1, 4, 4): 3.0} for g in ("qkv_proj", "down_proj")})
    monkeypatch.setattr(tune_fp8, "measure_silu_mul_quant", lambda cfg, dtype, phases, timer: {
        p: {"silu_mul_quant 1x8": {("inductor",): 1.0}} for p in phases})
    monkeypatch.setattr(tune_fp8, "measure_rms_norm_quant", lambda cfg, dtype, phases, timer: {
        p: {"rms_norm_quant 1x8": {("inductor",): 1.0}} for p in phases})
    row = PhaseTuning({"attention": BackendChoice("triton")})
    base = Tuning(arch="sm90", measured=True, phases={Phase.DECODE: row, Phase.MIXED: row}, kernels={})
    tuned = _with_measured_linear(base, BuildConfig(arch="sm90"), ModelConfig.from_hf_dict(TINY_QWEN3), scheme)
    choice = tuned.for_phase(Phase.MIXED).op(op)
    assert choice.backend == "triton" and tuple(choice.params[kernel]) == fast[1:]
    assert tuned.for_phase(Phase.DECODE).op(op) == choice
    assert make_backend(op, choice).args == fast[1:]
    assert any(label.endswith("gemm") and "per phase as measured" in text for label, text in tuned.kernels.items())

