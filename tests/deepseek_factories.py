"""Tiny random DeepSeek-V3 checkpoints (HF folders, float32) with an MTP layer, and a direct torch
implementation of that MTP layer built from the checkpoint's tensors with transformers' modules."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from factories import make_tokenizer

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}
TINY_DEEPSEEK = dict(
    hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4, first_k_dense_replace=2,
    num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
    qk_nope_head_dim=16, v_head_dim=24, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4,
    topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=512, rms_norm_eps=1e-6,
    rope_scaling=YARN, num_nextn_predict_layers=1, tie_word_embeddings=False)


def make_tiny_deepseek(out: Path, seed: int = 0, mtp_tensors: bool = True, **overrides) -> Path:
    """A random DeepseekV3ForCausalLM folder; its safetensors also hold one MTP layer
    (`model.layers.{num_hidden_layers}.*`), which transformers ignores. `mtp_tensors=False`: the folder as
    transformers' save_pretrained writes it, with no MTP tensors and num_nextn_predict_layers 1 in config.json."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    return make_tiny_routed_moe(out, DeepseekV3Config, DeepseekV3ForCausalLM, {**TINY_DEEPSEEK, **overrides}, seed,
                                mtp_tensors)


def make_tiny_routed_moe(out: Path, config_class, model_class, fields: dict, seed: int,
                         mtp_tensors: bool = True) -> Path:
    """A random folder of a family with DeepSeek-V3's MoE layers (DeepSeek-V3, GLM-4-MoE), transformers' classes
    given; `num_nextn_predict_layers` MTP layers appended to its safetensors unless not `mtp_tensors`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(out)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = config_class(**{**fields, "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
                             "eos_token_id": eos, "pad_token_id": tokenizer.pad_token_id})
    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32)
    with torch.no_grad():      # larger than HF's init, so greedy choices are clear-cut; non-zero biases
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            elif name.endswith("proj.bias"):
                p.normal_(0, 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.05)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    if mtp_tensors and config.num_nextn_predict_layers:
        add_mtp_layers(out / "model.safetensors", config)
    return out


# Kimi-K2's rope scaling (factor 32, beta_fast = beta_slow = 1, mscale = mscale_all_dim = 1) at a tiny length
KIMI_YARN = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 16, "beta_fast": 1.0, "beta_slow": 1.0,
             "mscale": 1.0, "mscale_all_dim": 1.0}
# Kimi-K2's structure, small: one group of many experts (384 top-8 there, 32 top-2 here), no MTP layer
TINY_KIMI = dict(TINY_DEEPSEEK, num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=32,
                 num_experts_per_tok=2, n_group=1, topk_group=1, routed_scaling_factor=2.827, rope_theta=50000.0,
                 rope_scaling=KIMI_YARN, num_nextn_predict_layers=0)
# what Kimi-K2's config.json and tokenizer_config.json carry beyond transformers' DeepseekV3Config
KIMI_CONFIG = {"model_type": "kimi_k2", "moe_layer_freq": 1, "ep_size": 1, "scoring_func": "sigmoid",
               "topk_method": "noaux_tc", "seq_aux": True, "aux_loss_alpha": 0.001, "pretraining_tp": 1,
               "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                            "AutoModel": "modeling_deepseek.DeepseekV3Model",
                            "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"}}
KIMI_TOKENIZER = {"tokenizer_class": "TikTokenTokenizer",
                  "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}


def make_tiny_kimi(out: Path, seed: int = 0, **overrides) -> Path:
    """A random DeepseekV3ForCausalLM folder as Kimi-K2 ships its config: model_type kimi_k2 with remote-code
    auto_map entries, and a tokenizer_config.json naming its tiktoken tokenizer class (remote code too); the
    tokenizer itself is the tiny byte-level BPE's tokenizer.json."""
    import json
    out = make_tiny_deepseek(out, seed, **{**TINY_KIMI, **overrides})
    for name, extra in (("config.json", KIMI_CONFIG), ("tokenizer_config.json", KIMI_TOKENIZER)):
        path = out / name
        path.write_text(json.dumps({**json.loads(path.read_text()), **extra}, indent=1))
    return out


def add_mtp_layers(path: Path, config) -> None:
    """Append layer `num_hidden_layers` (MTP): a MoE decoder block's tensors plus enorm, hnorm, eh_proj,
    embed_tokens and shared_head, all random."""
    tensors = load_file(str(path))
    last, mtp, hidden = config.num_hidden_layers - 1, config.num_hidden_layers, config.hidden_size
    g = torch.Generator().manual_seed(1234)
    def rand(shape, norm=False):
        noise = torch.randn(shape, generator=g)
        return 1 + 0.1 * noise if norm else 0.08 * noise
    for name, t in list(tensors.items()):
        prefix = f"model.layers.{last}."
        if name.startswith(prefix):
            tensors[f"model.layers.{mtp}." + name.removeprefix(prefix)] = rand(t.shape, name.endswith("norm.weight"))
    own = {"enorm.weight": rand(hidden, True), "hnorm.weight": rand(hidden, True),
           "eh_proj.weight": rand((hidden, 2 * hidden)), "embed_tokens.weight": rand((config.vocab_size, hidden)),
           "shared_head.norm.weight": rand(hidden, True), "shared_head.head.weight": rand((config.vocab_size, hidden))}
    tensors.update({f"model.layers.{mtp}.{k}": v for k, v in own.items()})
    save_file(tensors, str(path), metadata={"format": "pt"})


def mtp_reference(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    """Logits [T - 1, vocab] of the checkpoint's MTP layer, by transformers' modules: at position p it takes
    the main model's final-normed hidden state at p and the embedding of token p + 1."""
    from transformers import DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm
    hf = DeepseekV3ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    cfg, n = hf.config, hf.config.num_hidden_layers
    w = {k.removeprefix(f"model.layers.{n}."): v for k, v in load_file(str(model_dir / "model.safetensors")).items()
         if k.startswith(f"model.layers.{n}.")}
    block = DeepseekV3DecoderLayer(cfg, layer_idx=n).eval()
    block.load_state_dict(_hf_block_state(w, cfg.n_routed_experts), strict=True)
    def norm(key):
        m = DeepseekV3RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        m.weight.data.copy_(w[key])
        return m
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        hidden = hf.model(ids).last_hidden_state[:, :-1]                      # [1, T - 1, hidden]
        embeds = torch.nn.functional.embedding(ids[:, 1:], w["embed_tokens.weight"])
        h = torch.cat([norm("enorm.weight")(embeds), norm("hnorm.weight")(hidden)], dim=-1) @ w["eh_proj.weight"].T
        positions = torch.arange(h.shape[1])[None]
        mask = torch.full((h.shape[1], h.shape[1]), float("-inf")).triu(1)[None, None]
        h = block(h, attention_mask=mask, position_ids=positions,
                  position_embeddings=hf.model.rotary_emb(h, positions))
        return (norm("shared_head.norm.weight")(h) @ w["shared_head.head.weight"].T)[0]


def _hf_block_state(w: dict, num_experts: int) -> dict:
    """The MTP block's checkpoint tensors in transformers 5's module layout (experts as 3-D tensors)."""
    state = {k: v for k, v in w.items() if not k.startswith(("enorm", "hnorm", "eh_proj", "embed_tokens",
                                                             "shared_head", "mlp.experts."))}
    experts = range(num_experts)
    state["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([w[f"mlp.experts.{e}.gate_proj.weight"], w[f"mlp.experts.{e}.up_proj.weight"]]) for e in experts])
    state["mlp.experts.down_proj"] = torch.stack([w[f"mlp.experts.{e}.down_proj.weight"] for e in experts])
    return state


def make_copying_deepseek(out: Path, damp: float = 0.1) -> Path:
    """A tiny DeepSeek whose target and MTP layer both (mostly) repeat their input token: the output
    head is the embedding and every block's output projections are damped, so greedy decoding repeats
    the prompt's last token and the MTP layer's drafts are accepted (speculative runs of K + 1 tokens).
    The MTP layer still reads the target's hidden state (a damped half of eh_proj) and its own cache."""
    out = make_tiny_deepseek(out, seed=13)
    path = out / "model.safetensors"
    tensors = load_file(str(path))
    embed, mtp = tensors["model.embed_tokens.weight"], f"model.layers.{TINY_DEEPSEEK['num_hidden_layers']}."
    for name in [n for n in tensors if n.endswith(("o_proj.weight", "down_proj.weight"))]:
        tensors[name] = tensors[name] * damp
    hidden = embed.shape[1]
    tensors.update({"lm_head.weight": embed.clone(), mtp + "embed_tokens.weight": embed.clone(),
                    mtp + "shared_head.head.weight": embed.clone(),
                    mtp + "eh_proj.weight": torch.cat([torch.eye(hidden), damp * tensors[mtp + "eh_proj.weight"][:, hidden:]],
                                                      dim=1)})
    save_file(tensors, str(path), metadata={"format": "pt"})
    return out


BLOCK_DEEPSEEK = dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=2,
                      first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=128,
                      kv_lora_rank=128, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64)
UNQUANTIZED = ("embed_tokens", "lm_head", "gate", "head")     # DeepSeek-V3's FP8 checkpoint keeps these bf16


def write_block_fp8_deepseek(src: Path, dst: Path) -> Path:
    """`src` (an unquantized tiny DeepSeek whose linears fill 128x128 blocks) saved as DeepSeek-V3 ships its
    FP8 checkpoint: every linear weight in e4m3 with `weight_scale_inv` per 128x128 block (kv_b_proj, the
    experts and the MTP layer's eh_proj included), the embeddings, lm_head, routers and norms as they were."""
    import json
    import shutil
    from atom_aot.ops.fp8 import quantize_weight_blocks
    shutil.copytree(src, dst)
    tensors = {}
    for name, t in load_file(str(src / "model.safetensors")).items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and t.dim() == 2 and module.rpartition(".")[2] not in UNQUANTIZED:
            q, scale = quantize_weight_blocks(t)
            tensors.update({name: q, f"{module}.weight_scale_inv": scale})
        else:
            tensors[name] = t
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": [128, 128]}
    (dst / "config.json").write_text(json.dumps(config))
    return dst
