"""Attention reads only what its sequences wrote. The CPU's KV pool is left uninitialized (it may hold anything,
NaN included), so an op that lets an unwritten slot into its result (a masked score's zero probability times NaN
is NaN) changes the output only when the allocator happens to hand back such memory. Here every KV cache starts
as NaN, and greedy decoding still equals transformers' token for token, in batches whose sequences have different
context lengths, with chunked prompts, decodes beside them and preemption."""
import pytest

from deepseek_factories import make_tiny_deepseek
from engine_factories import poison_kv_cache
from factories import hf_greedy, random_prompts
from test_parity import MAX_NEW, engine_greedy


@pytest.fixture(autouse=True)
def nan_kv_cache(monkeypatch):
    poison_kv_cache(monkeypatch)


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    return make_tiny_deepseek(tmp_path_factory.mktemp("models") / "tiny-deepseek", seed=5, num_nextn_predict_layers=0)


@pytest.mark.parametrize("options", [{}, dict(num_kv_blocks=12, max_num_batched_tokens=16, max_model_len=96)],
                         ids=["one-batch", "chunked-and-preempted"])
def test_a_dense_model_reads_only_written_slots(tiny_llama_dir, build_artifact, options):
    prompts = random_prompts(6, 380, seed=3)
    engine, got = engine_greedy(build_artifact(tiny_llama_dir, compile="none"), prompts, **options)
    assert got == hf_greedy(tiny_llama_dir, prompts, MAX_NEW)
    assert not options or engine.core.scheduler.num_preemptions > 0


@pytest.mark.parametrize("options", [{}, dict(num_kv_blocks=14, max_num_batched_tokens=16, max_model_len=96)],
                         ids=["one-batch", "chunked-and-preempted"])
def test_latent_attention_reads_only_written_slots(deepseek_dir, build_artifact, options):
    """Decode rows of sequences of different context lengths run together (decode_rows_absorbed), beside
    chunked prompts."""
    prompts = random_prompts(6, 380, seed=4, lengths=(5, 40))
    engine, got = engine_greedy(build_artifact(deepseek_dir, compile="none"), prompts, **options)
    assert got == hf_greedy(deepseek_dir, prompts, MAX_NEW)
    assert not options or engine.core.scheduler.num_preemptions > 0
