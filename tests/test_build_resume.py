"""A build stopped part-way keeps its tuning and compiled packages, and the next run of the same build
resumes from them (atom_aot/build/resume.py) instead of tuning and compiling again."""
import json

import pytest

from atom_aot import LLMEngine, SamplingParams
from atom_aot.artifact.layout import package_member
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.reader import Artifact
from atom_aot.artifact.tuning import TUNING
from atom_aot.build import pipeline
from atom_aot.build.config import BuildConfig
from atom_aot.build.resume import StageCheckpoints, build_device_name

PROMPTS = [[5, 17, 99, 23], list(range(40, 90))]


def greedy(artifact) -> list:
    engine = LLMEngine(str(artifact))
    return [o["token_ids"] for o in engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12))]


def key_of(model_dir) -> str:
    return pipeline.plan(str(model_dir), BuildConfig(arch="cpu"))[2]


def fail(what: str):
    def raiser(*args, **kwargs):
        raise AssertionError(f"{what} ran in a resumed build")
    return raiser


def test_a_stopped_build_keeps_its_finished_stages(tiny_llama_dir, tmp_path, monkeypatch):
    def fake_compile(exported, out_path):       # a finished compile, without its minutes
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_bytes(b"compiled package")
        return out_path

    def stop(*args, **kwargs):
        raise RuntimeError("the machine went away")

    monkeypatch.setattr(pipeline, "compile_package", fake_compile)
    monkeypatch.setattr(pipeline, "probe_capture_sizes", stop)          # the stage after the compiles
    with pytest.raises(RuntimeError, match="went away"):
        pipeline.build(str(tiny_llama_dir), BuildConfig(arch="cpu"), cache_dir=tmp_path, show_progress=False)
    kept = StageCheckpoints.for_build(tmp_path, key_of(tiny_llama_dir), build_device_name("cpu"))
    assert kept.tuning() is not None and kept.tuning().arch == "cpu"
    assert kept.package(Phase.MIXED).read_bytes() == b"compiled package"
    assert kept.package(Phase.DECODE) is None
    assert not list(tmp_path.glob("*.atom"))


def test_the_next_run_resumes_and_serves_the_same(tiny_llama_dir, tiny_llama_artifact, tmp_path, monkeypatch):
    """Kept stages taken from a whole build of the same key: the resumed build tunes and compiles nothing,
    says so in its stage times, removes what it kept, and its artifact generates the same tokens."""
    whole = Artifact.open(tiny_llama_artifact)
    key = key_of(tiny_llama_dir)
    assert whole.manifest.build_key == key
    kept = StageCheckpoints.for_build(tmp_path, key, build_device_name("cpu"))
    kept.keep_tuning(whole.read_tuning())
    kept.keep_package(Phase.MIXED, whole.member_path(package_member(Phase.MIXED)))
    monkeypatch.setattr(pipeline, "tune_kernels", fail("tuning"))
    monkeypatch.setattr(pipeline, "compile_package", fail("a compile"))
    monkeypatch.setattr(pipeline, "export_model", fail("an export"))
    result = pipeline.build(str(tiny_llama_dir), BuildConfig(arch="cpu"), cache_dir=tmp_path, show_progress=False)
    resumed = Artifact.open(result.path)
    assert {"tune (resumed)", "compile (mixed, resumed)"} <= set(resumed.manifest.build_seconds)
    assert "tune" not in resumed.manifest.build_seconds
    assert resumed.member_bytes(package_member(Phase.MIXED)) == whole.member_bytes(package_member(Phase.MIXED))
    assert json.loads(resumed.member_bytes(TUNING)) == json.loads(whole.member_bytes(TUNING))
    assert not kept.root.exists()
    monkeypatch.undo()
    assert greedy(result.path) == greedy(tiny_llama_artifact)


def test_tuning_is_kept_per_device_and_read_back_whole(tmp_path, tiny_llama_artifact):
    tuning = Artifact.open(tiny_llama_artifact).read_tuning()
    here = StageCheckpoints.for_build(tmp_path, "k" * 64, "NVIDIA H100 80GB HBM3")
    here.keep_tuning(tuning)
    assert here.tuning() == tuning
    assert StageCheckpoints.for_build(tmp_path, "k" * 64, "NVIDIA H200").tuning() is None
    (here.root / "tuning.json").write_text('{"arch": "sm90", "phases"')          # cut short
    assert here.tuning() is None
    here.discard()
    assert not here.root.exists() and here.tuning() is None and here.package(Phase.MIXED) is None


def test_force_discards_what_an_earlier_run_kept(tiny_llama_dir, tmp_path, monkeypatch):
    kept = StageCheckpoints.for_build(tmp_path, key_of(tiny_llama_dir), build_device_name("cpu"))
    (kept.root).mkdir(parents=True)
    (kept.root / "mixed.pt2").write_bytes(b"not a package")

    def stop(*args, **kwargs):
        raise RuntimeError("stopped before tuning")

    monkeypatch.setattr(pipeline, "tune_kernels", stop)
    with pytest.raises(RuntimeError, match="before tuning"):
        pipeline.build(str(tiny_llama_dir), BuildConfig(arch="cpu"), cache_dir=tmp_path, force=True,
                       show_progress=False)
    assert kept.package(Phase.MIXED) is None
