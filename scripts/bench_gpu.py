"""GPU benchmark of atom-aot against Hugging Face transformers, vLLM and the hardware roofline.

One run per model shape; every section writes into one JSON (--out) and a failing section is
recorded, not fatal. Sections:
  build        atom-build the model (tuning, export and compile per phase, graph probe)
  correctness  bf16 logits of ours vs transformers on the same weights (relative error, argmax agreement)
  cold_start   fresh process to first token: from the artifact (twice), the JIT path (build from the HF
               folder into an empty cache, then serve), and transformers (load + generate one token)
  tpot         batch-1 decode time per output token: ours, transformers (static cache + torch.compile,
               its fastest mode), and the HBM roofline (weight bytes per token / measured copy bandwidth)
  throughput   offline: N prompts of I random tokens, O new tokens each (ignore_eos), ours vs transformers
  throughput_temperature, throughput_top_p, throughput_top_k_top_p
               the same workload sampled (not in the default sections): what sampling costs
  vllm         (not in the default sections) vLLM on the same folder, the throughput workload and the
               tpot prompt, in a process of its own (scripts/vllm_peer.py), after our sections; the JSON
               gets vLLM's figures and the ratios to ours. vLLM must be importable (on the GPU machine:
               ../shared/tools/vllm-peer/README.md); if it is not, the section fails and says so.

  PYTHONPATH=. python scripts/bench_gpu.py --model-dir DIR --name qwen3-0.6b --out $OUT/qwen3.json
  PYTHONPATH=.:/tmp/vsite python scripts/bench_gpu.py ... --sections build,tpot,throughput,vllm
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

SECTIONS = ("build", "correctness", "tpot", "cold_start", "throughput", "throughput_hf")  # the default run
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"     # cpu: a smoke run of the script itself


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def free_memory():
    """Engines and models hold GPU memory until collected; the next section needs it."""
    import gc
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True, type=Path)
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--cache-dir", type=Path, default=Path("artifacts"))
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--hf-batch", type=int, default=64, help="transformers' batch for the throughput run")
    p.add_argument("--no-graphs", action="store_true", help="build without CUDA-graph capture sizes")
    p.add_argument("--no-jit-cold-start", action="store_true", help="skip the cold-start leg that rebuilds")
    p.add_argument("--skip-hf", default="", help="comma list of sections whose transformers side is skipped")
    p.add_argument("--vllm-engine-kwargs", default="{}",
                   help='vllm section: extra vllm.LLM arguments, e.g. {"quantization": "fp8", "kv_cache_dtype": "fp8"}')
    return p.parse_args(argv)


class Report:
    def __init__(self, path: Path, meta: dict):
        self.path, self.data = path, {"meta": meta, "sections": {}, "errors": {}}

    def run(self, name: str, fn, *args):
        start = time.perf_counter()
        try:
            self.data["sections"][name] = fn(*args)
        except Exception:  # noqa: BLE001  (record it; the other sections still run)
            self.data["errors"][name] = traceback.format_exc()[-3000:]
            print(f"[{name}] FAILED\n{self.data['errors'][name]}", flush=True)
        self.data.setdefault("seconds", {})[name] = round(time.perf_counter() - start, 2)
        self.save()

    def save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def build_artifact(args) -> dict:
    from atom_aot.arch import detect_arch
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.isolated import build_isolated
    from atom_aot.build.pipeline import plan
    config = BuildConfig(arch=detect_arch(), max_model_len=args.max_model_len,
                         capture_sizes=() if args.no_graphs else None)
    result = build_isolated(str(args.model_dir), config, args.cache_dir, plan(str(args.model_dir), config)[2])
    args.artifact = result["path"]
    return {"artifact": str(result["path"]), "cached": result["cached"], "stage_seconds": result["seconds"],
            "size_mib": round(result["path"].stat().st_size / 2**20, 1)}


def hf_model(model_dir: Path, dtype: torch.dtype | None = None):
    from transformers import AutoModelForCausalLM
    dtype = dtype or (torch.bfloat16 if DEVICE == "cuda" else torch.float32)
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(DEVICE).eval()


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab - 100, (n, length), generator=g).tolist()


def engine_logits(engine, prompt: list[int]) -> torch.Tensor:
    """Logits of every position of `prompt` through the engine's compiled `mixed` package: [T, V]."""
    from atom_aot.runtime.sampling_params import SamplingParams
    from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
    from atom_aot.runtime.scheduling.sequence import Sequence
    core = engine.core
    seq = Sequence("probe", list(prompt), len(prompt), SamplingParams(prompt_logprobs=0, max_tokens=1),
                   core.block_size)
    core.block_manager.allocate(seq, len(prompt))
    try:
        batch = ScheduledBatch.of((seq,), (len(prompt),), is_prefill=True)
        runner = core.runner
        inputs, _ = runner.prepare_inputs(batch)
        with torch.inference_mode():
            return runner.forwards.mixed(inputs).float()
    finally:
        core.block_manager.free(seq)
        core.runner.inputs.rows.release([seq])


def compare_logits(mine: torch.Tensor, ref: torch.Tensor) -> dict:
    return {"rel_error": float((mine - ref).norm() / ref.norm()), "max_abs_error": float((mine - ref).abs().max()),
            "argmax_agreement": float((mine.argmax(-1) == ref.argmax(-1)).float().mean())}


def correctness(args) -> dict:
    """Our bf16 logits against transformers' in bf16 on the same weights, and both against transformers
    in float32: the bf16 tolerance is how far transformers' own bf16 run is from float32."""
    from atom_aot import LLMEngine
    engine = LLMEngine(str(args.artifact), max_model_len=args.max_model_len, gpu_memory_utilization=0.4)
    vocab = engine.loaded.model_config.vocab_size
    prompts = random_prompts(4, 96, vocab, seed=1) + random_prompts(1, 700, vocab, seed=2)
    ours = [engine_logits(engine, p) for p in prompts]
    engine_dtype = engine.loaded.dtype
    del engine
    free_memory()
    refs = {}
    for dtype in (torch.bfloat16, torch.float32):
        hf = hf_model(args.model_dir, dtype)
        with torch.inference_mode():
            refs[dtype] = [hf(torch.tensor([p], device=DEVICE)).logits[0].float() for p in prompts]
        del hf
        free_memory()
    rows = []
    for p, mine, hf_bf16, fp32 in zip(prompts, ours, refs[torch.bfloat16], refs[torch.float32]):
        rows.append({"tokens": len(p), "ours_vs_hf_bf16": compare_logits(mine, hf_bf16),
                     "ours_vs_fp32": compare_logits(mine, fp32), "hf_bf16_vs_fp32": compare_logits(hf_bf16, fp32)})
    worst = lambda key: max(r[key]["rel_error"] for r in rows)  # noqa: E731
    from atom_aot.dtypes import dtype_name
    return {"dtype": dtype_name(engine_dtype), "prompts": rows,
            "worst_rel_error_ours_vs_hf_bf16": worst("ours_vs_hf_bf16"),
            "worst_rel_error_ours_vs_fp32": worst("ours_vs_fp32"),
            "worst_rel_error_hf_bf16_vs_fp32": worst("hf_bf16_vs_fp32"),
            "min_argmax_agreement_ours_vs_fp32": min(r["ours_vs_fp32"]["argmax_agreement"] for r in rows),
            "min_argmax_agreement_hf_bf16_vs_fp32": min(r["hf_bf16_vs_fp32"]["argmax_agreement"] for r in rows)}


def cold_start(args) -> dict:
    from atom_aot.bench.cold_start import measure
    return measure(args.artifact, str(args.model_dir), {"max_model_len": args.max_model_len},
                   include_hf="cold_start" not in args.skip_hf, include_jit=not args.no_jit_cold_start)


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (median of 20)."""
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    times = []
    for _ in range(25):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); y.copy_(x); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * x.numel() / sorted(times[5:])[len(times[5:]) // 2]


def weight_bytes_per_token(engine) -> int:
    """Bytes one batch-1 decode step must read: every weight but the embedding rows it skips."""
    total = 0
    for name, t in engine.loaded.weights.items():
        if name == "model.embed_tokens.weight" and not engine.loaded.model_config.tie_word_embeddings:
            continue       # a lookup reads one row; tied, the same matrix is read whole as lm_head
        if name.endswith("cos_sin_cache"):
            continue
        total += t.numel() * t.element_size()
    return total


def tpot(args) -> dict:
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(str(args.artifact), max_model_len=args.max_model_len, gpu_memory_utilization=0.4)
    prompt = random_prompts(1, 128, engine.loaded.model_config.vocab_size, seed=3)
    params = SamplingParams(temperature=0, max_tokens=args.decode_tokens, ignore_eos=True)
    engine.generate(prompt, params)                          # warm-up
    runs = [engine.generate(prompt, params)[0]["tpot"] for _ in range(3)]
    ours = sorted(runs)[1]
    weight_bytes = weight_bytes_per_token(engine)
    graph_capture_s = engine.loaded.timings.get("graph capture")   # absent: decode ran without graphs
    del engine
    free_memory()
    result = {"ours_tpot_s": ours, "ours_runs": runs, "weight_bytes_per_token": weight_bytes,
              "ours_cuda_graphs": graph_capture_s is not None, "graph_capture_s": graph_capture_s}
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        bw = copy_bandwidth()
        result.update(copy_bandwidth_bytes_per_s=bw, roofline_tpot_s=weight_bytes / bw,
                      fraction_of_roofline=weight_bytes / bw / ours)
    if "tpot" not in args.skip_hf:
        result.update(hf_tpot(args, prompt[0]))
        result["hf_eager_over_ours"] = result["hf_eager_tpot_s"] / ours
        if "hf_tpot_s" in result:
            result["hf_over_ours"] = result["hf_tpot_s"] / ours
    return result


def hf_decode_tpot(model, ids: torch.Tensor, decode_tokens: int) -> float:
    """Seconds per decode token of `model.generate`: a full run less a one-token run (the prefill), best of 2."""
    kw = dict(max_new_tokens=decode_tokens, min_new_tokens=decode_tokens, do_sample=False)
    model.generate(ids, **kw)                                  # warm-up (and compilation, when compiled)
    times = []
    for _ in range(2):
        sync()
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, do_sample=False)
        sync()
        one = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(ids, **kw)
        sync()
        times.append((time.perf_counter() - start - one) / (decode_tokens - 1))
    return min(times)


def hf_tpot(args, prompt: list[int]) -> dict:
    """transformers at batch 1, eager (dynamic cache) and in its fastest mode: a static cache, with which
    `generate` compiles the decode step itself (torch.compile, CUDA graphs). If that mode fails (5.17
    raised a CUDA-graph overwrite error in `StaticCache.update` on the H200), the same static cache is
    compiled without CUDA graphs, and the JSON says which mode ran and why."""
    from transformers import CompileConfig
    model = hf_model(args.model_dir)
    ids = torch.tensor([prompt], device=DEVICE)
    result = {"hf_eager_tpot_s": hf_decode_tpot(model, ids, args.decode_tokens)}
    model.generation_config.cache_implementation = "static"
    modes = [("static cache, generate's own torch.compile (CUDA graphs)", None),
             ("static cache, torch.compile without CUDA graphs",
              CompileConfig(fullgraph=True, mode="max-autotune-no-cudagraphs"))]
    for label, compile_config in modes:
        if compile_config is not None:
            model.generation_config.compile_config = compile_config
        try:
            start = time.perf_counter()
            result["hf_tpot_s"] = hf_decode_tpot(model, ids, args.decode_tokens)
            result.update(hf_mode=label, hf_compile_and_measure_s=time.perf_counter() - start)
            break
        except Exception as exc:  # noqa: BLE001  (recorded; the next mode is tried)
            result.setdefault("hf_failed_modes", {})[label] = f"{type(exc).__name__}: {str(exc)[:300]}"
            torch._dynamo.reset()
    del model
    free_memory()
    return result


# What the throughput sections sample with: greedy (the comparison with transformers), and the
# sampled modes, to show what sampling costs (temperature only skips the vocabulary sort).
SAMPLING_MODES = {
    "throughput": {"temperature": 0},
    "throughput_temperature": {"temperature": 0.8},
    "throughput_top_p": {"temperature": 0.8, "top_p": 0.95},
    "throughput_top_k_top_p": {"temperature": 0.8, "top_k": 50, "top_p": 0.95},
}


def throughput(args, mode: str = "throughput") -> dict:
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(str(args.artifact), max_model_len=args.max_model_len, max_num_seqs=256)
    prompts = random_prompts(args.num_prompts, args.input_len, engine.loaded.model_config.vocab_size, seed=4)
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, **SAMPLING_MODES[mode])
    engine.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    out_tokens = sum(o["num_tokens_output"] for o in outs)
    result = {"seconds": elapsed, "output_tokens": out_tokens, "output_tok_s": out_tokens / elapsed,
              "total_tok_s": (out_tokens + args.num_prompts * args.input_len) / elapsed,
              "preemptions": engine.core.scheduler.num_preemptions, "sampling": SAMPLING_MODES[mode]}
    del engine
    free_memory()
    return result


def hf_throughput(args) -> dict:
    """transformers' batched generate (equal-length prompts, so no padding), in batches of --hf-batch."""
    model = hf_model(args.model_dir)
    prompts = random_prompts(args.num_prompts, args.input_len, model.config.vocab_size, seed=4)
    model.generate(torch.tensor(prompts[:2], device=DEVICE), max_new_tokens=4, do_sample=False)
    sync()
    start, out_tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), args.hf_batch):
        ids = torch.tensor(prompts[i:i + args.hf_batch], device=DEVICE)
        out = model.generate(ids, max_new_tokens=args.output_len, min_new_tokens=args.output_len, do_sample=False)
        out_tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    sync()
    elapsed = time.perf_counter() - start
    del model
    free_memory()
    return {"seconds": elapsed, "output_tokens": out_tokens, "output_tok_s": out_tokens / elapsed,
            "mode": f"generate, batches of {args.hf_batch}, dynamic cache, sdpa"}


VLLM_MISSING = ("the vllm section needs vLLM importable by this Python (e.g. PYTHONPATH=/tmp/vsite after "
                "installing the offline bundle: ../shared/tools/vllm-peer/README.md)")


def vllm_peer(args) -> dict:
    """vLLM's figures on our workloads, from scripts/vllm_peer.py in a process of its own."""
    part = args.out.with_name(args.out.stem + ".vllm.json")
    command = [sys.executable, str(Path(__file__).with_name("vllm_peer.py")), "--model-dir", str(args.model_dir),
               "--out", str(part), "--max-model-len", str(args.max_model_len), "--decode-tokens",
               str(args.decode_tokens), "--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len),
               "--output-len", str(args.output_len), "--engine-kwargs", args.vllm_engine_kwargs]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        if "No module named 'vllm'" in proc.stderr:
            raise RuntimeError(VLLM_MISSING)
        raise RuntimeError(f"scripts/vllm_peer.py exited with {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(part.read_text())


def vllm_ratios(done: dict) -> dict:
    """ours / vLLM for output tok/s, vLLM / ours for TPOT (above 1: ours is the better), where both ran."""
    peer, ratios = done["vllm"], {}
    if done.get("throughput"):
        ratios["throughput_ours_over_vllm"] = done["throughput"]["output_tok_s"] / peer["throughput"]["output_tok_s"]
    if done.get("tpot"):
        ratios["tpot_vllm_over_ours"] = peer["tpot"]["tpot_s"] / done["tpot"]["ours_tpot_s"]
        ratios["tpot_note"] = ("ours: the engine's own per-request TPOT metric; vLLM: "
                               f"{peer['tpot']['method']}, on the same prompt and token count")
    return ratios


def main(argv=None):
    args = parse_args(argv)
    meta = {"name": args.name, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "args": vars(args)}
    try:
        import transformers
        import triton
        meta.update(transformers=transformers.__version__, triton=triton.__version__)
    except ImportError:
        pass
    report = Report(args.out, meta)
    sections = args.sections.split(",")
    report.run("build", build_artifact, args)
    for name, fn in (("correctness", correctness), ("tpot", tpot), ("cold_start", cold_start),
                     *((mode, throughput) for mode in SAMPLING_MODES), ("throughput_hf", hf_throughput)):
        if name in sections and "build" in report.data["sections"]:
            report.run(name, fn, args, *([name] if fn is throughput else []))
    if "vllm" in sections:            # last: the GPU is free of our engines by now
        report.run("vllm", vllm_peer, args)
    done = report.data["sections"]
    if done.get("vllm"):
        done["ratios_vs_vllm"] = vllm_ratios(done)
    ours, hf = done.get("throughput"), done.get("throughput_hf")
    if ours and hf:
        done["throughput_ratio_ours_over_hf"] = ours["output_tok_s"] / hf["output_tok_s"]
    for mode in list(SAMPLING_MODES)[1:]:
        if ours and done.get(mode):
            done[f"{mode}_over_greedy"] = done[mode]["output_tok_s"] / ours["output_tok_s"]
    report.save()
    print(json.dumps({k: v for k, v in report.data["sections"].items() if k != "build"}, indent=1, default=str)[-6000:])


if __name__ == "__main__":
    main()
