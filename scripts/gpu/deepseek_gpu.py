"""DeepSeek-V3-shaped checks on a GPU: logits against transformers on the same random weights,
greedy speculation with the MTP layer, and the batch-1 roofline of the active weight bytes.

  python scripts/gpu/deepseek_gpu.py folder --layers 5 --experts 32 --mtp 1 --out DIR [--tokenizer TOK] [--weights]
  python scripts/gpu/deepseek_gpu.py reference --model DIR --out REF.json        # transformers, bf16 and fp32
  python scripts/gpu/deepseek_gpu.py compare --artifact ART --ref REF.json --out FILE.json
  python scripts/gpu/deepseek_gpu.py mtp --artifact ART --out FILE.json [--k 1,3]
  python scripts/gpu/deepseek_gpu.py roofline --model DIR --out FILE.json

`folder` writes the real DeepSeek-V3 config (scripts/gpu/configs/deepseek-v3.json: its hidden sizes, 128
heads, q/kv LoRA ranks, 8 expert groups, top-8) with fewer layers, experts or MTP layers, and the vocabulary
of the tokenizer given (DeepSeek's own tokenizer is not on the GPU machine). Random weights give near-flat
next-token distributions, so the logits are compared with a noise floor beside them: transformers in bf16
against itself in fp32. Every subcommand writes its JSON as soon as it has something to write.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parent / "configs" / "deepseek-v3.json"
PROMPT_LENGTHS = (16, 64, 128, 200, 256, 333, 512, 700)
GREEDY_TOKENS = 16
TOP = 20


def _device_name() -> str:
    import torch
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _sync() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(100, vocab - 100) for _ in range(n)] for n in PROMPT_LENGTHS]


def write(path: str, data: dict) -> None:
    Path(path).write_text(json.dumps(data, indent=1))


def folder(a) -> None:
    """A config + tokenizer folder (weights drawn by `atom-build --load-format dummy-at-load`), or with
    --weights a random checkpoint transformers can load (scripts/make_random_model.py)."""
    override = {"num_hidden_layers": a.layers, "num_nextn_predict_layers": a.mtp, "n_routed_experts": a.experts,
                "vocab_size": a.vocab, **json.loads(a.override)}
    out = Path(a.out)
    if a.weights:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from make_random_model import make_random_model
        make_random_model(CONFIG, out, Path(a.tokenizer) if a.tokenizer else None, device=a.device, override=override,
                          hub_expert_names=a.hub_expert_names)
    else:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({**json.loads(CONFIG.read_text()), **override}, indent=1))
        if a.tokenizer:
            for f in Path(a.tokenizer).iterdir():
                if f.is_file():
                    shutil.copy(f, out / f.name)
    print(out)


def _top(logits_row) -> dict[int, float]:
    import torch
    logprobs = torch.log_softmax(logits_row.float(), dim=-1)
    values, ids = logprobs.topk(TOP)
    return {int(i): float(v) for i, v in zip(ids, values)}


def reference(a) -> None:
    """transformers' DeepseekV3ForCausalLM on the folder's weights: per prompt the first output position's
    top-20 log-probabilities in bf16 and in fp32, and GREEDY_TOKENS greedy tokens in bf16."""
    import torch
    from transformers import AutoModelForCausalLM
    import transformers
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = {"device": _device_name(), "transformers": transformers.__version__, "model": a.model}
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map=device)
    model.eval()
    model.generation_config.eos_token_id = None          # as ignore_eos: every prompt gets GREEDY_TOKENS
    out["load_s"] = round(time.perf_counter() - t, 1)
    vocab = model.config.vocab_size
    ps = prompts(vocab)
    with torch.no_grad():
        for dtype in ("bf16", "fp32"):
            if dtype == "fp32":
                model = model.float()
            tops, greedy = [], []
            for p in ps:
                ids = torch.tensor([p], device=device)
                tops.append(_top(model(ids).logits[0, -1]))
                if dtype == "bf16":
                    g = model.generate(ids, max_new_tokens=GREEDY_TOKENS, do_sample=False, pad_token_id=0)
                    greedy.append(g[0, len(p):].tolist())
            out[dtype] = {"top": tops, **({"greedy": greedy} if greedy else {})}
            out["seconds"] = round(time.perf_counter() - t, 1)
            write(a.out, out)
    print(json.dumps({k: v for k, v in out.items() if k not in ("bf16", "fp32")}))


def _rows(ours: list[dict], ref: list[dict], ours_greedy=None, ref_greedy=None) -> dict:
    rows = []
    for i, (x, y) in enumerate(zip(ours, ref)):
        x = {int(k): v for k, v in x.items()}
        y = {int(k): v for k, v in y.items()}
        shared = set(x) & set(y)
        diffs = [abs(x[t] - y[t]) for t in shared] or [float("nan")]
        row = {"prompt_len": PROMPT_LENGTHS[i], "top20_shared": len(shared), "argmax_equal": max(x, key=x.get) == max(y, key=y.get),
               "max_abs_logprob_diff": round(max(diffs), 5), "mean_abs_logprob_diff": round(sum(diffs) / len(diffs), 5)}
        if ours_greedy is not None:
            g1, g2 = ours_greedy[i], ref_greedy[i]
            row["greedy_equal_before_first_difference"] = next((j for j, (u, v) in enumerate(zip(g1, g2)) if u != v), len(g1))
        rows.append(row)
    return {"argmax_equal": sum(r["argmax_equal"] for r in rows), "prompts": len(rows),
            "max_abs_logprob_diff": max(r["max_abs_logprob_diff"] for r in rows),
            "mean_abs_logprob_diff": round(sum(r["mean_abs_logprob_diff"] for r in rows) / len(rows), 5), "rows": rows}


def _ours(artifact: str, ps: list[list[int]], alone: list | None = None,
          **engine_options) -> tuple[list[dict], list[list[int]], dict]:
    """Our top logprobs at the first output position, greedy tokens and speculation statistics for `ps` as one
    batch; `alone` (a list) receives each prompt's greedy tokens generated on its own (batch 1)."""
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(artifact, max_model_len=2048, gpu_memory_utilization=0.85, **engine_options)
    try:
        if alone is not None:
            alone.extend(engine.generate([p], SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS,
                                                             ignore_eos=True))[0]["token_ids"] for p in ps)
        tops: dict[str, dict] = {}
        ids = engine.add_request(ps, SamplingParams(temperature=0, max_tokens=1, logprobs=TOP, ignore_eos=True))
        while not engine.is_finished():
            for o in engine.step():
                if o.logprobs:
                    tops[o.request_id] = dict(o.logprobs[0].top)
        greedy = engine.generate(ps, SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True))
        stats = engine.print_mtp_statistics() if engine_options.get("method") else {}
        return [tops[r] for r in ids], [g["token_ids"] for g in greedy], stats
    finally:
        engine.close()


def compare(a) -> None:
    """Ours (bf16 artifact) against transformers bf16 and fp32, and transformers bf16 against fp32 (the floor)."""
    import torch
    ref = json.loads(Path(a.ref).read_text())
    ps = prompts(a.vocab)
    out = {"device": _device_name(), "artifact": a.artifact, "reference": a.ref,
           "transformers": ref.get("transformers"), "prompt_lengths": list(PROMPT_LENGTHS), "greedy_tokens": GREEDY_TOKENS}
    t = time.perf_counter()
    tops, greedy, _ = _ours(a.artifact, ps)
    out["ours_s"] = round(time.perf_counter() - t, 1)
    out["ours_vs_transformers_bf16"] = _rows(tops, ref["bf16"]["top"], greedy, ref["bf16"]["greedy"])
    if "fp32" in ref:
        out["ours_vs_transformers_fp32"] = _rows(tops, ref["fp32"]["top"])
        out["transformers_bf16_vs_fp32 (the floor)"] = _rows(ref["bf16"]["top"], ref["fp32"]["top"])
    write(a.out, out)
    print(json.dumps({k: (v if not isinstance(v, dict) else {x: y for x, y in v.items() if x != "rows"})
                      for k, v in out.items()}, indent=1))


def mtp(a) -> None:
    """Greedy output with the MTP layer drafting k tokens equals the output without speculation, and what
    was accepted (random weights: the MTP layer's draft agrees with the target only by chance)."""
    import torch
    ps = prompts(a.vocab)
    out = {"device": _device_name(), "artifact": a.artifact}
    alone: list[list[int]] = []
    _, base, _ = _ours(a.artifact, ps, alone)
    # the noise floor: bf16 rounding differs with the batch's shape, so random weights' near-flat logits flip
    out["without_speculation_batch_1_vs_batch_8_sequences_equal"] = sum(x == y for x, y in zip(alone, base))
    for k in (int(x) for x in a.k.split(",")):
        _, greedy, stats = _ours(a.artifact, ps, method="mtp", num_speculative_tokens=k)
        out[f"mtp_k{k}"] = {"greedy_equal_without_speculation": greedy == base,
                            "sequences_equal": sum(x == y for x, y in zip(greedy, base)), "stats": stats}
        write(a.out, out)
    print(json.dumps(out, indent=1, default=str))


def roofline(a) -> None:
    """Weight bytes a batch-1 decode step reads (every dense weight, the shared experts and top-k of the routed
    experts per MoE layer, the lm_head, one embedding row) over the device copy bandwidth of this run."""
    import torch
    from atom_aot.weights.random_draw import parameter_shapes
    cfg = json.loads((Path(a.model) / "config.json").read_text())
    shapes = parameter_shapes(Path(a.model))
    itemsize = 2
    experts, top_k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    total = active = 0
    for name, shape in shapes.items():
        n = shape.numel() * itemsize
        layer = name.split(".")[2] if name.startswith("model.layers.") else None
        if layer is not None and int(layer) >= cfg["num_hidden_layers"]:
            continue                                     # the MTP layer: not part of a target step
        total += n
        if "embed_tokens" in name:
            continue                                     # one row per token
        if ".mlp.experts." in name:
            n = n * top_k // experts
        active += n
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda" if torch.cuda.is_available() else "cpu")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    _sync()
    t = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    _sync()
    bandwidth = 2 * 20 * x.numel() / (time.perf_counter() - t)      # read + write
    out = {"device": _device_name(), "model": a.model, "weights_GB": round(total / 1e9, 2),
           "active_GB_per_token_batch_1": round(active / 1e9, 3), "copy_GB_s_read_plus_write": round(bandwidth / 1e9, 1),
           "roofline_tpot_ms": round(active / bandwidth * 1e3, 3)}
    write(a.out, out)
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["folder", "reference", "compare", "mtp", "roofline"])
    p.add_argument("--out", required=True)
    p.add_argument("--model")
    p.add_argument("--artifact")
    p.add_argument("--ref")
    p.add_argument("--tokenizer")
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--mtp", type=int, default=0)
    p.add_argument("--vocab", type=int, default=128256, help="the vocabulary of the tokenizer given (llama3's)")
    p.add_argument("--weights", action="store_true", help="folder: write a random checkpoint too")
    p.add_argument("--device", default="cuda", help="folder --weights: where the tensors are drawn")
    p.add_argument("--hub-expert-names", action="store_true", help="folder --weights: one tensor per expert (vLLM's)")
    p.add_argument("--override", default="{}", help="folder: JSON of further config fields (a CPU dry run's tiny sizes)")
    p.add_argument("--k", default="1,3", help="mtp: draft lengths")
    a = p.parse_args()
    {"folder": folder, "reference": reference, "compare": compare, "mtp": mtp, "roofline": roofline}[a.what](a)


if __name__ == "__main__":
    main()
