"""The `triton` attention backend inside the model equals the `reference` one: same logits and the
same KV cache after a mixed step (prompts into an empty cache) and a decode step after it. Kernels
run under TRITON_INTERPRET=1 without a GPU."""
import pytest
import torch

from model_factories import mixed_step, tiny_model
from triton_kernel_checks import rel_error
from triton_support import poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
from atom_aot.errors import ArtifactError
from atom_aot.ops.backends import make_backend

TRITON = BackendChoice("triton", {"paged_attention": (16, 16, 4, 2, 1 << 20, 2), "qk_norm_rope_cache_write": (2, 4)})
REFERENCE = BackendChoice("reference")


def run_steps(model, choice: BackendChoice, moe: BackendChoice | None = None):
    """A mixed step, then one decode token for each of its sequences: (logits of both, the cache)."""
    model.use_kernels(PhaseTuning({"attention": choice, **({} if moe is None else {"moe": moe})}))
    mixed = mixed_step(model)
    ends = mixed.query_start_loc[1:].long() - 1
    decode = mixed._replace(
        input_ids=torch.tensor([3, 9, 27]), positions=mixed.seq_lens.long(),
        slot_mapping=mixed.slot_mapping[ends] + 1, seq_lens=mixed.seq_lens + 1,
        query_start_loc=torch.arange(4, dtype=torch.int32), logits_indices=torch.arange(3))
    with torch.no_grad():
        return model(mixed), model(decode), mixed.kv_cache


@pytest.mark.parametrize("architecture", ["Qwen3ForCausalLM", "LlamaForCausalLM"])
def test_triton_equals_reference(architecture):
    model = tiny_model(architectures=[architecture])
    *ref_logits, ref_cache = run_steps(model, REFERENCE)
    *logits, cache = run_steps(model, TRITON)
    for got, want in zip(logits, ref_logits):
        assert rel_error(got, want) < 1e-5
    written = ref_cache.flatten(2, 3).abs().sum((0, 1, 3, 4)) > 0        # slots either backend wrote
    assert rel_error(cache.flatten(2, 3)[:, :, written], ref_cache.flatten(2, 3)[:, :, written]) < 1e-5


def test_gpt_oss_triton_equals_reference():
    """Sinks, a window shorter than the first prompt (5 tokens), biases, the clamped SwiGLU experts and the top-k-first
    router, all through the triton backends."""
    model = tiny_model(architectures=["GptOssForCausalLM"], num_local_experts=4, num_experts_per_tok=2,
                       intermediate_size=32, sliding_window=3, attention_bias=True, swiglu_alpha=1.702,
                       swiglu_limit=0.5, layer_types=["sliding_attention", "full_attention"])
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0, 1.0)
    *ref_logits, ref_cache = run_steps(model, REFERENCE, BackendChoice("reference"))
    *logits, cache = run_steps(model, TRITON, BackendChoice("triton", {"fused_moe@1": (16, 16, 32, 1, 2, 1)}))
    for got, want in zip(logits, ref_logits):
        assert rel_error(got, want) < 1e-5
    assert rel_error(cache, ref_cache) < 1e-5


def test_malformed_params_are_refused():
    with pytest.raises(ArtifactError, match=r"params\['paged_attention'\] must be \[block_m, block_n, num_warps"):
        make_backend("attention", BackendChoice("triton", {"paged_attention": (16, 16),
                                                           "qk_norm_rope_cache_write": (2, 4)}))
    with pytest.raises(ArtifactError, match="qk_norm_rope_cache_write"):
        make_backend("attention", BackendChoice("triton", {"paged_attention": (16, 16, 4, 2, 1 << 20, 2)}))
