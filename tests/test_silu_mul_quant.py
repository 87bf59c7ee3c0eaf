"""atom_triton::silu_mul_quant (one pass of silu(gate) * up and its per-token fp8 quantization) against the
eager model's numerics and float64, on fresh random inputs, under TRITON_INTERPRET=1 without a GPU
(outputs NaN-poisoned); and the GatedMLP path that uses it."""
import pytest
import torch

from triton_support import DEVICE, ON_GPU, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import GatedMLP
from atom_aot.models.quant_layers import use_linear_kernels
from atom_aot.ops.backends.silu_mul_quant import silu_mul
from atom_aot.ops.fp8 import FP8_MAX, MIN_SCALE, fits_one_program, quantize_activations, quantize_weight_per_channel
from atom_aot.ops.triton.silu_mul_quant import CANDIDATE_WARPS, launch_silu_mul_quant

E4M3_STEP = 2.0 ** -3          # e4m3's relative spacing (3 mantissa bits)


def gate_up(m: int, n: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(m, 2 * n, generator=g) * (0.5 + 4 * torch.rand(m, 1, generator=g))   # rows of other ranges
    return rows.to(dtype).to(DEVICE)


@pytest.mark.parametrize("n", [72, 200, 1000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_matches_the_eager_quantization(n, dtype):
    """The same fp8 values and scales as quantize_activations(F.silu(gate) * up) in the activation dtype."""
    x = gate_up(5, n, seed=n, dtype=dtype)
    q, scale = launch_silu_mul_quant(x, num_warps=4)
    q_ref, scale_ref = quantize_activations(silu_mul(x), None, block_scaled=False)
    assert q.shape == (5, n) and q.dtype == torch.float8_e4m3fn and scale.shape == (5, 1)
    torch.testing.assert_close(scale, scale_ref, rtol=1e-6, atol=0)
    # sigmoid's last bit may differ from torch's: an element then lands one e4m3 step away, never more
    differ = q.float() != q_ref.float()
    assert differ.float().mean() < 0.01
    assert ((q.float() - q_ref.float()).abs() <= E4M3_STEP * q_ref.float().abs() + 2 ** -9)[differ].all()


@pytest.mark.parametrize("warps", CANDIDATE_WARPS[:2] if not ON_GPU else CANDIDATE_WARPS)
def test_dequantized_close_to_float64(warps):
    """q * scale is silu(gate) * up within half an e4m3 step (plus the activation dtype's rounding)."""
    x = gate_up(3, 300, seed=11 + warps)
    q, scale = launch_silu_mul_quant(x, num_warps=warps)
    gate, up = x.double().chunk(2, dim=-1)
    exact = gate * torch.sigmoid(gate) * up
    err = (q.double() * scale.double() - exact).abs()
    assert (err <= (E4M3_STEP / 2 + 2 ** -7) * exact.abs() + scale.double() * 2 ** -9).all()
    assert torch.equal(scale.flatten(), (silu_mul(x).float().abs().amax(-1) / FP8_MAX).clamp(min=MIN_SCALE))


def test_a_zero_row_gets_the_floor_scale_and_zeros():
    x = gate_up(4, 64, seed=3)
    x[2] = 0
    q, scale = launch_silu_mul_quant(x, num_warps=4)
    assert scale[2].item() == pytest.approx(MIN_SCALE) and (q[2].float() == 0).all()
    assert (scale[[0, 1, 3]] > MIN_SCALE).all()


def test_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="gate_up"):
        launch_silu_mul_quant(torch.zeros(2, 7, device=DEVICE, dtype=torch.bfloat16), num_warps=4)
    assert fits_one_program(14336) and fits_one_program(32768) and not fits_one_program(32769)


def quantized_mlp(width: int = 96, hidden: int = 64) -> GatedMLP:
    cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=32, hidden_size=hidden, intermediate_size=width,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=64,
                      tie_word_embeddings=False)
    mlp = GatedMLP(cfg, torch.bfloat16, "fp8")
    g = torch.Generator().manual_seed(5)
    for linear in (mlp.gate_up_proj, mlp.down_proj):
        n, k = linear.weight.shape
        weight, scale = quantize_weight_per_channel(torch.randn(n, k, generator=g) / k ** 0.5)
        linear.weight.data, linear.weight_scale.data = weight, scale
    return mlp.to(DEVICE)


def test_gated_mlp_takes_the_rows_silu_mul_quant_backend():
    """A row naming silu_mul_quant points the fp8 down projection at it; both backends give the plain
    path's output (Inductor's: the same torch code; the kernel: the same fp8 values), and a row without it
    (artifacts built before it, the CPU's) leaves the plain path."""
    mlp = quantized_mlp()
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(6)).bfloat16().to(DEVICE)
    plain_row = {"fp8_linear": BackendChoice("aten")}
    use_linear_kernels(mlp, PhaseTuning(plain_row))
    assert mlp.down_proj.silu_mul_quant is None
    plain = mlp(x)
    for choice in (BackendChoice("inductor"), BackendChoice("triton", {"silu_mul_quant": (4,)})):
        use_linear_kernels(mlp, PhaseTuning({**plain_row, "silu_mul_quant": choice}))
        assert mlp.down_proj.silu_mul_quant is not None
        torch.testing.assert_close(mlp(x), plain, rtol=2e-2, atol=1e-3)
    with pytest.raises(Exception, match="silu_mul_quant"):
        use_linear_kernels(mlp, PhaseTuning({**plain_row, "silu_mul_quant": BackendChoice("triton")}))


@pytest.mark.parametrize("gemm", [BackendChoice("triton", {"fp8_gemm": (16, 32, 32, 4, 1)}),
                                  BackendChoice("small_m+triton", {"fp8_small_m": (4, 32, 32, 2, 4, 1),
                                                                   "fp8_gemm": (16, 32, 32, 4, 1)})],
                         ids=["triton", "small_m+triton"])
def test_every_fp8_gemm_backend_takes_the_quantized_input(gemm):
    """The Triton GEMM backends' `quantized` entries (fp8_scaled_mm; the small-M kernel up to max_m tokens, the
    GEMM above: 3 and 6 tokens here) on the kernel's input give the plain path's output on those backends."""
    mlp = quantized_mlp()
    for tokens in (3, 6):
        x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens)).bfloat16().to(DEVICE)
        use_linear_kernels(mlp, PhaseTuning({"fp8_linear": gemm}))
        plain = mlp(x)
        use_linear_kernels(mlp, PhaseTuning({"fp8_linear": gemm,
                                             "silu_mul_quant": BackendChoice("triton", {"silu_mul_quant": (4,)})}))
        torch.testing.assert_close(mlp(x), plain, rtol=2e-2, atol=1e-3)
