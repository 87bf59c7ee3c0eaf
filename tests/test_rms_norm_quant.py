"""atom_triton::add_rms_norm_quant (one pass of the residual add, RMSNorm and per-token fp8 quantization) against
the eager model's numerics and float64, on fresh random inputs, under TRITON_INTERPRET=1 without a GPU (outputs
NaN-poisoned); and the decoder layer's norms that hand their fp8 linear its input quantized."""
import pytest
import torch
from torch import nn

from triton_support import DEVICE, ON_GPU, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import AttentionOptions, DecoderLayer, GatedMLP
from atom_aot.models.layers import RMSNorm
from atom_aot.models.quant_layers import QuantizedInput, make_quantized_linear, use_linear_kernels
from atom_aot.ops.backends.rms_norm_quant import add_rms_norm
from atom_aot.ops.fp8 import quantize_activations, quantize_weight_per_channel
from atom_aot.ops.triton.rms_norm_quant import CANDIDATE_WARPS, launch_add_rms_norm_quant

E4M3_STEP = 2.0 ** -3          # e4m3's relative spacing (3 mantissa bits)
EPS = 1e-6


def stream(m: int, n: int, seed: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, residual, norm weight) with rows of different ranges and a weight away from 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g) * (0.5 + 4 * torch.rand(m, 1, generator=g))
    residual = torch.randn(m, n, generator=g) * 3
    weight = 0.5 + torch.rand(n, generator=g)
    return tuple(t.to(dtype).to(DEVICE) for t in (x, residual, weight))


@pytest.mark.parametrize("n", [64, 200, 1000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_matches_the_eager_norm_and_quantization(n, dtype):
    """The residual exactly x + residual; the fp8 values and scales of quantize_activations(rms_norm(x + residual))
    in the activation dtype, but for rsqrt's and the sum's last bits (an element one e4m3 step away, rarely)."""
    x, residual, weight = stream(5, n, seed=n, dtype=dtype)
    q, scale, summed = launch_add_rms_norm_quant(x, residual, weight, EPS, num_warps=4)
    normed, summed_ref = add_rms_norm(x, residual, weight, EPS)
    q_ref, scale_ref = quantize_activations(normed, None, block_scaled=False)
    assert q.shape == (5, n) and q.dtype == torch.float8_e4m3fn and scale.shape == (5, 1) and summed.dtype == dtype
    assert torch.equal(summed, summed_ref)
    torch.testing.assert_close(scale, scale_ref, rtol=2 ** -7, atol=0)
    differ = q.float() != q_ref.float()
    assert differ.float().mean() < 0.02
    assert ((q.float() - q_ref.float()).abs() <= E4M3_STEP * q_ref.float().abs() + 2 ** -9)[differ].all()


@pytest.mark.parametrize("warps", CANDIDATE_WARPS[:2] if not ON_GPU else CANDIDATE_WARPS)
def test_dequantized_close_to_float64(warps):
    """q * scale is rms_norm(x + residual) * weight within half an e4m3 step (plus bf16's roundings)."""
    x, residual, weight = stream(3, 300, seed=11 + warps)
    q, scale, summed = launch_add_rms_norm_quant(x, residual, weight, EPS, num_warps=warps)
    h = x.double() + residual.double()
    exact = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()
    err = (q.double() * scale.double() - exact).abs()
    assert (err <= (E4M3_STEP / 2 + 2 ** -6) * exact.abs() + scale.double() * 2 ** -9).all()
    torch.testing.assert_close(summed.double(), h, rtol=2 ** -8, atol=0)


def test_refuses_what_it_cannot_hold():
    x, residual, weight = stream(2, 64, seed=1)
    with pytest.raises(ValueError, match="add_rms_norm_quant takes"):
        launch_add_rms_norm_quant(x, residual[:, :32], weight, EPS, num_warps=4)
    with pytest.raises(ValueError, match="holds rows of up to 32768"):
        wide = torch.zeros(1, 32769, device=DEVICE, dtype=torch.bfloat16)
        launch_add_rms_norm_quant(wide, wide, wide[0], EPS, num_warps=4)


def tiny_config(hidden: int = 64) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", vocab_size=32, hidden_size=hidden, intermediate_size=96,
                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       rms_norm_eps=EPS, rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False)


def fp8_linear(n: int, k: int, seed: int) -> nn.Module:
    linear = make_quantized_linear(k, n, False, torch.bfloat16, "fp8")
    weight, scale = quantize_weight_per_channel(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) / k ** 0.5)
    linear.weight.data, linear.weight_scale.data = weight, scale
    return linear


@pytest.mark.parametrize("choice", [BackendChoice("inductor"), BackendChoice("triton", {"rms_norm_quant": (4,)})],
                         ids=["inductor", "triton"])
def test_a_quantizing_norm_feeds_its_linear_what_the_plain_path_computes(choice):
    """Set by use_linear_kernels, a norm with a residual returns a QuantizedInput and the new residual; the fp8
    linear on it gives the plain path's output (norm, then the linear's own quantization); without a residual,
    or with partial sums to all-reduce, the norm stays plain."""
    cfg = tiny_config()
    layer = DecoderLayer(cfg, 0, torch.bfloat16, "fp8", AttentionOptions(), mlp=GatedMLP(cfg, torch.bfloat16, "fp8"))
    layer.mlp.gate_up_proj = fp8_linear(192, 64, seed=2)
    layer = layer.to(DEVICE)
    norm, linear = layer.post_attention_layernorm, layer.mlp.gate_up_proj
    norm.weight.data = (0.5 + torch.rand(64, generator=torch.Generator().manual_seed(3))).bfloat16().to(DEVICE)
    x, residual, _ = stream(6, 64, seed=4)
    plain_row = {"fp8_linear": BackendChoice("aten")}
    use_linear_kernels(layer, PhaseTuning(plain_row))
    assert norm.quantizer is None
    plain_hidden, plain_residual = norm(x, residual)
    plain = linear(plain_hidden)
    use_linear_kernels(layer, PhaseTuning({**plain_row, "rms_norm_quant": choice}))
    assert norm.quantizer is not None and layer.input_layernorm.quantizer is not None
    quantized, new_residual = norm(x, residual)
    assert isinstance(quantized, QuantizedInput) and torch.equal(new_residual, plain_residual)
    torch.testing.assert_close(linear(quantized), plain, rtol=2e-2, atol=2e-2)
    assert isinstance(norm(x), torch.Tensor)                            # no residual: the first layer's input norm


def test_only_norms_that_feed_a_per_token_fp8_linear_alone_quantize():
    """The decoder layer pairs its input norm with qkv_proj and its post-attention norm with a GatedMLP's gate_up;
    an MoE block (any other mlp) keeps its norm plain, as do layers whose linears are bf16 or statically scaled,
    and a row without the choice (artifacts built before it, the CPU's) sets none."""
    cfg = tiny_config()
    row = PhaseTuning({"fp8_linear": BackendChoice("aten"), "rms_norm_quant": BackendChoice("inductor")})
    moe_like = DecoderLayer(cfg, 0, torch.bfloat16, "fp8", AttentionOptions(), mlp=nn.Identity())
    use_linear_kernels(moe_like, row)
    assert moe_like.input_layernorm.quantizer is not None and moe_like.post_attention_layernorm.quantizer is None
    for quant in ("none", "fp8-static"):
        layer = DecoderLayer(cfg, 0, torch.bfloat16, quant, AttentionOptions(), mlp=GatedMLP(cfg, torch.bfloat16, quant))
        use_linear_kernels(layer, row)
        assert layer.input_layernorm.quantizer is None and layer.post_attention_layernorm.quantizer is None
    use_linear_kernels(moe_like, PhaseTuning({"fp8_linear": BackendChoice("aten")}))
    assert moe_like.input_layernorm.quantizer is None


def test_a_norm_given_partial_sums_stays_plain(monkeypatch):
    """Over tp ranks the norm all-reduces partial sums first (models/parallel.py): that path is not the one-pass
    kernel's, so the norm leaves its quantizer out there and returns a tensor (the linear quantizes it itself)."""
    import atom_aot.models.layers as layers
    monkeypatch.setattr(layers, "all_reduce", lambda t: t)      # one rank's sums are the total (CPU path)
    norm = RMSNorm(64, EPS, torch.float32)
    norm.quantizer = lambda *a: pytest.fail("the quantizer ran on partial sums")
    x, residual = torch.randn(3, 64), torch.randn(3, 64)
    out, new_residual = norm(x, residual, partial=object())
    assert isinstance(out, torch.Tensor) and torch.equal(new_residual, x + residual)
