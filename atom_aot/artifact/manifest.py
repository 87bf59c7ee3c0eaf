"""manifest.json: what an artifact is, what it was built from and for, and every member's hashes.

`Manifest.from_json` validates every field (an ArtifactError names the one that is wrong) and the
fixed member layout before anything else reads the artifact; `to_json` is what the writer stores.
A manifest of another format version passes through `migrate` first.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Callable

from atom_aot.artifact.build_options import ARCHES, BuildOptions
from atom_aot.artifact.fields import Reader
from atom_aot.artifact.kv_cache import KVCacheSpec
from atom_aot.artifact.layout import MANIFEST, REBUILD, check_members, package_member, weights_member
from atom_aot.artifact.phase import Phase
from atom_aot.errors import ArtifactError
from atom_aot.version import ARTIFACT_FORMAT_VERSION

SHA256_HEX, XXH3_HEX = 64, 32
DTYPE_NAMES = ("float32", "bfloat16", "float16")              # torch dtype names
COMPILED_KINDS = ("aotinductor", "none")
STORED_FORMS = ("raw", "zstd")


@dataclass(frozen=True)
class ModelIdentity:
    name: str                 # short name (served model name, artifact file name)
    source: str               # the --model path it was built from
    architecture: str         # HF architecture, e.g. LlamaForCausalLM
    config_hash: str          # sha256 of config.json's canonical JSON
    weights_hash: str         # xxh3-128 of the weight files' bytes
    tokenizer_hash: str       # xxh3-128 of the tokenizer files
    # the multi-token-prediction layers the artifact holds: all that config.json declares, or 0 when the
    # checkpoint had none of their tensors (build/mtp_layers.py); None: a manifest from before this field,
    # whose artifact holds all (such a checkpoint was refused then)
    mtp_layers: int | None = None

    @classmethod
    def from_reader(cls, r: Reader) -> "ModelIdentity":
        return cls(_nonempty(r, "name"), r.str("source"), _nonempty(r, "architecture"),
                   r.hex("config_hash", SHA256_HEX), r.hex("weights_hash", XXH3_HEX),
                   r.hex("tokenizer_hash", XXH3_HEX), r.int("mtp_layers", None, optional=True, minimum=0))


@dataclass(frozen=True)
class Target:
    """The machine compiled code is tied to: every field must match where it loads."""
    arch: str
    torch: str
    triton: str | None
    cuda: str | None
    hip: str | None
    cpu_isa: str

    @classmethod
    def from_reader(cls, r: Reader) -> "Target":
        return cls(r.str("arch", choices=ARCHES), r.str("torch"), r.str("triton", optional=True),
                   r.str("cuda", optional=True), r.str("hip", optional=True), r.str("cpu_isa"))

    def mismatch(self, here: "Target") -> tuple[str, str | None, str | None] | None:
        """(field, built for, found here) of the first field that differs, or None."""
        for f in fields(self):
            if getattr(self, f.name) != getattr(here, f.name):
                return f.name, getattr(self, f.name), getattr(here, f.name)
        return None


@dataclass(frozen=True)
class Numerics:
    dtype: str                # activations and unquantized weights, a torch dtype name
    max_model_len: int        # resolved (the model's max_position_embeddings unless set)
    block_size: int           # tokens per KV-cache block

    @classmethod
    def from_reader(cls, r: Reader) -> "Numerics":
        return cls(r.str("dtype", choices=DTYPE_NAMES), r.int("max_model_len", minimum=16), r.int("block_size", minimum=1))


@dataclass(frozen=True)
class Layout:
    """How the model is split over ranks; one weight file per rank of the world."""
    tensor_parallel_size: int
    expert_parallel_size: int     # 1, or the world size when experts are split over every rank
    data_parallel_size: int       # attention data parallelism

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size

    def weights_member(self, rank: int) -> str:
        if not 0 <= rank < self.world_size:
            raise ArtifactError(f"rank {rank} is outside this artifact's world of {self.world_size} ranks")
        return weights_member(rank)

    def weight_members(self) -> list[str]:
        return [weights_member(r) for r in range(self.world_size)]

    @classmethod
    def from_reader(cls, r: Reader) -> "Layout":
        layout = cls(r.int("tensor_parallel_size", minimum=1), r.int("expert_parallel_size", minimum=1),
                     r.int("data_parallel_size", minimum=1))
        if layout.expert_parallel_size not in (1, layout.world_size):
            raise r.error("expert_parallel_size", f"must be 1 or the world size {layout.world_size}")
        if layout.data_parallel_size > 1 and (layout.tensor_parallel_size != 1 or layout.expert_parallel_size == 1):
            raise r.error("data_parallel_size", "data-parallel attention needs tensor_parallel_size 1 and the experts "
                                                "spread over the world (expert_parallel_size = world size)")
        return layout

    @property
    def attention_data_parallel(self) -> bool:
        """Every rank an engine core of its own sequences (`atom-build -dp N --ep`), meeting the others in
        the expert layers; else rank 0 leads the other tensor-parallel ranks."""
        return self.data_parallel_size > 1


# models/quant_layers.py describes each layout
LINEAR_SCHEMES = ("none", "fp8", "fp8-static", "fp8-block", "fp8-ub", "int8", "int8-static", "int4-w4a16",
                  "int4-w4a16-channel")
# schemes of the experts alone: the decoder linears stay in the model dtype (an mxfp4 checkpoint: GPT-OSS)
EXPERT_ONLY_SCHEMES = ("mxfp4",)
WEIGHT_SCHEMES = LINEAR_SCHEMES + EXPERT_ONLY_SCHEMES
WEIGHT_ORIGINS = ("none", "build", "checkpoint")           # who quantized: nobody, atom-build --quant, the checkpoint
DECODER_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# weights scheme -> how a MoE model of that scheme stores its experts (ops/expert_formats.py; others: model-dtype)
EXPERT_FORMATS = {"fp8": "fp8-row", "fp8-ub": "fp8-row", "fp8-block": "fp8-block", "mxfp4": "mxfp4"}
EXPERT_FORMAT_TEXT = {"model-dtype": "in the model dtype",
                      "fp8-row": "e4m3, one scale per row, weight-only (bf16 activations)",
                      "fp8-block": "e4m3, one scale per 128x128 block, weight-only (bf16 activations)",
                      "mxfp4": "mxfp4: e2m1 values two a byte, one e8m0 scale per 32 along K, weight-only "
                               "(bf16 activations)"}


def linear_scheme(weights: str) -> str:
    """The decoder linears' scheme (LINEAR_SCHEMES) of a weights scheme (WEIGHT_SCHEMES)."""
    return "none" if weights in EXPERT_ONLY_SCHEMES else weights


def expert_format_name(weights: str) -> str:
    """How a MoE model of weights scheme `weights` stores its experts (a key of EXPERT_FORMAT_TEXT)."""
    return EXPERT_FORMATS.get(weights, "model-dtype")


@dataclass(frozen=True)
class Quantization:
    """Which weights are stored quantized, in which scheme (the KV cache's are its spec's: KVCacheSpec)."""
    weights: str                       # WEIGHT_SCHEMES: every decoder linear's scheme, or the experts' alone
    weights_origin: str = "none"       # WEIGHT_ORIGINS
    checkpoint_format: str = ""        # the pre-quantized checkpoint's format as detected ("" if none)
    ignored: tuple[str, ...] = ()      # the checkpoint's ignore list (modules it left unquantized)

    @property
    def groups(self) -> dict[str, str]:
        """Layer group -> its scheme: the decoder linears share one; lm_head and embeddings are never quantized."""
        linears = linear_scheme(self.weights)
        return {**{group: linears for group in DECODER_LINEARS}, "lm_head": "none", "embed_tokens": "none"}

    @property
    def experts(self) -> str:
        """How a MoE model's experts are stored under this scheme."""
        return EXPERT_FORMAT_TEXT[expert_format_name(self.weights)]

    def to_dict(self) -> dict:
        return {**asdict(self), "ignored": list(self.ignored), "groups": self.groups}

    @classmethod
    def from_reader(cls, r: Reader) -> "Quantization":
        weights = r.str("weights", choices=WEIGHT_SCHEMES)
        q = cls(weights, r.str("weights_origin", "none" if weights == "none" else "build", choices=WEIGHT_ORIGINS),
                r.str("checkpoint_format", ""), tuple(r.typed("ignored", list, [])))
        if (q.weights == "none") != (q.weights_origin == "none"):
            raise r.error("weights_origin", f"{q.weights_origin!r} disagrees with weights {q.weights!r}")
        return q


@dataclass(frozen=True)
class CompiledPackages:
    kind: str                                                   # "aotinductor" | "none" (eager)
    packages: dict[Phase, str] = field(default_factory=dict)    # phase -> member, compiled/<phase>.pt2

    @classmethod
    def from_reader(cls, r: Reader) -> "CompiledPackages":
        kind = r.str("kind", choices=COMPILED_KINDS)
        names = r.str_map("packages", {})
        packages = {}
        for phase_name, member in names.items():
            if phase_name not in {p.value for p in Phase}:
                raise r.error("packages", f"has an unknown phase {phase_name!r:.40}")
            phase = Phase(phase_name)
            if member != package_member(phase):
                raise r.error(f"packages.{phase_name}", f"must be {package_member(phase)!r}, got {member!r:.80}")
            packages[phase] = member
        if kind == "none" and packages:
            raise r.error("packages", "must be empty when kind is 'none'")
        if kind == "aotinductor" and Phase.MIXED not in packages:
            raise r.error("packages", "must have the mixed phase when kind is 'aotinductor'")
        return cls(kind, packages)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "packages": {p.value: m for p, m in self.packages.items()}}


@dataclass(frozen=True)
class Member:
    size: int                 # bytes of the member itself
    sha256: str               # checked by `atom-run ART verify`
    xxh3: str                 # xxh3-128, checked at every load
    stored: str               # "raw" | "zstd" (archive only)
    stored_size: int          # bytes in the archive

    @classmethod
    def from_reader(cls, r: Reader, _name: str = "") -> "Member":
        member = cls(r.int("size", minimum=0), r.hex("sha256", SHA256_HEX), r.hex("xxh3", XXH3_HEX),
                     r.str("stored", choices=STORED_FORMS), r.int("stored_size", minimum=0))
        if member.stored == "raw" and member.stored_size != member.size:
            raise r.error("stored_size", f"must equal size ({member.size}) for a raw member")
        return member


@dataclass(frozen=True)
class Manifest:
    format_version: int
    build_key: str                        # sha256 of every build input; the file name ends with its first 12
    engine_version: str                   # the atom-aot that built it
    model: ModelIdentity
    target: Target
    build_compiler: str | None            # C++ compiler of the AOTInductor wrapper (None: nothing compiled)
    options: BuildOptions                 # the build options as given (rebuild_command reproduces them)
    numerics: Numerics
    kv_cache: KVCacheSpec
    layout: Layout
    quantization: Quantization
    compiled: CompiledPackages
    signature_version: int                # artifact/signature.py SIGNATURE_VERSION the packages were exported with
    members: dict[str, Member]
    built_at: str
    build_host: str
    build_seconds: dict[str, float]

    def rebuild_command(self, arch: str | None = None) -> str:
        return self.options.rebuild_command(self.model.source, arch)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("model", "target", "numerics", "layout"):
            d[name] = asdict(d[name])
        d["quantization"] = self.quantization.to_dict()
        d["kv_cache"] = self.kv_cache.to_dict()
        d["options"] = self.options.to_dict()
        d["compiled"] = self.compiled.to_dict()
        d["members"] = {name: asdict(m) for name, m in self.members.items()}
        return d

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str = MANIFEST) -> "Manifest":
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ArtifactError(f"{where} is not valid JSON ({e}). {REBUILD}") from None
        r = Reader(migrate(data, where), where)
        manifest = cls(
            format_version=r.int("format_version"), build_key=r.hex("build_key", SHA256_HEX),
            engine_version=_nonempty(r, "engine_version"), model=ModelIdentity.from_reader(r.obj("model")),
            target=Target.from_reader(r.obj("target")), build_compiler=r.str("build_compiler", optional=True),
            options=BuildOptions.from_reader(r.obj("options")), numerics=Numerics.from_reader(r.obj("numerics")),
            kv_cache=KVCacheSpec.from_reader(r.obj("kv_cache")),
            layout=Layout.from_reader(r.obj("layout")), quantization=Quantization.from_reader(r.obj("quantization")),
            compiled=CompiledPackages.from_reader(r.obj("compiled")), signature_version=r.int("signature_version"),
            members=r.mapping("members", Member.from_reader), built_at=r.str("built_at"),
            build_host=r.str("build_host"), build_seconds=r.float_map("build_seconds"))
        _check_consistent(manifest, r)
        check_members(manifest.members, manifest.layout.weight_members(), manifest.compiled.packages.values(),
                      f"{where}.members")
        return manifest


def _check_consistent(m: Manifest, r: Reader) -> None:
    """Fields that say the same thing twice must agree (a forged or hand-edited manifest)."""
    pairs = [("options.arch", m.options.arch, m.target.arch),
             ("options.block_size", m.options.block_size, m.numerics.block_size),
             ("options.tensor_parallel_size", m.options.tensor_parallel_size, m.layout.tensor_parallel_size),
             ("options.data_parallel_size", m.options.data_parallel_size, m.layout.data_parallel_size),
             ("options.quant", m.options.quant != "none", m.quantization.weights_origin == "build"),
             ("kv_cache.dtype", m.kv_cache.quantized, m.options.kv_cache_dtype == "fp8"),
             ("options.compile", m.options.compile == "aoti", m.compiled.kind == "aotinductor")]
    if m.quantization.weights_origin == "build":    # --quant fp8 | int8 builds the scheme of its name
        pairs.append(("quantization.weights", m.quantization.weights, m.options.quant))
    if m.options.max_model_len is not None:
        pairs.append(("options.max_model_len", m.options.max_model_len, m.numerics.max_model_len))
    for name, value, expected in pairs:
        if value != expected:
            raise r.error(name, f"disagrees with the rest of the manifest ({value!r:.40} vs {expected!r:.40})")


def _nonempty(r: Reader, key: str) -> str:
    value = r.str(key)
    if not value:
        raise r.error(key, "must not be empty")
    return value


# Format migrations: version v -> a function turning a v manifest into a v + 1 one. A version with
# no path to ARTIFACT_FORMAT_VERSION is refused with the command that rebuilds it. Version 1
# (untyped `build` section, no layout, numerics or signature version) has none: it is rebuilt.


def _kv_cache_section(data: dict) -> dict:
    """Format 2 -> 3: the KV cache's dtype (numerics.kv_cache_dtype), its fp8 marker (quantization.kv_cache) and
    its scales (quantization.kv_scales) become one `kv_cache` section; the layout, which format 2 does not record,
    is the model's, derived at load."""
    numerics, quantization = dict(data.get("numerics") or {}), dict(data.get("quantization") or {})
    kv_cache = {"dtype": numerics.pop("kv_cache_dtype", None), "layout": None,
                "scales": quantization.pop("kv_scales", "none")}
    quantization.pop("kv_cache", None)
    return {**data, "format_version": 3, "numerics": numerics, "quantization": quantization, "kv_cache": kv_cache}


MIGRATIONS: dict[int, Callable[[dict], dict]] = {2: _kv_cache_section}


def migrate(data: object, where: str = MANIFEST) -> dict:
    """`data` brought to ARTIFACT_FORMAT_VERSION, or an ArtifactError saying how to rebuild it."""
    version = Reader(data, where).int("format_version")
    while version != ARTIFACT_FORMAT_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise ArtifactError(
                f"{where} is artifact format {version}, but this atom-aot reads format {ARTIFACT_FORMAT_VERSION}"
                f"{' (it is from a newer atom-aot)' if version > ARTIFACT_FORMAT_VERSION else ''}. Nothing was "
                f"loaded. Rebuild it with this atom-aot: {_rebuild_hint(data)}")
        data = step(data)
        version = Reader(data, where).int("format_version")
    return data


def _rebuild_hint(data: dict) -> str:
    """The atom-build command for an artifact of another format, from the fields every format had."""
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    source = model.get("source") if isinstance(model.get("source"), str) else None
    options = data.get("options", data.get("build"))
    known = ("arch", "tensor_parallel_size", "quant", "max_model_len", "block_size", "compile")
    try:
        built = BuildOptions(**{k: v for k, v in options.items() if k in known})
    except (AttributeError, TypeError, ValueError):
        return "atom-build" + (f" --model {source}" if source else "") + " (with the options it was built with)"
    return built.rebuild_command(source)
