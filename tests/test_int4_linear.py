"""INT4 weight-only (W4A16) linears: the nibble layouts of GPTQ and AWQ against a hand packing, and
atom::int4_linear against float64 math on fresh random inputs.

The dequantized weight is exact in float32 ((q - z) is a 5-bit integer, the scale an fp16), so the
reference differs from float64 only by the float32 matmul's rounding."""
import pytest
import torch

from atom_aot.ops.int4 import dequantize_int4, int4_linear, pack_nibbles, unpack_nibbles
from atom_aot.weights.int4_checkpoint import awq_to_runtime, gptq_to_runtime
from int4_factories import Int4Values, pack_awq, pack_gptq


def random_values(n: int, k: int, group: int, seed: int) -> Int4Values:
    """Fresh int4 values, zero points 1..15 and fp16 scales of different magnitudes per group."""
    g = torch.Generator().manual_seed(seed)
    groups = 1 if group == -1 else k // group
    scale = (torch.rand(n, groups, generator=g) * 0.02 + 0.001).half()
    return Int4Values(torch.randint(0, 16, (n, k), generator=g), torch.randint(1, 16, (n, groups), generator=g), scale)


def runtime(v: Int4Values) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return pack_nibbles(v.q), v.scale.float(), v.zero.to(torch.uint8)


def float64_product(x, v: Int4Values, bias=None):
    g = v.group
    w = (v.q - v.zero.repeat_interleave(g, 1)).double() * v.scale.double().repeat_interleave(g, 1)
    y = x.double() @ w.T
    return y if bias is None else y + bias.double()


def rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


class TestNibbles:
    def test_runtime_packing_round_trips_and_puts_even_k_low(self):
        q = torch.randint(0, 16, (5, 24), generator=torch.Generator().manual_seed(0))
        packed = pack_nibbles(q)
        assert packed.shape == (5, 12) and packed.dtype == torch.uint8
        assert packed[2, 3].item() == q[2, 6].item() | (q[2, 7].item() << 4)
        assert torch.equal(unpack_nibbles(packed), q.to(torch.uint8))

    @pytest.mark.parametrize("group", [128, -1])
    def test_gptq_unpacks_to_the_values_packed_by_hand(self, group):
        v = random_values(24, 256, group, seed=1)
        stored = pack_gptq(v)
        assert stored["qweight"].shape == (32, 24) and stored["qzeros"].shape == (v.scale.shape[1], 3)
        got = gptq_to_runtime(stored["qweight"], stored["qzeros"], stored["scales"], zero_offset=1)
        assert [torch.equal(a, b) for a, b in zip((got["weight"], got["weight_scale"], got["weight_zero"]),
                                                  runtime(v))] == [True] * 3

    def test_gptq_v2_stores_zeros_without_the_offset(self):
        v = random_values(16, 128, 128, seed=2)
        stored = pack_gptq(v, zero_offset=0)
        got = gptq_to_runtime(stored["qweight"], stored["qzeros"], stored["scales"], zero_offset=0)
        assert torch.equal(got["weight_zero"], v.zero.to(torch.uint8))

    def test_awq_interleaved_order_unpacks_to_the_same_runtime_tensors(self):
        v = random_values(40, 256, 128, seed=3)
        stored = pack_awq(v)
        assert stored["qweight"].shape == (256, 5)
        got = awq_to_runtime(stored["qweight"], stored["qzeros"], stored["scales"])
        gptq = pack_gptq(v)
        from_gptq = gptq_to_runtime(gptq["qweight"], gptq["qzeros"], gptq["scales"], zero_offset=1)
        for leaf in ("weight", "weight_scale", "weight_zero"):
            assert torch.equal(got[leaf], from_gptq[leaf]), leaf
        assert torch.equal(got["weight"], pack_nibbles(v.q))

    def test_sign_bit_nibbles_survive(self):
        """Nibble 7 of an int32 word is its sign bit: q = 15 there makes the word negative."""
        v = Int4Values(torch.full((8, 128), 15), torch.full((8, 1), 8), torch.ones(8, 1).half())
        stored = pack_gptq(v)
        assert (stored["qweight"] < 0).all()
        got = gptq_to_runtime(stored["qweight"], stored["qzeros"], stored["scales"], zero_offset=1)
        assert torch.equal(unpack_nibbles(got["weight"]), torch.full((8, 128), 15, dtype=torch.uint8))


@pytest.mark.parametrize("group", [128, -1])
class TestReference:
    def test_dequantize_is_exact(self, group):
        v = random_values(24, 256, group, seed=4)
        w = dequantize_int4(*runtime(v))
        assert torch.equal(w.double(), float64_product(torch.eye(256), v).T)

    def test_matches_float64(self, group):
        v = random_values(72, 384, group, seed=5)
        g = torch.Generator().manual_seed(6)
        x, b = torch.randn(9, 384, generator=g), torch.randn(72, generator=g)
        y = int4_linear(x, *runtime(v), b)
        assert y.shape == (9, 72) and y.dtype == torch.float32
        assert rel_err(y, float64_product(x, v, b)) < 1e-6

    def test_bf16_activations_give_bf16(self, group):
        v = random_values(64, 256, group, seed=7)
        x = torch.randn(4, 256, generator=torch.Generator().manual_seed(8)).bfloat16()
        y = int4_linear(x, *runtime(v), None)
        assert y.dtype == torch.bfloat16 and rel_err(y, float64_product(x, v)) < 1e-2


def test_mismatched_groups_are_refused():
    v = random_values(8, 256, 128, seed=9)
    weight, scale, zero = runtime(v)
    with pytest.raises(ValueError, match="weight_scale and weight_zero"):
        int4_linear(torch.randn(2, 256), weight, scale, zero[:, :1], None)
