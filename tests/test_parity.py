"""Greedy decoding token for token equal to Hugging Face transformers (fp32, same weights).

The engine decodes every batch together (prompts of different lengths in one continuous batch);
the reference runs transformers' `generate` one prompt at a time.
"""
import pytest
import torch

from atom_aot import LLMEngine, SamplingParams
import factories
from factories import hf_greedy, make_tiny_model, random_prompts

MAX_NEW = 24


def engine_greedy(artifact, prompts, max_new=MAX_NEW, **config):
    return factories.engine_greedy(artifact, prompts, max_new, **config)


@pytest.fixture(scope="module")
def llama(tiny_llama_dir, build_artifact):
    prompts = random_prompts(10, 380, seed=1)
    return tiny_llama_dir, build_artifact(tiny_llama_dir, compile="none"), prompts, hf_greedy(tiny_llama_dir, prompts, MAX_NEW)


class TestLlama:
    def test_batch_matches_hf(self, llama):
        _, artifact, prompts, expected = llama
        _, got = engine_greedy(artifact, prompts)
        assert got == expected

    def test_preemption_and_chunked_prefill(self, llama):
        """A KV pool of 12 blocks and a 16-token step budget: prompts are chunked, sequences preempted."""
        _, artifact, prompts, expected = llama
        engine, got = engine_greedy(artifact, prompts, num_kv_blocks=12, max_num_batched_tokens=16,
                                    max_model_len=96)
        assert got == expected
        assert engine.core.scheduler.num_preemptions > 0
        assert engine.core.block_manager.num_free_blocks == 12

    def test_token_budget_smaller_than_prompt_chunks_it(self, llama):
        _, artifact, prompts, expected = llama
        engine = LLMEngine(str(artifact), max_num_batched_tokens=7)
        steps = []
        engine.add_request(prompts[:1], SamplingParams(temperature=0, max_tokens=MAX_NEW))
        while not engine.is_finished():
            steps.extend(u.token_ids for u in engine.step() if u.finished)
        assert steps == expected[:1]


def check_shared_prefixes(model_dir, artifact):
    """8 prompts sharing a 40-token prefix, the first run alone: the rest hit its cached blocks and
    every output equals transformers'."""
    engine, prompts, got = factories.prefix_cached_greedy(artifact, 8, MAX_NEW)
    assert got == hf_greedy(model_dir, prompts, MAX_NEW)
    bm = engine.core.block_manager
    assert bm.prefix_hits >= 7 * (40 // 16)       # every later prompt reuses the shared blocks
    assert bm.num_free_blocks == bm.num_blocks


class TestPrefixCaching:
    def test_shared_prefixes_hit_and_match_hf(self, tiny_llama_dir, build_artifact):
        check_shared_prefixes(tiny_llama_dir, build_artifact(tiny_llama_dir, compile="none"))

    def test_repeated_prompt_recomputes_only_its_tail(self, llama):
        _, artifact, prompts, expected = llama
        engine = LLMEngine(str(artifact))
        long_prompt = max(prompts, key=len)
        a = engine.generate([long_prompt], SamplingParams(temperature=0, max_tokens=MAX_NEW))
        hits_before = engine.core.block_manager.prefix_hits
        b = engine.generate([long_prompt], SamplingParams(temperature=0, max_tokens=MAX_NEW))
        assert a[0]["token_ids"] == b[0]["token_ids"] == expected[prompts.index(long_prompt)]
        assert engine.core.block_manager.prefix_hits - hits_before == (len(long_prompt) - 1) // 16


class TestQwen3:
    def test_batch_matches_hf(self, tiny_qwen3_dir, build_artifact):
        prompts = random_prompts(9, 380, seed=3)
        expected = hf_greedy(tiny_qwen3_dir, prompts, MAX_NEW)
        _, got = engine_greedy(build_artifact(tiny_qwen3_dir, compile="none"), prompts)
        assert got == expected

    def test_preemption_matches_hf(self, tiny_qwen3_dir, build_artifact):
        prompts = random_prompts(8, 380, seed=4)
        expected = hf_greedy(tiny_qwen3_dir, prompts, MAX_NEW)
        engine, got = engine_greedy(build_artifact(tiny_qwen3_dir, compile="none"), prompts, num_kv_blocks=10,
                                    max_num_batched_tokens=24, max_model_len=96)
        assert got == expected and engine.core.scheduler.num_preemptions > 0


class TestLlamaVariants:
    def test_tied_embeddings_and_llama3_rope_scaling(self, tmp_path, build_artifact):
        model_dir = make_tiny_model(
            tmp_path / "llama3", "LlamaForCausalLM", seed=5, tie_word_embeddings=True, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64})
        prompts = random_prompts(8, 380, seed=5, lengths=(20, 120))
        expected = hf_greedy(model_dir, prompts, MAX_NEW)
        _, got = engine_greedy(build_artifact(model_dir, compile="none"), prompts)
        assert got == expected

    def test_eos_stops_like_hf(self, llama):
        """Without ignore_eos both stop at the first eos (the reference includes it)."""
        model_dir, artifact, prompts, _ = llama
        expected = hf_greedy(model_dir, prompts, 64)
        engine = LLMEngine(str(artifact))
        outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=64))
        assert [o["token_ids"] for o in outs] == expected
        eos = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
        for out in outs:
            assert out["finish_reason"] == ("stop" if out["token_ids"][-1] == eos else "length")


def smollm2_hf_model(gguf_path):
    """transformers' LlamaForCausalLM holding the GGUF's dequantized weights."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from atom_aot.build.gguf_reader import read_gguf
    ckpt = read_gguf(str(gguf_path))
    model = LlamaForCausalLM(LlamaConfig(**ckpt.config)).eval()
    missing, unexpected = model.load_state_dict(dict(ckpt.tensors()), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    model.tie_weights()
    return model


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf, build_artifact):
    return smollm2_gguf, build_artifact(smollm2_gguf, compile="none")


def test_smollm2_matches_hf(smollm2):
    gguf_path, artifact = smollm2
    engine = LLMEngine(str(artifact))
    questions = ["What is the capital of France?", "Write a haiku about the sea.",
                 "Explain gravity to a child in two sentences.", "List three prime numbers."]
    prompts = [engine.apply_chat_template([{"role": "user", "content": q}]) for q in questions]
    ids = [engine.tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    outs = engine.generate(ids, SamplingParams(temperature=0, max_tokens=32))
    hf = smollm2_hf_model(gguf_path)
    for prompt_ids, out in zip(ids, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt_ids]), max_new_tokens=32, do_sample=False,
                              eos_token_id=2, pad_token_id=2)
        assert out["token_ids"] == ref[0, len(prompt_ids):].tolist()
    assert outs[0]["text"].startswith("The capital of France is Paris")
