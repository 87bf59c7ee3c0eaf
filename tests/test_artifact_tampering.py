"""Hostile or damaged artifacts, in both forms: each is refused with one ArtifactError (the CLI
prints one paragraph and exits 2), before any compiled code is loaded, and nothing is written
outside the unpack cache. What a folder holds beyond its manifest's list is never used."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from artifact_tools import entry_offsets, files_under, flip_byte, folder_from_archive, forge_archive, forge_folder

from atom_aot.artifact.layout import MANIFEST, MANIFEST_CHECKSUM
from atom_aot.artifact.reader import Artifact
from atom_aot.artifact.unpack import unpack_file, unpack_root
from atom_aot.build.config import BuildConfig
from atom_aot.build.pipeline import build
from atom_aot.errors import ArtifactError
from atom_aot.runtime.cli import main as atom_run
from atom_aot.runtime.loading.loader import load_artifact
from atom_aot.runtime.text.tokenizer import load_tokenizer
from atom_aot.version import ARTIFACT_FORMAT_VERSION

TEMPLATE = "tokenizer/chat_template.jinja"


@pytest.fixture(scope="module")
def eager_folder(tiny_llama_dir, tmp_path_factory) -> Path:
    return build(str(tiny_llama_dir), BuildConfig(arch="cpu", compile="none"),
                 out=tmp_path_factory.mktemp("eager") / "art", show_progress=False).path


@pytest.fixture(scope="module")
def compiled_folder(tiny_llama_artifact, tmp_path_factory) -> Path:
    return folder_from_archive(tiny_llama_artifact, tmp_path_factory.mktemp("compiled") / "art")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """This test's own unpack cache, inside tmp_path: everything else in tmp_path must stay as it was."""
    root = tmp_path / "cache"
    monkeypatch.setenv("ATOM_AOT_CACHE", str(root))
    return root


@pytest.fixture
def compiled_loads(monkeypatch) -> list[Path]:
    """The package paths compiled code is loaded from (none may be loaded from a refused artifact)."""
    from atom_aot.runtime.loading import compiled
    loaded, original = [], compiled.CompiledModel.__init__

    def record(self, package, device):
        loaded.append(Path(package))
        original(self, package, device)
    monkeypatch.setattr(compiled.CompiledModel, "__init__", record)
    return loaded


def assert_refused(path: Path, tmp_path: Path, cache: Path, match: str, capsys) -> None:
    """Refused by the loader and by `atom-run ART generate` (one paragraph, exit 2), writing nothing outside the cache."""
    before = files_under(tmp_path, cache)
    with pytest.raises(ArtifactError, match=match):
        load_artifact(path)
    capsys.readouterr()
    assert atom_run([str(path), "generate", "hi", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and re.search(match, err.replace("\n  ", " "))
    assert files_under(tmp_path, cache) == before


def copy_of(src: Path, tmp_path: Path) -> Path:
    dest = tmp_path / ("copy" + src.suffix)
    return Path(shutil.copytree(src, dest) if src.is_dir() else shutil.copy(src, dest))


DAMAGE = "corrupt|checksum|not a readable|missing|cut short|not valid JSON"


class TestDamagedBytes:
    def test_every_archive_entry_with_a_flipped_byte_is_refused(self, tiny_llama_eager_artifact, tmp_path, cache,
                                                                capsys):
        entries = entry_offsets(tiny_llama_eager_artifact)
        assert {MANIFEST, MANIFEST_CHECKSUM, "weights/rank0.safetensors", "tokenizer/tokenizer.json.zst"} <= set(entries)
        for name, (offset, size) in entries.items():
            bad = copy_of(tiny_llama_eager_artifact, tmp_path)
            flip_byte(bad, offset + size // 2)
            assert_refused(bad, tmp_path, cache, DAMAGE, capsys)
            bad.unlink()

    def test_every_folder_file_with_a_flipped_byte_is_refused(self, eager_folder, tmp_path, cache, capsys):
        names = [p.relative_to(eager_folder) for p in eager_folder.rglob("*") if p.is_file()]
        assert len(names) == 10
        for name in names:
            bad = copy_of(eager_folder, tmp_path)
            flip_byte(bad / name, (bad / name).stat().st_size // 2)
            assert_refused(bad, tmp_path, cache, DAMAGE, capsys)
            shutil.rmtree(bad)

    @pytest.mark.parametrize("keep", [0.5, 0.05, "all but the last data byte"])
    def test_truncated_archive_is_refused(self, tiny_llama_eager_artifact, tmp_path, cache, capsys, keep):
        bad = copy_of(tiny_llama_eager_artifact, tmp_path)
        data_end = max(offset + size for offset, size in entry_offsets(bad).values())
        with open(bad, "r+b") as f:
            f.truncate(int(bad.stat().st_size * keep) if isinstance(keep, float) else data_end - 1)
        assert_refused(bad, tmp_path, cache, "truncated|cut short|not a readable|no manifest|corrupt", capsys)

    def test_truncated_folder_member_is_refused(self, eager_folder, tmp_path, cache, capsys):
        bad = copy_of(eager_folder, tmp_path)
        weights = bad / "weights" / "rank0.safetensors"
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size - 100)
        assert_refused(bad, tmp_path, cache, "weights/rank0.safetensors is corrupt", capsys)


class TestMissingMembers:
    def test_missing_member_file_in_a_folder(self, eager_folder, tmp_path, cache, capsys):
        bad = copy_of(eager_folder, tmp_path)
        (bad / "tuning.json").unlink()
        assert_refused(bad, tmp_path, cache, "member tuning.json is missing", capsys)

    def test_missing_entry_in_an_archive(self, tiny_llama_eager_artifact, tmp_path, cache, capsys):
        bad = forge_archive(tiny_llama_eager_artifact, tmp_path / "bad.atom", change=lambda e: e.pop("graphs.json"))
        assert_refused(bad, tmp_path, cache, "member graphs.json is missing", capsys)

    @pytest.mark.parametrize("form", ["archive", "folder"])
    def test_member_missing_from_the_hash_list(self, tiny_llama_eager_artifact, eager_folder, tmp_path, cache,
                                               capsys, form):
        drop = lambda m: m["members"].pop("tuning.json")  # noqa: E731
        bad = (forge_archive(tiny_llama_eager_artifact, tmp_path / "bad.atom", drop) if form == "archive"
               else forge_folder(eager_folder, tmp_path / "bad", drop))
        assert_refused(bad, tmp_path, cache, "does not list the member.s. tuning.json", capsys)


TRAVERSAL = ["../../../../escape/pwned.json", "/tmp/pwned.json", "tokenizer/../../../escape/pwned.json",
             "tokenizer\\..\\..\\pwned.json"]


class TestForgedNames:
    @pytest.mark.parametrize("name", TRAVERSAL)
    @pytest.mark.parametrize("form", ["archive", "folder"])
    def test_member_names_outside_the_tree(self, tiny_llama_eager_artifact, eager_folder, tmp_path, cache, capsys,
                                           form, name):
        def add(m):
            m["members"][name] = dict(m["members"]["tokenizer/tokenizer_config.json"])
        bad = (forge_archive(tiny_llama_eager_artifact, tmp_path / "bad.atom", add,
                             change=lambda e: e.__setitem__(name, e["tokenizer/tokenizer_config.json"]))
               if form == "archive" else forge_folder(eager_folder, tmp_path / "bad", add))
        assert_refused(bad, tmp_path, cache, "names member|no place", capsys)
        assert not (tmp_path / "escape").exists()

    @pytest.mark.parametrize("path", ["../../../escape/mixed.pt2", "/tmp/mixed.pt2", "compiled/../tuning.json"])
    def test_compiled_package_paths(self, compiled_folder, tmp_path, cache, capsys, compiled_loads, path):
        bad = forge_folder(compiled_folder, tmp_path / "bad", lambda m: m["compiled"]["packages"].__setitem__("mixed", path))
        assert_refused(bad, tmp_path, cache, re.escape("compiled.packages.mixed must be 'compiled/mixed.pt2'"), capsys)
        assert compiled_loads == []

    def test_hash_field_that_is_a_path(self, eager_folder, tmp_path, cache, capsys):
        bad = forge_folder(eager_folder, tmp_path / "bad",
                           lambda m: m["members"]["tokenizer/tokenizer.json"].__setitem__("sha256", "../../x"))
        assert_refused(bad, tmp_path, cache, "tokenizer.json.sha256 must be 64 lowercase hex digits", capsys)

    def test_member_symlinked_out_of_the_folder(self, eager_folder, tmp_path, cache, capsys):
        bad = copy_of(eager_folder, tmp_path)
        outside = tmp_path / "outside.json"
        shutil.move(bad / "tuning.json", outside)
        (bad / "tuning.json").symlink_to(outside)
        assert_refused(bad, tmp_path, cache, "tuning.json is missing .or not a plain file inside the folder", capsys)


class TestUnlistedFiles:
    def test_unlisted_chat_template_is_never_used(self, eager_folder, tmp_path, cache):
        bad = forge_folder(eager_folder, tmp_path / "bad", lambda m: m["members"].pop(TEMPLATE))
        (bad / TEMPLATE).write_text("UNLISTED {{ messages }}")
        loaded = load_artifact(bad)
        assert cache in loaded.tokenizer_dir.parents and bad not in loaded.tokenizer_dir.parents
        assert not (loaded.tokenizer_dir / "chat_template.jinja").exists()
        assert "UNLISTED" not in (load_tokenizer(loaded.tokenizer_dir).chat_template or "")

    def test_listed_tokenizer_is_a_checked_copy(self, eager_folder, tmp_path, cache):
        loaded = load_artifact(eager_folder)
        assert cache in loaded.tokenizer_dir.parents
        assert (loaded.tokenizer_dir / "chat_template.jinja").read_bytes() == (eager_folder / TEMPLATE).read_bytes()

    def test_unlisted_altered_compiled_package_is_never_loaded(self, compiled_folder, tmp_path, cache, compiled_loads):
        def make_eager(m):
            m["members"].pop("compiled/mixed.pt2")
            m["compiled"] = {"kind": "none", "packages": {}}
            m["options"]["compile"] = "none"
        bad = forge_folder(compiled_folder, tmp_path / "bad", make_eager)
        flip_byte(bad / "compiled" / "mixed.pt2", 100)
        loaded = load_artifact(bad)
        assert loaded.execution == "eager" and compiled_loads == []

    def test_altered_listed_compiled_package_is_refused(self, compiled_folder, tmp_path, cache, capsys,
                                                        compiled_loads):
        bad = copy_of(compiled_folder, tmp_path)
        package = bad / "compiled" / "mixed.pt2"
        flip_byte(package, package.stat().st_size // 2)
        assert_refused(bad, tmp_path, cache, "compiled/mixed.pt2 is corrupt", capsys)
        assert compiled_loads == []

    def test_compiled_package_is_loaded_from_a_checked_copy(self, compiled_folder, cache, compiled_loads):
        loaded = load_artifact(compiled_folder)
        assert loaded.execution == "aotinductor" and len(compiled_loads) == 1
        assert cache in compiled_loads[0].parents
        assert compiled_loads[0].read_bytes() == (compiled_folder / "compiled" / "mixed.pt2").read_bytes()

    def test_flipped_compiled_entry_in_the_archive_is_refused(self, tiny_llama_artifact, tmp_path, cache, capsys,
                                                              compiled_loads):
        offset, size = entry_offsets(tiny_llama_artifact)["compiled/mixed.pt2.zst"]
        bad = copy_of(tiny_llama_artifact, tmp_path)
        flip_byte(bad, offset + size // 2)
        assert_refused(bad, tmp_path, cache, "compiled/mixed.pt2 is corrupt", capsys)
        assert compiled_loads == []


class TestUnpackCache:
    def test_tampered_cache_copy_is_replaced(self, tiny_llama_eager_artifact, cache):
        first = load_artifact(tiny_llama_eager_artifact).tokenizer_dir
        (first / "chat_template.jinja").write_text("TAMPERED")
        (first / "extra.json").write_text("{}")
        again = load_artifact(tiny_llama_eager_artifact).tokenizer_dir
        assert again == first and not (again / "extra.json").exists()
        assert "TAMPERED" not in (again / "chat_template.jinja").read_text()

    def test_symlink_planted_in_the_cache_is_refused(self, cache, tmp_path):
        outside = tmp_path / "outside"
        outside.mkdir()
        unpack_root().mkdir(parents=True)
        (unpack_root() / ("ab" * 16)).symlink_to(outside)
        with pytest.raises(ArtifactError, match="outside the unpack cache"):
            unpack_file("ab" * 16, "x.pt2", "00" * 16, lambda: b"data")
        assert list(outside.iterdir()) == []


class TestFormatAndTarget:
    def test_version_1_artifact_is_refused_with_the_rebuild_command(self, eager_folder, tmp_path, cache, capsys):
        def as_v1(m):
            m["format_version"] = 1
            m["build"] = m.pop("options")
        bad = forge_folder(eager_folder, tmp_path / "bad", as_v1)
        assert_refused(bad, tmp_path, cache, f"format 1, but this atom-aot reads format {ARTIFACT_FORMAT_VERSION}", capsys)
        with pytest.raises(ArtifactError, match="atom-build --model .* --arch cpu --compile none"):
            Artifact.open(bad)

    @pytest.mark.parametrize("field,value", [("arch", "sm90"), ("torch", "2.11.0+cu130"), ("cpu_isa", "ZVECTOR")])
    def test_other_target_is_refused_with_the_fix(self, eager_folder, tmp_path, cache, capsys, field, value):
        def retarget(m):
            m["target"][field] = value
            if field == "arch":
                m["options"]["arch"] = value
        bad = forge_folder(eager_folder, tmp_path / "bad", retarget)
        assert_refused(bad, tmp_path, cache, re.escape(f"built for {field} {value!r}"), capsys)
        with pytest.raises(ArtifactError, match="atom-build --model .* --arch cpu"):
            load_artifact(bad)

    def test_verify_says_intact_but_not_loadable_here(self, eager_folder, tmp_path, cache, capsys):
        def retarget(m):
            m["target"]["arch"] = m["options"]["arch"] = "sm90"
        bad = forge_folder(eager_folder, tmp_path / "bad", retarget)
        assert atom_run([str(bad), "verify"]) == 0
        out = capsys.readouterr().out
        assert "integrity OK" in out and "all 8 members match their sha256" in out
        assert re.search(r"loadable here: no: it was built for arch 'sm90', but this machine has 'cpu'.*"
                         r"atom-build --model \S+ --arch cpu --compile none", out)

    def test_verify_says_loadable(self, eager_folder, cache, capsys):
        assert atom_run([str(eager_folder), "verify"]) == 0
        assert "loadable here: yes" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tp2_folder(build_artifact, tiny_llama_dir, tmp_path_factory) -> Path:
    archive = build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2)
    return folder_from_archive(archive, tmp_path_factory.mktemp("tp2") / "art")


class TestWeightsCheckedBesideTheirUpload:
    """The weight members are hashed beside their upload (runtime/loading/loader.py checked_beside), each rank
    hashing only what it answers for: rank 0 every rank's file, the others their own."""

    def test_a_failing_check_is_the_error_even_when_the_work_fails_too(self):
        from atom_aot.runtime.loading.loader import checked_beside

        def corrupt():
            raise ArtifactError("member weights/rank0.safetensors is corrupt")

        def broken_upload():
            raise ValueError("header out of range")
        with pytest.raises(ArtifactError, match="corrupt"):
            checked_beside(corrupt, lambda: "weights")
        with pytest.raises(ArtifactError, match="corrupt"):
            checked_beside(corrupt, broken_upload)
        with pytest.raises(ValueError, match="header"):
            checked_beside(lambda: None, broken_upload)
        assert checked_beside(lambda: None, lambda: "weights") == "weights"

    def test_the_check_runs_beside_the_work(self):
        import threading
        from atom_aot.runtime.loading.loader import checked_beside
        started = threading.Event()
        assert checked_beside(started.set, lambda: started.wait(timeout=30)) is True

    def test_a_flipped_weight_byte_is_refused_after_an_upload_beside_its_hash(self, eager_folder, tmp_path):
        import torch
        from functools import partial
        from atom_aot.runtime.loading.loader import checked_beside
        from atom_aot.runtime.loading.safetensors_view import tensors_on_device
        bad = copy_of(eager_folder, tmp_path)
        name = "weights/rank0.safetensors"
        flip_byte(bad / name, (bad / name).stat().st_size // 2)
        art = Artifact.open(bad)
        upload = partial(tensors_on_device, art.unchecked_member_buffer(name), torch.device("cpu"))
        with pytest.raises(ArtifactError, match=f"{name} is corrupt"):
            checked_beside(partial(art.verify, only=[name]), upload)
        good = Artifact.open(eager_folder)
        weights = checked_beside(partial(good.verify, only=[name]),
                                 partial(tensors_on_device, good.unchecked_member_buffer(name), torch.device("cpu")))
        assert weights and name in good._verified

    def test_rank_0_refuses_any_damaged_rank_file_and_rank_1_checks_only_its_own(self, tp2_folder, tmp_path, cache):
        bad = copy_of(tp2_folder, tmp_path)
        rank0 = bad / "weights" / "rank0.safetensors"
        flip_byte(rank0, rank0.stat().st_size // 2)
        with pytest.raises(ArtifactError, match="weights/rank0.safetensors is corrupt"):
            load_artifact(bad, rank=0)
        assert load_artifact(bad, rank=1).weights            # rank 0's file is rank 0's to check
        shutil.rmtree(bad)
        bad = copy_of(tp2_folder, tmp_path)
        rank1 = bad / "weights" / "rank1.safetensors"
        flip_byte(rank1, rank1.stat().st_size // 2)
        for rank in (0, 1):
            with pytest.raises(ArtifactError, match="weights/rank1.safetensors is corrupt"):
                load_artifact(bad, rank=rank)
