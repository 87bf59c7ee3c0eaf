"""Test factories: tiny random-weight Hugging Face model folders, made on the spot.

Each folder is a real HF checkpoint (config.json, generation_config.json, model.safetensors and
a small byte-level BPE tokenizer with a chat template), so the engine reads it exactly as it
would read a downloaded model, and transformers can run it as the reference.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch

TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world! How are you today?",
          "Paged attention stores keys and values in fixed-size blocks.", "0123456789 + - * / = ( )",
          "Ünïcödé tëxt, 日本語, emojis 🙂 and more.", "def f(x):\n    return x * 2\n"] * 20
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_tokenizer(out: Path, vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def make_config_folder(out: Path, config: dict) -> Path:
    """A model folder with config.json and a tokenizer, no weights (for --load-format dummy builds)."""
    import json
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    make_tokenizer(out)
    return out


def make_tiny_model(out: Path, architecture: str = "LlamaForCausalLM", seed: int = 0, **overrides) -> Path:
    """Write a random-weight HF model folder; returns it. MoE families store one tensor per expert, as on the Hub."""
    from transformers import AutoModelForCausalLM, GptOssConfig, LlamaConfig, MixtralConfig, Qwen3Config, Qwen3MoeConfig
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(out)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    fields = {**TINY, "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos,
              "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": False, **overrides}
    if architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        config_class = Qwen3Config if architecture == "Qwen3ForCausalLM" else Qwen3MoeConfig
        config = config_class(head_dim=fields.pop("head_dim", 24), **fields)
    elif architecture == "MixtralForCausalLM":
        config = MixtralConfig(**fields)
    elif architecture == "GptOssForCausalLM":
        config = GptOssConfig(head_dim=fields.pop("head_dim", 16), **fields)
    else:
        config = LlamaConfig(**fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():     # larger than HF's init, so greedy choices are clear-cut, not near ties
        for name, p in model.named_parameters():
            if p.dim() > 1 and not name.endswith("bias"):
                p.normal_(0, 0.08)
            elif name.endswith(("bias", "sinks")):      # HF starts most biases at 0: drawn, so they count
                p.normal_(0, 1.0 if name.endswith("sinks") else 0.05)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def hf_model_class(model_dir: Path):
    """transformers' class of the folder's architecture (not AutoModelForCausalLM's choice by model_type, which
    asks for remote code where the model type is no transformers one: Kimi-K2's `kimi_k2`)."""
    import json
    import transformers
    return getattr(transformers, json.loads((Path(model_dir) / "config.json").read_text())["architectures"][0])


def hf_model(model_dir: Path):
    """transformers' model of the folder in fp32, by its architecture's class. Its config's model_type is that class's:
    transformers keys its checkpoint conversions (per-expert tensors -> its stacked experts) by model_type, and
    loads a kimi_k2 folder's experts as missing otherwise."""
    model_cls = hf_model_class(model_dir)
    config = model_cls.config_class.from_pretrained(str(model_dir))
    config.model_type = model_cls.config_class.model_type
    return model_cls.from_pretrained(str(model_dir), config=config, dtype=torch.float32).eval()


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int, ignore_eos: bool = False):
    """Reference: transformers' generate, greedy, fp32, one prompt at a time (no padding)."""
    model = hf_model(model_dir)
    eos = None if ignore_eos else model.generation_config.eos_token_id
    outs = []
    for ids in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=eos, pad_token_id=model.generation_config.pad_token_id,
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        outs.append(out[0, len(ids):].tolist())
    return outs


def random_prompts(n: int, vocab: int, seed: int, lengths=(3, 60), prefix: list[int] | None = None):
    rng = random.Random(seed)
    return [(prefix or []) + [rng.randrange(3, vocab) for _ in range(rng.randint(*lengths))] for _ in range(n)]


def engine_greedy(artifact, prompts: list[list[int]], max_new: int, **config):
    """(the engine, its greedy tokens for `prompts` in one batch); `config`: LLMEngine's runtime options."""
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(str(artifact), **config)
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_new))
    return engine, [o["token_ids"] for o in outs]


def engine_greedy_with_runner_up(artifact, prompts: list[list[int]], max_new: int, **config):
    """(the engine, its greedy tokens, per token the top-2 {token id: logprob}) for `prompts` in one batch: what
    `assert_greedy_equal_but_near_ties` needs of the reference engine."""
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(str(artifact), **config)
    index = {request_id: i for i, request_id in
             enumerate(engine.add_request(prompts, SamplingParams(temperature=0, max_tokens=max_new, logprobs=2)))}
    tokens: list[list[int]] = [[] for _ in prompts]
    tops: list[list[dict[int, float]]] = [[] for _ in prompts]
    while not engine.is_finished():
        for update in engine.step():
            i = index[update.request_id]
            tokens[i] += [lp.token_id for lp in update.logprobs]
            tops[i] += [dict(lp.top) for lp in update.logprobs]
    return engine, tokens, tops


def assert_greedy_equal_but_near_ties(got: list[list[int]], expected: list[list[int]],
                                      expected_tops: list[list[dict[int, float]]], tolerance: float):
    """`got` equals the reference's greedy `expected`, except that a sequence may leave it where the reference's
    two best tokens are within `tolerance` (nats) and `got` took the second: a sum in another order (tensor-parallel
    partial sums, another thread count) may turn such a near tie either way, after which the rest is not
    comparable. At most one sequence in three may do so."""
    departed = 0
    for i, (mine, theirs) in enumerate(zip(got, expected)):
        assert len(mine) == len(theirs), i
        step = next((j for j, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if step is None:
            continue
        top = expected_tops[i][step]
        assert mine[step] in top, f"sequence {i} step {step}: {mine[step]} is not the reference's runner-up {top}"
        gap = top[theirs[step]] - top[mine[step]]
        assert gap <= tolerance, f"sequence {i} step {step}: left the reference where it led by {gap:.4f} nats"
        departed += 1
    assert departed * 3 <= len(got), f"{departed} of {len(got)} sequences left the reference at near ties"


def prefix_cached_greedy(artifact, count: int, max_new: int, prefix_len: int = 40):
    """`count` prompts sharing a `prefix_len`-token prefix, the first alone then the rest (which find its blocks
    cached): (the engine, the prompts, the greedy tokens of all)."""
    from atom_aot import LLMEngine, SamplingParams
    shared = random_prompts(1, 380, seed=7, lengths=(prefix_len, prefix_len))[0]
    prompts = random_prompts(count, 380, seed=8, lengths=(1, 20), prefix=shared)
    engine = LLMEngine(str(artifact), enable_prefix_caching=True)
    first = engine.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=max_new))
    rest = engine.generate(prompts[1:], SamplingParams(temperature=0, max_tokens=max_new))
    return engine, prompts, [o["token_ids"] for o in first + rest]


def parity_case(folder: Path, architecture: str, build_artifact, max_new: int, *, seed: int,
                lengths=(3, 60), **overrides):
    """(model folder, its eager artifact, 9 random prompts, transformers' greedy tokens for them): a tiny random
    model of `architecture` written to `folder`, for the parity tests."""
    model_dir = make_tiny_model(folder, architecture, seed=seed, **overrides)
    prompts = random_prompts(9, 380, seed=21, lengths=lengths)
    return model_dir, build_artifact(model_dir, compile="none"), prompts, hf_greedy(model_dir, prompts, max_new)
