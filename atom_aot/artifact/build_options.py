"""What a build decides, torch-free: every field is part of the build key and recorded in the
manifest. The flags of `atom-build` are generated from these fields (atom_aot/config_flags.py),
so choices and defaults are written once; the build's torch-facing view is build/config.py."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from atom_aot.artifact.fields import Reader
from atom_aot.config_flags import flag, to_argv

ARCHES = ("cpu", "sm80", "sm90", "sm100", "gfx942", "gfx950")
DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
QUANT_MODES = ("none", "fp8", "int8")
KV_CACHE_DTYPES = ("auto", "bf16", "fp8")
DTYPES = ("auto", "float32", "bfloat16", "float16")
COMPILE_MODES = ("aoti", "none")
LOAD_FORMATS = ("auto", "dummy", "dummy-at-load")
DRAWN_AT_LOAD = "dummy-at-load"       # random weights the artifact does not store: the runtime draws them


# Build options a user does not pass as build options when a model is built for serving: the arch is
# this machine's, and max_model_len is the runtime option of the same name (the build takes it from there).
DECIDED_AT_SERVE_TIME = ("arch", "max_model_len")


def parse_capture_sizes(text: str) -> tuple[int, ...]:
    if text == "none":
        return ()
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise ValueError(f"--capture-sizes must be comma-separated integers or 'none', got {text!r}") from None


def render_capture_sizes(sizes: tuple[int, ...]) -> str:
    return ",".join(map(str, sizes)) or "none"


@dataclass(frozen=True)
class BuildOptions:
    arch: str = flag("cpu", "--arch", choices=ARCHES,
                     help="target arch; must be this machine's (kernels are measured on it)")
    dtype: str = flag("auto", "--dtype", choices=DTYPES, help="model dtype (auto: float32 on cpu, bfloat16 on GPUs)")
    tensor_parallel_size: int = flag(
        1, "-tp", "--tensor-parallel-size",
        help="tensor-parallel ranks: weights are split per rank at build; building needs one device of the target "
             "arch, not N (serving needs N: processes on cpu, one GPU each on GPUs)")
    enable_expert_parallel: bool = flag(False, "--ep", "--enable-expert-parallel",
                                        help="MoE models with -tp N: each rank holds E/N whole experts "
                                             "(default: 1/N of every expert's width); attention stays split by -tp. "
                                             "With -dp N: the experts are spread over the N data-parallel ranks")
    data_parallel_size: int = flag(
        1, "-dp", "--data-parallel-size",
        help="MoE models, with --ep: data-parallel attention over N ranks (ATOM's and vLLM's DP attention + EP): "
             "each rank holds the whole model but E/N experts, runs its own sequences, and the expert layers "
             "gather every rank's tokens. Served by `atom-run ART serve` as N engine cores (N processes on cpu, "
             "one GPU each on GPUs). A dense model is replicated at serve time instead (atom-run ... serve -dp N)")
    quant: str = flag("none", "--quant", choices=QUANT_MODES,
                      help="fp8: quantize an unquantized checkpoint to FP8 W8A8 (e4m3 weights with per-channel "
                           "scales x activations quantized per token at run time; GEMMs in FP8); int8: the same "
                           "in int8 (symmetric, GEMMs in int8 with int32 accumulation). A pre-quantized "
                           "checkpoint (fp8, compressed-tensors float8 or int8, fbgemm_fp8) is detected from its "
                           "config.json and needs no flag")
    kv_cache_dtype: str = flag("auto", "--kv-cache-dtype", choices=KV_CACHE_DTYPES,
                               help="KV-cache dtype (auto: the model dtype)")
    capture_sizes: tuple[int, ...] | None = flag(
        None, "--capture-sizes", parse=parse_capture_sizes, render=render_capture_sizes,
        help="CUDA-graph batch sizes, e.g. 1,2,4,8 or none (default: the arch's list)")
    max_model_len: int | None = flag(None, "--max-model-len",
                                     help="longest sequence served (default: the model's max_position_embeddings)")
    block_size: int = flag(16, "--block-size", help="tokens per KV-cache block (a power of two)")
    compile: str = flag("aoti", "--compile", choices=COMPILE_MODES,
                        help="aoti: AOTInductor packages; none: weights only, the runtime runs eagerly")
    load_format: str = flag("auto", "--load-format", choices=LOAD_FORMATS,
                            help="dummy: random weights of the config's shapes, drawn at build and stored (vLLM's "
                                 "--load-format dummy; for benchmarks; --model is a folder with config.json and "
                                 "a tokenizer, no weights are read). dummy-at-load: the same weights, not stored: "
                                 "drawn on the device at every load (load time includes the draw), for benchmarks "
                                 "of models too big for the disk; the numbers equal dummy's for the same config, "
                                 "seed and device type")

    def __post_init__(self):
        _check(self.arch in ARCHES, f"--arch must be one of {', '.join(ARCHES)} (or auto), got {self.arch!r}")
        _check(self.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        _check(self.quant in QUANT_MODES, f"--quant must be one of {', '.join(QUANT_MODES)}, got {self.quant!r}")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES,
               f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        _check(self.compile in COMPILE_MODES, f"--compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        _check(self.load_format in LOAD_FORMATS,
               f"--load-format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        _check(_is_int(self.tensor_parallel_size) and self.tensor_parallel_size >= 1,
               f"-tp must be an integer >= 1, got {self.tensor_parallel_size!r}")
        _check(_is_int(self.data_parallel_size) and self.data_parallel_size >= 1,
               f"-dp must be an integer >= 1, got {self.data_parallel_size!r}")
        _check(self.data_parallel_size == 1 or self.tensor_parallel_size == 1,
               f"-tp {self.tensor_parallel_size} with -dp {self.data_parallel_size}: attention is either split (-tp) "
               f"or data-parallel (-dp), not both, in this version")
        _check(_is_int(self.block_size) and self.block_size >= 1 and self.block_size & (self.block_size - 1) == 0,
               f"--block-size must be a power of two, got {self.block_size!r}")
        _check(self.max_model_len is None or (_is_int(self.max_model_len) and self.max_model_len >= 16),
               f"--max-model-len must be an integer >= 16, got {self.max_model_len!r}")
        if self.capture_sizes is not None:
            sizes = tuple(self.capture_sizes)
            _check(all(_is_int(s) and s >= 1 for s in sizes) and list(sizes) == sorted(set(sizes)),
                   f"--capture-sizes must be increasing positive integers, got {render_capture_sizes(sizes)}")
            object.__setattr__(self, "capture_sizes", sizes)

    @property
    def requested_capture_sizes(self) -> tuple[int, ...]:
        return self.capture_sizes if self.capture_sizes is not None else DEFAULT_CAPTURE_SIZES

    @property
    def graph_capture_sizes(self) -> tuple[int, ...]:
        """The sizes graphs are captured at: none on the CPU, which has no graphs."""
        return () if self.arch == "cpu" else self.requested_capture_sizes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["capture_sizes"] = None if self.capture_sizes is None else list(self.capture_sizes)
        return d

    @classmethod
    def from_reader(cls, r: Reader) -> "BuildOptions":
        sizes = r.raw("capture_sizes", None)
        try:
            return cls(arch=r.str("arch"), dtype=r.str("dtype"), tensor_parallel_size=r.int("tensor_parallel_size"),
                       enable_expert_parallel=r.bool("enable_expert_parallel"),
                       data_parallel_size=r.int("data_parallel_size", 1), quant=r.str("quant"),
                       kv_cache_dtype=r.str("kv_cache_dtype"),
                       capture_sizes=None if sizes is None else r.ints("capture_sizes"),
                       max_model_len=r.int("max_model_len", optional=True), block_size=r.int("block_size"),
                       compile=r.str("compile"), load_format=r.str("load_format", "auto"))
        except ValueError as e:
            from atom_aot.errors import ArtifactError
            raise ArtifactError(f"{r.where}: {e}. The artifact is malformed: rebuild it with atom-build.") from None

    def rebuild_command(self, model_source: str | None, arch: str | None = None) -> str:
        """The atom-build command that makes an artifact like this one (for `arch`, default the same)."""
        parts = ["atom-build"] + (["--model", model_source] if model_source else [])
        parts += ["--arch", arch or self.arch] + to_argv(self, skip=("arch",))
        return " ".join(parts)


def random_weights(load_format: str) -> bool:
    """Whether the weights are random (drawn at build, or at load) rather than read from a checkpoint."""
    return load_format in ("dummy", DRAWN_AT_LOAD)


def drawn_at_load(load_format: str) -> bool:
    """Whether the runtime draws the weights at load (the artifact stores only what a draw cannot reproduce)."""
    return load_format == DRAWN_AT_LOAD


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
