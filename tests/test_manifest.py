"""The typed manifest and graph plan: round trips, and every bad field refused by name."""
import copy
import json

import pytest

from atom_aot.artifact import manifest as manifest_module
from atom_aot.artifact.build_options import BuildOptions
from atom_aot.artifact.graph_plan import GraphPlan
from atom_aot.artifact.kv_cache import KVCacheLayout, KVCacheSpec
from atom_aot.artifact.layout import check_name
from atom_aot.artifact.manifest import (CompiledPackages, Layout, Manifest, Member, ModelIdentity, Numerics,
                                        Quantization, Target, migrate)
from atom_aot.artifact.phase import Phase
from atom_aot.errors import ArtifactError
from atom_aot.version import ARTIFACT_FORMAT_VERSION

HEX64, HEX32 = "ab" * 32, "cd" * 16


def member(size=10) -> Member:
    return Member(size=size, sha256=HEX64, xxh3=HEX32, stored="raw", stored_size=size)


def make_manifest(compiled: bool = True) -> Manifest:
    names = ["weights/rank0.safetensors", "tokenizer/tokenizer.json", "config/config.json",
             "config/generation_config.json", "tuning.json", "graphs.json"]
    names += ["compiled/mixed.pt2"] if compiled else []
    return Manifest(
        format_version=ARTIFACT_FORMAT_VERSION, build_key=HEX64, engine_version="0.1.0",
        model=ModelIdentity("tiny", "/models/tiny", "LlamaForCausalLM", HEX64, HEX32, HEX32),
        target=Target("cpu", "2.13.0+cpu", None, None, None, "AVX2"), build_compiler="g++ 12",
        options=BuildOptions(arch="cpu", compile="aoti" if compiled else "none"),
        numerics=Numerics("float32", 512, 16), kv_cache=KVCacheSpec("float32", KVCacheLayout(2, 2, 2, 8)),
        layout=Layout(1, 1, 1), quantization=Quantization("none"),
        compiled=CompiledPackages("aotinductor", {Phase.MIXED: "compiled/mixed.pt2"}) if compiled
        else CompiledPackages("none"),
        signature_version=1, members={n: member() for n in names}, built_at="2026-01-01T00:00:00Z",
        build_host="host", build_seconds={"weights": 1.5})


def reparse(edit) -> Manifest:
    data = make_manifest().to_dict()
    edit(data)
    return Manifest.from_json(json.dumps(data).encode())


def set_path(data: dict, dotted: list, value):
    for key in dotted[:-1]:
        data = data[key]
    if value is DELETE:
        del data[dotted[-1]]
    else:
        data[dotted[-1]] = value


DELETE = object()


class TestRoundTrip:
    @pytest.mark.parametrize("compiled", [True, False])
    def test_manifest_survives_json(self, compiled):
        m = make_manifest(compiled)
        assert Manifest.from_json(m.to_json()) == m

    def test_graph_plan_survives_json(self):
        plan = GraphPlan((1, 2, 4), 12345, "measured")
        assert GraphPlan.from_json(plan.to_json()) == plan
        assert GraphPlan.from_json(plan.to_json(indent=None)) == plan

    def test_layout_names_a_weight_file_per_rank(self):
        assert Layout(2, 2, 1).weight_members() == ["weights/rank0.safetensors", "weights/rank1.safetensors"]
        assert Layout(2, 1, 1).weights_member(1) == "weights/rank1.safetensors"
        with pytest.raises(ArtifactError, match="outside"):
            Layout(1, 1, 1).weights_member(1)

    def test_the_mtp_layers_built_survive_and_an_older_manifest_has_none_recorded(self):
        """0: built without the MTP layers its config declares (build/mtp_layers.py); absent (a manifest from before
        the field): None, all of them."""
        data = make_manifest().to_dict()
        data["model"]["mtp_layers"] = 0
        assert Manifest.from_json(json.dumps(data).encode()).model.mtp_layers == 0
        del data["model"]["mtp_layers"]
        assert Manifest.from_json(json.dumps(data).encode()).model.mtp_layers is None

    def test_rebuild_command_reproduces_the_options(self):
        assert make_manifest().rebuild_command("sm90") == "atom-build --model /models/tiny --arch sm90"
        assert make_manifest(compiled=False).rebuild_command() == \
            "atom-build --model /models/tiny --arch cpu --compile none"


MEMBER = ["members", "tuning.json"]


class TestFieldValidation:
    @pytest.mark.parametrize("path,value,named", [
        (["build_key"], "abc", "build_key must be 64 lowercase hex"),
        (["build_key"], "AB" * 32, "build_key must be 64 lowercase hex"),
        (["model", "config_hash"], "xyz", "model.config_hash"),
        (["model", "weights_hash"], HEX64, "model.weights_hash must be 32"),
        (["model", "name"], "", "model.name must not be empty"),
        (["model", "mtp_layers"], -1, "model.mtp_layers must be >= 0"),
        (["model", "mtp_layers"], "1", "model.mtp_layers must be int"),
        (["target", "arch"], "sm1", "target.arch must be one of"),
        (["target", "torch"], 2, "target.torch must be str"),
        (["numerics", "dtype"], "int8", "numerics.dtype must be one of"),
        (["kv_cache", "dtype"], "float8", "kv_cache.dtype must be one of"),
        (["kv_cache", "dtype"], "float8_e4m3fn", "kv_cache.scales a float8_e4m3fn KV cache needs k/v scales"),
        (["kv_cache", "scales"], "calibrated", "kv_cache.scales a float32 KV cache has no k/v scales"),
        (["kv_cache", "layout", "parts"], 0, "kv_cache.layout.parts must be >= 1"),
        (["numerics", "max_model_len"], 3, "numerics.max_model_len must be >= 16"),
        (["numerics", "block_size"], True, "numerics.block_size must be int, got a boolean"),
        (["layout", "tensor_parallel_size"], 0, "layout.tensor_parallel_size must be >= 1"),
        (["layout", "expert_parallel_size"], 3, "layout.expert_parallel_size must be 1 or the world size"),
        (["quantization", "weights"], "int4", "quantization.weights must be one of"),
        (["compiled", "kind"], "tensorrt", "compiled.kind must be one of"),
        (["compiled", "packages"], {"prefill": "compiled/prefill.pt2"}, "compiled.packages has an unknown phase"),
        (["compiled", "packages", "mixed"], "../../escape/mixed.pt2", "compiled.packages.mixed must be"),
        (["compiled", "packages", "mixed"], "/tmp/mixed.pt2", "compiled.packages.mixed must be"),
        (MEMBER + ["sha256"], "../../x", "tuning.json.sha256 must be 64 lowercase hex"),
        (MEMBER + ["xxh3"], "CD" * 16, "tuning.json.xxh3 must be 32 lowercase hex"),
        (MEMBER + ["stored"], "gzip", "tuning.json.stored must be one of"),
        (MEMBER + ["stored_size"], 3, "tuning.json.stored_size must equal size"),
        (MEMBER + ["size"], -1, "tuning.json.size must be >= 0"),
        (["signature_version"], "1", "signature_version must be int"),
        (["build_seconds"], {"weights": "fast"}, "build_seconds.weights must be float"),
        (["options", "block_size"], 3, "block-size must be a power of two"),
        (["options", "block_size"], 32, "options.block_size disagrees"),
        (["options", "arch"], "sm90", "options.arch disagrees"),
        (["options", "compile"], "none", "options.compile disagrees"),
        (["kv_cache"], {"dtype": "float8_e4m3fn", "layout": None, "scales": "calibrated"}, "kv_cache.dtype disagrees"),
        (["quantization", "weights_origin"], "checkpoint", "quantization.weights_origin 'checkpoint' disagrees"),
        (["quantization", "weights"], "fp8-block", "quantization.weights_origin 'none' disagrees"),
        (["target"], DELETE, "target is missing"),
        (["members"], [], "members must be dict"),
    ])
    def test_bad_field_is_named(self, path, value, named):
        with pytest.raises(ArtifactError, match=named.replace(".", r"\.")) as info:
            reparse(lambda d: set_path(d, path, value))
        assert "rebuild" in str(info.value).lower()

    def test_not_json_is_refused(self):
        with pytest.raises(ArtifactError, match="not valid JSON"):
            Manifest.from_json(b"{not json")
        with pytest.raises(ArtifactError, match="must be a JSON object"):
            Manifest.from_json(b"[1, 2]")


class TestMemberLayout:
    @pytest.mark.parametrize("name,why", [
        ("../../escape/x.json", "'..' segment"), ("/etc/passwd", "absolute path"),
        ("tokenizer\\x.json", "backslash"), ("tokenizer//x.json", "empty segment"),
        ("./tuning.json", "'.' segment"), ("tokenizer/../tuning.json", "'..' segment"),
        ("tokenizer/x\x00.json", "characters outside"), ("", "not a non-empty string"), (3, "not a non-empty")])
    def test_bad_names_are_refused(self, name, why):
        with pytest.raises(ArtifactError, match=why):
            check_name(name, "manifest.json.members")

    @pytest.mark.parametrize("name", ["../../escape/x.json", "/etc/passwd", "tokenizer/sub/x.json",
                                      "compiled/decode.pt2", "weights/rank1.safetensors", "notes.txt"])
    def test_member_outside_the_layout_is_refused(self, name):
        with pytest.raises(ArtifactError, match="member|no place"):
            reparse(lambda d: d["members"].__setitem__(name, member().__dict__))

    @pytest.mark.parametrize("name", ["tuning.json", "compiled/mixed.pt2", "weights/rank0.safetensors",
                                      "tokenizer/tokenizer.json"])
    def test_required_member_missing_from_the_list_is_refused(self, name):
        with pytest.raises(ArtifactError, match="does not list the member"):
            reparse(lambda d: d["members"].pop(name))


class TestFormatVersions:
    def test_version_1_is_refused_with_the_rebuild_command(self):
        v1 = {"format_version": 1, "model": {"source": "/models/tiny"},
              "build": {"arch": "cpu", "dtype": "float32", "block_size": 32, "compile": "none"}}
        with pytest.raises(ArtifactError, match=f"format 1, but this atom-aot reads format {ARTIFACT_FORMAT_VERSION}") as info:
            Manifest.from_json(json.dumps(v1).encode())
        assert "atom-build --model /models/tiny --arch cpu --block-size 32 --compile none" in str(info.value)

    def test_newer_version_is_refused(self):
        with pytest.raises(ArtifactError, match="from a newer atom-aot"):
            reparse(lambda d: d.__setitem__("format_version", ARTIFACT_FORMAT_VERSION + 1))

    def test_a_registered_migration_is_applied(self, monkeypatch):
        current = make_manifest().to_dict()
        old = copy.deepcopy(current)
        old["format_version"] = ARTIFACT_FORMAT_VERSION - 1
        old["model"]["label"] = old["model"].pop("name")

        def rename(data):
            data = copy.deepcopy(data)
            data["model"]["name"] = data["model"].pop("label")
            return {**data, "format_version": ARTIFACT_FORMAT_VERSION}
        monkeypatch.setitem(manifest_module.MIGRATIONS, ARTIFACT_FORMAT_VERSION - 1, rename)
        assert migrate(old) == json.loads(json.dumps(current))
        assert Manifest.from_json(json.dumps(old).encode()) == make_manifest()

    def test_a_format_2_manifest_gets_its_kv_cache_spec_from_its_numerics_and_quantization(self):
        """Format 2 named the KV cache three times (numerics.kv_cache_dtype, quantization.kv_cache and kv_scales)
        and recorded no layout: it reads as one spec whose layout the loader derives from the model."""
        data = make_manifest().to_dict()
        del data["kv_cache"]
        data["format_version"] = 2
        data["options"]["kv_cache_dtype"] = "fp8"
        data["numerics"]["kv_cache_dtype"] = "float8_e4m3fn"
        data["quantization"].update(kv_cache="fp8", kv_scales="checkpoint")
        read = Manifest.from_json(json.dumps(data).encode())
        assert read.kv_cache == KVCacheSpec("float8_e4m3fn", None, "checkpoint") and read.kv_cache.quantized
        assert read.kv_cache.with_layout(KVCacheLayout(2, 2, 2, 8)).bytes_per_block(16) == 2 * 2 * 2 * 8 * 16
        with pytest.raises(ValueError, match="records a KV cache of"):
            make_manifest().kv_cache.with_layout(KVCacheLayout(3, 2, 2, 8))
