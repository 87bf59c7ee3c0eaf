"""The named GPU benchmark scenarios: each one a declarative entry (model, weights, build flags, workload, the
peer's settings), so a figure in the docs names the one command that measures it again."""
from __future__ import annotations

from dataclasses import dataclass

WEIGHTS = ("random", "dummy", "dummy-at-load", "same-draws")
KINDS = ("throughput", "prefill", "sampled", "tpot", "cold", "serving", "step_profile")

# Both engines, every scenario (the peer harness's settings): memory share, longest sequence, batch slots.
GPU_MEMORY_UTILIZATION = 0.85
MAX_MODEL_LEN = 4096
MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class Model:
    """A real architecture's config (by name, from the assets' configs/) with random weights.

    weights: random = a safetensors folder both engines load (scripts/make_random_model.py); dummy = a config +
    tokenizer folder, weights drawn by each engine (atom-build --load-format dummy, vLLM load_format=dummy);
    dummy-at-load = the same, ours drawing at every load (models too big for the GPU machine's disk);
    same-draws = ours drawing at every load, vLLM loading a checkpoint of the same draws (make_random_model on the
    GPU, experts under the Hub's names): MoE models, where vLLM's own dummy weights send every token to about the
    same experts, and the disk holds one copy of the weights, not two."""
    name: str               # names its folder and artifact in the runner's work folder
    config: str
    tokenizer: str
    weights: str = "random"
    overrides: tuple[tuple[str, object], ...] = ()
    checkpoint: tuple[str, ...] = ()    # scripts/make_random_model.py's flags for the folder it writes (random, same-draws)

    def label(self) -> str:
        changed = ", ".join(f"{k}={v}" for k, v in self.overrides)
        return self.config + (f" with {changed}" if changed else "")


@dataclass(frozen=True)
class Workload:
    """What is measured, by the same code for both engines (atom_aot/bench/gpu/measure.py).

    throughput: N prompts of I random token ids, O new tokens each, greedy, ignore_eos, one generate call;
    prefill: the same prompts with one new token each (the prefill alone); sampled: the same as throughput at
    `sampling`; tpot: batch 1, a 128-token prompt, (t(1 + D tokens) - t(1)) / D, median
    of 3; cold: fresh processes, spawn to first token; serving: the OpenAI server under
    atom_aot.bench.serving (random prompts at `request_rate` per second or `max_concurrency` at once, with a
    shared prefix of `prefix_len` tokens); step_profile: a decode step at batch `num_prompts` over `input_len`-token
    prompts, kernel by kernel under torch's profiler, each engine started once more for it
    (scripts/profile_decode.py, scripts/gpu/vllm_decode_profile.py)."""
    kinds: tuple[str, ...]
    num_prompts: int = 256
    input_len: int = 1024
    output_len: int = 512
    decode_tokens: int = 256
    sampling: tuple[tuple[str, float], ...] = ()
    request_rate: float | None = None
    max_concurrency: int | None = None
    prefix_len: int = 0


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    model: Model
    workload: Workload
    build_flags: tuple[str, ...] = ()
    ours_kwargs: tuple[tuple[str, object], ...] = ()     # LLMEngine / `atom-run serve` settings beyond the shared ones
    vllm_kwargs: tuple[tuple[str, object], ...] = ()     # vllm.LLM / `vllm serve` settings beyond the shared ones
    gpus: int = 1
    max_model_len: int = MAX_MODEL_LEN       # built into the artifact and given to both engines
    notes: str = ""


QWEN3_06B = Model("qwen3-0.6b", "qwen3-0.6b", "qwen3")
LLAMA_8B = Model("llama-3.1-8b", "llama-3.1-8b", "llama3")
LLAMA_8B_DUMMY = Model("llama-3.1-8b", "llama-3.1-8b", "llama3", "dummy")
MOE_16L = Model("qwen3-30b-a3b-16l", "qwen3-30b-a3b", "qwen3", "dummy-at-load",
                (("num_hidden_layers", 16), ("max_window_layers", 16)))
DEEPSEEK_5L = Model("deepseek-v3-5l", "deepseek-v3", "llama3", "same-draws",
                    (("num_hidden_layers", 5), ("num_nextn_predict_layers", 0), ("vocab_size", 128256)))
GLM_AIR_12L = Model("glm-4.5-air-12l", "glm-4.5-air", "qwen3", "same-draws",
                    (("num_hidden_layers", 12), ("num_nextn_predict_layers", 0), ("vocab_size", 151936)))
KIMI_K2_3L = Model("kimi-k2-3l", "kimi-k2", "llama3", "dummy-at-load",
                   (("num_hidden_layers", 3), ("vocab_size", 128256)))
# DeepSeek's own FP8 format: 128x128-block e4m3 linears with weight_scale_inv, one checkpoint both engines load
DEEPSEEK_5L_FP8 = Model("deepseek-v3-5l-fp8", "deepseek-v3", "llama3", "random",
                        (("num_hidden_layers", 5), ("num_nextn_predict_layers", 0), ("vocab_size", 128256)),
                        checkpoint=("--hub-expert-names", "--fp8-blocks"))
DEEPSEEK_5L_MTP = Model("deepseek-v3-5l-mtp-32e", "deepseek-v3", "llama3", "dummy",
                        (("num_hidden_layers", 5), ("num_nextn_predict_layers", 1), ("n_routed_experts", 32),
                         ("vocab_size", 128256)))
# gpt-oss-20b's shapes with bf16 experts (scripts/gpu/configs/gpt-oss-20b.json: its config.json without the MXFP4
# quantization_config); the assets have no o200k tokenizer, so Llama-3's, with the vocabulary cut to it
GPT_OSS_20B = Model("gpt-oss-20b", "gpt-oss-20b", "llama3", "dummy-at-load", (("vocab_size", 128256),))

OFFLINE = Workload(("throughput", "tpot"))
OFFLINE_PREFILL = Workload(("throughput", "prefill", "tpot", "step_profile"))
OFFLINE_1000 = Workload(("throughput",), num_prompts=1000, input_len=1000, output_len=1000)
FP8 = ("--quant", "fp8", "--kv-cache-dtype", "fp8")
VLLM_FP8 = (("quantization", "fp8"), ("kv_cache_dtype", "fp8"))
SAMPLED = (("temperature", 0.8), ("top_p", 0.95))

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("qwen3-0.6b-throughput", "greedy throughput 256 x 1024/512 and batch-1 TPOT", QWEN3_06B, OFFLINE),
    Scenario("qwen3-0.6b-sampled", "throughput 256 x 1024/512 at temperature 0.8, top-p 0.95", QWEN3_06B,
             Workload(("sampled",), sampling=SAMPLED),
             notes="the bundled vLLM has no FlashInfer: it samples top-p with its PyTorch sort"),
    Scenario("qwen3-0.6b-tpot", "batch-1 TPOT, 128-token prompt, 256 tokens decoded", QWEN3_06B,
             Workload(("tpot",))),
    Scenario("qwen3-0.6b-cold-start", "fresh process to first token (vLLM: cold and warm compile cache, eager)",
             QWEN3_06B, Workload(("cold",))),
    Scenario("qwen3-0.6b-serving-rate", "OpenAI server, random 1024/128, 1000 prompts at 32 requests/s",
             QWEN3_06B, Workload(("serving",), num_prompts=1000, input_len=1024, output_len=128, request_rate=32.0)),
    Scenario("qwen3-0.6b-prefix-sharing", "OpenAI server, 512 shared + 512 own prompt tokens, 128 out, 64 at once",
             QWEN3_06B, Workload(("serving",), num_prompts=1000, input_len=512, output_len=128, max_concurrency=64,
                                 prefix_len=512)),
    Scenario("llama-3.1-8b-throughput", "bf16 greedy throughput 256 x 1024/512 and batch-1 TPOT", LLAMA_8B, OFFLINE),
    Scenario("llama-3.1-8b-throughput-1000", "bf16 greedy throughput 1000 x 1000/1000", LLAMA_8B, OFFLINE_1000),
    Scenario("llama-3.1-8b-fp8-throughput", "FP8 W8A8 + fp8 KV, throughput 256 x 1024/512 and batch-1 TPOT",
             LLAMA_8B, OFFLINE, build_flags=FP8, vllm_kwargs=VLLM_FP8),
    Scenario("llama-3.1-8b-fp8-throughput-1000", "FP8 W8A8 + fp8 KV, throughput 1000 x 1000/1000",
             LLAMA_8B, OFFLINE_1000, build_flags=FP8, vllm_kwargs=VLLM_FP8),
    Scenario("llama-3.1-8b-tp2", "tensor parallel over 2 GPUs, throughput 256 x 1024/512 and TPOT", LLAMA_8B_DUMMY,
             OFFLINE, build_flags=("-tp", "2"), vllm_kwargs=(("tensor_parallel_size", 2),), gpus=2),
    Scenario("llama-3.1-8b-tp4", "tensor parallel over 4 GPUs, throughput 256 x 1024/512 and TPOT", LLAMA_8B_DUMMY,
             OFFLINE, build_flags=("-tp", "4"), vllm_kwargs=(("tensor_parallel_size", 4),), gpus=4),
    Scenario("qwen3-30b-a3b-16l-tp2", "MoE, Qwen3-30B-A3B cut to 16 layers, experts split by -tp 2", MOE_16L,
             OFFLINE, build_flags=("-tp", "2"), vllm_kwargs=(("tensor_parallel_size", 2),), gpus=2),
    Scenario("qwen3-30b-a3b-16l-ep2", "MoE, Qwen3-30B-A3B cut to 16 layers, whole experts per rank (-tp 2 --ep)",
             MOE_16L, OFFLINE, build_flags=("-tp", "2", "--ep"),
             vllm_kwargs=(("tensor_parallel_size", 2), ("enable_expert_parallel", True)), gpus=2),
    Scenario("deepseek-v3-5l", "DeepSeek-V3 cut to 5 layers (3 dense, 2 MoE of 256 experts), throughput, prefill, "
             "TPOT and the decode step's kernels", DEEPSEEK_5L, OFFLINE_PREFILL),
    Scenario("deepseek-v3-5l-fp8", "DeepSeek-V3 cut to 5 layers in DeepSeek's FP8 checkpoint format (128x128-block "
             "W8A8 linears and experts), throughput, prefill, TPOT and the decode step's kernels", DEEPSEEK_5L_FP8, OFFLINE_PREFILL,
             notes="one checkpoint, block-quantized as DeepSeek ships it, loaded by both engines; the KV cache is "
                   "bf16 in both"),
    Scenario("glm-4.5-air-12l", "GLM-4.5-Air cut to 12 layers (1 dense, 11 MoE of 128 experts + a shared one), "
             "throughput and TPOT", GLM_AIR_12L, OFFLINE,
             notes="vLLM loads a checkpoint of our draws (~52 GB): its own dummy weights draw the router's correction "
                   "bias uniform in +-1e-3, which sends every token to about the same experts (docs/deepseek.md)"),
    Scenario("kimi-k2-3l", "Kimi-K2 cut to 3 layers (1 dense, 2 MoE of 384 experts in one group), throughput and "
             "TPOT", KIMI_K2_3L, OFFLINE,
             notes="weights drawn by each engine (a checkpoint of our draws, two MoE layers of 384 experts, would not fit "
                   "the GPU machine's disk): vLLM's dummy draws the router's correction bias uniform in +-1e-3, which "
                   "can send every token to the same experts (docs/deepseek.md), so its figures are not of the same "
                   "model"),
    Scenario("gpt-oss-20b-throughput", "GPT-OSS-20B shapes, bf16 experts (sinks, 128-token windows on half the "
             "layers, clamped SwiGLU experts): throughput 256 x 1024/512 and batch-1 TPOT", GPT_OSS_20B, OFFLINE),
    Scenario("gpt-oss-20b-long-prompt", "GPT-OSS-20B shapes, bf16 experts: throughput 64 x 8192/256, where the "
             "window skips most keys of the sliding layers", GPT_OSS_20B,
             Workload(("throughput",), num_prompts=64, input_len=8192, output_len=256), max_model_len=8704),
    Scenario("llama-3.1-8b-spec-ngram", "batch-1 TPOT with n-gram speculation, 3 tokens", LLAMA_8B,
             Workload(("tpot",)), ours_kwargs=(("method", "ngram"), ("num_speculative_tokens", 3)),
             vllm_kwargs=(("speculative_config", {"method": "ngram", "num_speculative_tokens": 3,
                                                  "prompt_lookup_min": 2, "prompt_lookup_max": 4}),)),
    Scenario("deepseek-v3-5l-spec-mtp", "batch-1 TPOT with the MTP layer proposing 1 token (32 experts)",
             DEEPSEEK_5L_MTP, Workload(("tpot",)), ours_kwargs=(("method", "mtp"), ("num_speculative_tokens", 1)),
             vllm_kwargs=(("speculative_config", {"method": "mtp", "num_speculative_tokens": 1}),)),
)}


class UnknownScenario(ValueError):
    pass


def scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise UnknownScenario(f"no scenario named {name!r}; the scenarios are: {', '.join(SCENARIOS)}") from None


def table() -> str:
    """The scenarios as a Markdown table (`--list`)."""
    rows = ["| scenario | model (weights) | workload | our build flags | our engine | vLLM settings | GPUs |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in SCENARIOS.values():
        ours = ", ".join(f"{k}={v}" for k, v in s.ours_kwargs) or "-"
        vllm = ", ".join(f"{k}={v}" for k, v in s.vllm_kwargs) or "-"
        rows.append(f"| {s.name} | {s.model.label()} ({s.model.weights}) | {s.summary} | "
                    f"{' '.join(s.build_flags) or '-'} | {ours} | {vllm} | {s.gpus} |")
    return "\n".join(rows)


VLLM_DRAWS = ("dummy", "dummy-at-load")     # the weights vLLM draws itself (load_format="dummy"); it loads the others


def engine_kwargs_vllm(s: Scenario) -> dict:
    """The scenario's vLLM settings; dummy weights are drawn by vLLM as ours are at build. random and same-draws
    weights are a checkpoint vLLM loads (same-draws: the checkpoint of our draws, whose routing spreads tokens
    over the experts as ours does; vLLM's own draws route them to about the same few)."""
    kwargs = dict(s.vllm_kwargs)
    if s.model.weights in VLLM_DRAWS:
        kwargs["load_format"] = "dummy"
    return kwargs
