"""atom_triton::qk_norm_rope_cache_write against the reference attention backend's torch steps
(QK-norm, rope, cache write), on fresh random inputs, with every buffer the op allocates
NaN-poisoned, under TRITON_INTERPRET=1 without a GPU. The cache write is checked byte for byte
outside the slots it owns.
"""
import pytest
import torch

from triton_kernel_checks import rel_error, rope_cache_reference
from triton_support import DEVICE, ON_GPU, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.ops.rope import rope_cos_sin_cache
from atom_aot.ops.triton import rope_cache
from atom_aot.ops.triton.batch_inputs import make_paged_batch


TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
EPS = 1e-6


class TestQKNormRopeCacheWrite:
    def run(self, num_heads, num_kv_heads, head_dim, qk_norm, dtype=torch.float32, cache_dtype=None,
            block_h=2, num_warps=4, seed=0, rotary_dim=None):
        g = torch.Generator().manual_seed(seed)
        batch = make_paged_batch([0, 21, 5], [9, 1, 4], num_kv_heads, head_dim, pad_tokens=2,
                                 dtype=cache_dtype or dtype, generator=g)
        num_tokens = batch.slot_mapping.shape[0]
        # q, k, v as views of one fused qkv projection output (the model's layout)
        qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=g).to(dtype)
        q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
        q, k, v = (t.unflatten(-1, (-1, head_dim)) for t in (q, k, v))
        cos_sin = rope_cos_sin_cache(rotary_dim or head_dim, 10000.0, {}, 64)    # [64, R]: rope on the first R dims
        weights = [None, None]
        if qk_norm:
            weights = [(1 + 0.3 * torch.randn(head_dim, generator=g)).to(dtype) for _ in range(2)]
        ref_cache = batch.kv_cache.clone()
        q_ref = rope_cache_reference(q, k, v, batch.positions, cos_sin, *weights, EPS, ref_cache, 1,
                                     batch.slot_mapping)

        dev = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
        cache = dev(batch.kv_cache)
        q_out = rope_cache.qk_norm_rope_cache_write(
            dev(q), dev(k), dev(v), dev(batch.positions), dev(cos_sin), dev(weights[0]), dev(weights[1]), EPS,
            cache, 1, dev(batch.slot_mapping), block_h, num_warps)
        cache = cache.cpu()
        written = torch.zeros(cache.shape[2] * cache.shape[3], dtype=torch.bool)
        written[batch.slot_mapping[batch.slot_mapping >= 0]] = True
        written = written.view(cache.shape[2], cache.shape[3])
        untouched = ~written
        # every slot not written this step (padding rows included) keeps its old bits, in every layer
        assert torch.equal(cache[:, :, untouched].view(torch.uint8), batch.kv_cache[:, :, untouched].view(torch.uint8))
        assert torch.equal(cache[0].view(torch.uint8), batch.kv_cache[0].view(torch.uint8))
        tol = TOL[dtype]
        assert not torch.isnan(q_out).any()
        assert rel_error(q_out.cpu(), q_ref) < tol
        assert rel_error(cache[1][:, written], ref_cache[1][:, written]) < tol

    @pytest.mark.parametrize("qk_norm", [False, True])
    @pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(2, 2, 64), (4, 2, 128), (8, 2, 64)])
    def test_fp32(self, num_heads, num_kv_heads, head_dim, qk_norm):
        self.run(num_heads, num_kv_heads, head_dim, qk_norm, seed=num_heads + qk_norm)

    @pytest.mark.parametrize("qk_norm", [False, True])
    @pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,rotary_dim", [(4, 2, 128, 64), (3, 1, 64, 16),
                                                                            (2, 2, 64, 48)])
    def test_partial_rotary(self, num_heads, num_kv_heads, head_dim, rotary_dim, qk_norm):
        """GLM-4-MoE's rope on the first half of each head (and other shares): the rest of q and k is normalized
        but not rotated, v is copied whole."""
        self.run(num_heads, num_kv_heads, head_dim, qk_norm, rotary_dim=rotary_dim, seed=rotary_dim + qk_norm)

    def test_partial_rotary_bf16_fp8_cache(self):
        self.run(4, 2, 128, True, dtype=torch.bfloat16, cache_dtype=torch.float8_e4m3fn, rotary_dim=64, seed=6)

    @pytest.mark.parametrize("qk_norm", [False, True])
    def test_bf16(self, qk_norm):
        self.run(4, 2, 128, qk_norm, dtype=torch.bfloat16, block_h=4, seed=3)

    def test_fp8_cache(self):
        self.run(4, 2, 64, True, dtype=torch.bfloat16, cache_dtype=torch.float8_e4m3fn, seed=4)

    @pytest.mark.parametrize("config", rope_cache.CANDIDATE_CONFIGS)
    def test_candidate_configs(self, config):
        self.run(8, 2, 64, True, block_h=config.block_h, num_warps=config.num_warps, seed=5)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
def test_bf16_model_shapes_gpu():
    t = TestQKNormRopeCacheWrite()
    t.run(16, 8, 128, True, dtype=torch.bfloat16, block_h=4)
    t.run(32, 8, 128, False, dtype=torch.bfloat16, block_h=8)
