"""What serving may still choose once an artifact is built (the build fixed the rest).

Each field is also a command-line flag of `atom-run ART serve|generate` (atom_aot/config_flags.py),
and `__post_init__` checks every value, so a bad one fails before any weight is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from atom_aot.config_flags import flag
from atom_aot.errors import StartupError

SPECULATIVE_METHODS = ("mtp", "ngram", "draft")     # --method: the proposers of runtime/spec/

DEFAULT_CPU_KV_BYTES = 1 << 30
# The token budget of one step unless one is asked for. Every other request waits on the step in flight (its
# next token, or its first), so on the CPU steps are kept short: SmolLM2-135M's one 8,000-token step took ~93 s
# on a quiet 2-core host (~12 ms a token), so 128 tokens are about a second, less early in a prompt (the
# attention's share grows with the context). A GPU computes 8192 in tens of milliseconds and gains throughput
# from large steps.
DEFAULT_STEP_TOKENS_GPU = 8192
DEFAULT_STEP_TOKENS_CPU = 128
# The offline engine's (LLMEngine) on a GPU: vLLM's offline `LLM` default on GPUs of 70 GiB or more (every GPU arch
# built for here: Hopper, MI300; its server keeps 8192, as ours does). With no client waiting on a step, a batch of
# prompts prefills in half the steps, each reading the weights once, and an MoE layer's experts get twice the
# tokens per GEMM.
DEFAULT_STEP_TOKENS_GPU_OFFLINE = 16384
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class RuntimeConfig:
    max_num_seqs: int = flag(256, "--max-num-seqs", help="sequences in one batch")
    max_num_batched_tokens: int | None = flag(None, "--max-num-batched-tokens",
                                              help=f"tokens computed in one step; longer prompts are chunked "
                                                   f"(default: {DEFAULT_STEP_TOKENS_GPU} on a GPU, "
                                                   f"{DEFAULT_STEP_TOKENS_GPU_OFFLINE} in the offline LLMEngine "
                                                   f"there, {DEFAULT_STEP_TOKENS_CPU} on the CPU)")
    max_model_len: int | None = flag(None, "--max-model-len", help="longest sequence served; at most the "
                                     "artifact's (default: the artifact's)")
    enable_prefix_caching: bool = flag(True, "--enable-prefix-caching", negate="--no-prefix-caching",
                                       help="turn off reuse of cached prompt blocks (prefix caching)")
    scheduler_delay_factor: float = flag(0.0, "--scheduler-delay-factor",
                                         help="wait this many last-prefill latencies to gather prompts")
    scheduling_policy: str = flag("fcfs", "--scheduling-policy", choices=SCHEDULING_POLICIES,
                                  help="fcfs: first come, first served (a request's priority must be 0); "
                                       "priority: waiting requests by their priority (lower first), then arrival, "
                                       "and the lowest-priority running one preempted first (vLLM's policies)")
    kv_cache_memory_bytes: int | None = flag(None, "--kv-cache-memory-bytes",
                                             help="KV pool budget on the CPU (default: 1 GiB)")
    gpu_memory_utilization: float = flag(0.9, "--gpu-memory-utilization",
                                         help="share of GPU memory the engine may take")
    num_kv_blocks: int | None = flag(None, "--num-kv-blocks", help="exact KV pool size (overrides both budgets)")
    enforce_eager: bool = flag(False, "--enforce-eager",
                               help="run the model module eagerly: no compiled code, no graphs (debugging)")
    seed: int = flag(0, "--seed", help="sampling seed of requests that bring none of their own")
    async_scheduling: bool = flag(True, "--async-scheduling", negate="--no-async-scheduling",
                                  help="turn off async scheduling: prepare each step after the previous step's "
                                       "tokens are read, not while the device computes it")
    num_threads: int | None = flag(None, "--num-threads", help="torch threads for CPU work (default: "
                                   "OMP_NUM_THREADS if set, else the CPUs this process may run on)")
    method: str | None = flag(None, "--method", choices=SPECULATIVE_METHODS,
                              help="speculative decoding: the proposer of draft tokens (docs/speculative.md)")
    num_speculative_tokens: int | None = flag(None, "--num-speculative-tokens",
                                              help="speculative decoding: draft tokens verified per step (K)")
    draft_model: str | None = flag(None, "--draft-model", help="--method draft: the draft model's artifact "
                                   "(same tokenizer as the served model)")
    ngram_min_n: int = flag(2, "--ngram-min-n", help="--method ngram: the shortest suffix matched")
    ngram_max_n: int = flag(4, "--ngram-max-n", help="--method ngram: the longest suffix matched")
    grammar_compile_timeout: float = flag(10.0, "--grammar-compile-timeout",
                                          help="seconds one structured output's grammar may take to compile (in "
                                               "a worker process, off the engine loop); a slower one refuses its "
                                               "request")
    grammar_compile_workers: int = flag(2, "--grammar-compile-workers",
                                        help="processes compiling grammars, one compile each at a time")
    trusted_keys: str | None = flag(None, "--trusted-keys", help="refuse the artifact (and a --draft-model) "
                                    "before anything in it is loaded unless one of the ed25519 public keys (*.pem, "
                                    "*.pub) in this folder signed it (docs/artifact-format.md)")

    def __post_init__(self):
        _check_int(self, "max_num_seqs", minimum=1)
        _check_int(self, "max_num_batched_tokens", minimum=1, optional=True)
        _check_int(self, "max_model_len", minimum=1, optional=True)
        _check_int(self, "kv_cache_memory_bytes", minimum=1, optional=True)
        _check_int(self, "num_kv_blocks", minimum=2, optional=True)
        _check_int(self, "seed", minimum=0)
        _check_int(self, "num_threads", minimum=1, optional=True)
        _check_int(self, "grammar_compile_workers", minimum=1)
        _require(_is_number(self.grammar_compile_timeout) and self.grammar_compile_timeout > 0,
                 "grammar_compile_timeout", f"must be a number of seconds > 0, got {self.grammar_compile_timeout!r}")
        self._check_speculation()
        for name in ("enable_prefix_caching", "enforce_eager"):
            _require(isinstance(getattr(self, name), bool), name, f"must be true or false, got {getattr(self, name)!r}")
        _require(self.scheduling_policy in SCHEDULING_POLICIES, "scheduling_policy",
                 f"must be one of {', '.join(SCHEDULING_POLICIES)}, got {self.scheduling_policy!r}")
        _require(_is_number(self.scheduler_delay_factor) and self.scheduler_delay_factor >= 0,
                 "scheduler_delay_factor", f"must be a number >= 0, got {self.scheduler_delay_factor!r}")
        _require(_is_number(self.gpu_memory_utilization) and 0 < self.gpu_memory_utilization <= 1,
                 "gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization!r}")

    def _check_speculation(self) -> None:
        _require(self.method is None or self.method in SPECULATIVE_METHODS, "method",
                 f"must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.method!r}")
        _check_int(self, "num_speculative_tokens", minimum=1, optional=self.method is None)
        _require(self.method is not None or self.num_speculative_tokens is None, "num_speculative_tokens",
                 "needs a speculative method (--method ngram|draft|mtp)")
        _require((self.method == "draft") == (self.draft_model is not None), "draft_model",
                 "is given exactly with --method draft (the draft model's artifact)")
        _check_int(self, "ngram_min_n", minimum=1)
        _check_int(self, "ngram_max_n", minimum=self.ngram_min_n)

    def served_max_model_len(self, artifact_limit: int) -> int:
        """The artifact's limit, or a lower one asked for; a higher one is an error, never a silent clamp."""
        if self.max_model_len is not None and self.max_model_len > artifact_limit:
            raise StartupError(f"max_model_len / --max-model-len {self.max_model_len} is above this artifact's limit "
                               f"of {artifact_limit} tokens (fixed when it was built). Ask for at most "
                               f"{artifact_limit}, or build an artifact with atom-build --max-model-len "
                               f"{self.max_model_len}.")
        return self.max_model_len or artifact_limit

    def for_offline(self, arch: str) -> RuntimeConfig:
        """This config with the offline engine's step budget on a GPU target where none was asked for (one asked
        for is kept; the CPU's stays for_target's)."""
        if self.max_num_batched_tokens is not None or arch == "cpu":
            return self
        return replace(self, max_num_batched_tokens=DEFAULT_STEP_TOKENS_GPU_OFFLINE)

    def for_target(self, arch: str) -> RuntimeConfig:
        """This config with the step budget of the artifact's target (`arch`, the manifest's) where none was asked
        for; one asked for is kept."""
        if self.max_num_batched_tokens is not None:
            return self
        return replace(self, max_num_batched_tokens=default_step_tokens(arch))

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}


def default_step_tokens(arch: str) -> int:
    return DEFAULT_STEP_TOKENS_CPU if arch == "cpu" else DEFAULT_STEP_TOKENS_GPU


def max_scored_prompt_rows(max_num_seqs: int) -> int:
    """Prompt positions one step scores (prompt_logprobs; each is a logits row over the vocabulary): the scheduler
    chunks scored prompts to this, so the memory the engine keeps free for logits rows is bounded."""
    return 4 * max_num_seqs


def _check_int(config: RuntimeConfig, name: str, minimum: int, optional: bool = False) -> None:
    value = getattr(config, name)
    if value is None and optional:
        return
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    _require(ok, name, f"must be an integer >= {minimum}, got {value!r}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require(ok: bool, name: str, problem: str) -> None:
    """The message names the option both ways a user may have set it: LLMEngine(name=...) and --flag."""
    if not ok:
        option = next(f for f in fields(RuntimeConfig) if f.name == name)
        flag_name = option.metadata["cli"]["negate"] or option.metadata["cli"]["flags"][0]
        raise ValueError(f"{name} ({flag_name}) {problem}")
