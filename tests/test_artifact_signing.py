"""Signed artifacts: `atom-build --sign-key` / `--sign` sign the manifest with ed25519, and `--trusted-keys DIR`
(atom-run generate / serve / verify, LLMEngine) refuses, before any member is read, an artifact that no key in DIR
signed or whose manifest changed after signing. Without trusted keys an unsigned artifact loads as before."""
from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest
from artifact_tools import flip_byte, folder_from_archive, forged_manifest, read_entries, write_entries
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from atom_aot.artifact.layout import MANIFEST, MANIFEST_CHECKSUM, SIGNATURE
from atom_aot.artifact.reader import Artifact
from atom_aot.artifact.resign import sign_artifact
from atom_aot.artifact.signing import SigningKey, TrustedKeys
from atom_aot.build import cli as build_cli
from atom_aot.build.config import BuildConfig
from atom_aot.build.pipeline import build
from atom_aot.errors import ArtifactError
from atom_aot.runtime.cli import main as atom_run


def write_key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """(private PEM, public PEM), the formats `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` write."""
    key = Ed25519PrivateKey.generate()
    private = folder / f"{name}.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public = folder / f"{name}.pub"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    """Two signers; the trusted folder holds the first one's public key only."""
    root = tmp_path_factory.mktemp("keys")
    ours, ours_public = write_key_pair(root, "ours")
    theirs, _ = write_key_pair(root, "theirs")
    trusted = root / "trusted"
    trusted.mkdir()
    shutil.copy(ours_public, trusted / "ours.pub")
    return {"ours": ours, "theirs": theirs, "trusted": trusted}


def copy_of(src: Path, dest: Path) -> Path:
    return Path(shutil.copytree(src, dest) if src.is_dir() else shutil.copy(src, dest))


@pytest.fixture(scope="module")
def eager_folder(tiny_llama_eager_artifact, tmp_path_factory) -> Path:
    return folder_from_archive(tiny_llama_eager_artifact, tmp_path_factory.mktemp("folder") / "art")


@pytest.fixture(params=["archive", "folder"])
def signed(request, tiny_llama_eager_artifact, eager_folder, keys, tmp_path) -> Path:
    """A copy of the eager tiny artifact signed with the trusted key, in either form."""
    src = tiny_llama_eager_artifact if request.param == "archive" else eager_folder
    path = copy_of(src, tmp_path / ("signed" + src.suffix))
    assert sign_artifact(path, SigningKey.load(keys["ours"])).changed
    return path


def refused_before_any_member(monkeypatch) -> None:
    """Reading any member fails the test: a refusal must come first."""
    def no_member(self, name):
        raise AssertionError(f"member {name} was read")
    monkeypatch.setattr(Artifact, "_contents", no_member)


class TestTrustedKeys:
    def test_signed_by_a_trusted_key_is_accepted_and_verify_names_it(self, signed, keys, capsys):
        from atom_aot.runtime.loading.loader import load_artifact
        assert atom_run([str(signed), "verify", "--trusted-keys", str(keys["trusted"])]) == 0
        out = capsys.readouterr().out
        fingerprint = SigningKey.load(keys["ours"]).fingerprint
        assert f"signed by {fingerprint} (trusted key ours.pub)" in out and "integrity OK" in out
        assert atom_run([str(signed), "verify"]) == 0          # no trusted keys: the signer, not whether it is trusted
        assert f"signature: by key {fingerprint}, and it matches the manifest" in capsys.readouterr().out
        loaded = load_artifact(signed, trusted_keys=keys["trusted"])
        assert loaded.execution == "eager" and loaded.manifest == Artifact.open(signed).manifest

    def test_unsigned_is_refused_before_any_member_is_read(self, tiny_llama_eager_artifact, keys, capsys,
                                                           monkeypatch):
        refused_before_any_member(monkeypatch)
        assert atom_run([str(tiny_llama_eager_artifact), "generate", "hi", "--max-tokens", "1",
                         "--trusted-keys", str(keys["trusted"])]) == 2
        err = capsys.readouterr().err.replace("\n  ", " ")
        assert "is not signed" in err and "ours.pub" in err and "Traceback" not in err
        with pytest.raises(ArtifactError, match="is not signed"):
            Artifact.open(tiny_llama_eager_artifact, keys["trusted"])

    def test_signed_by_another_key_is_refused(self, signed, keys, monkeypatch):
        sign_artifact(signed, SigningKey.load(keys["theirs"]))
        refused_before_any_member(monkeypatch)
        theirs = SigningKey.load(keys["theirs"]).fingerprint
        with pytest.raises(ArtifactError, match=f"signed by key {theirs}, which is not one of the trusted keys"):
            Artifact.open(signed, keys["trusted"])
        from atom_aot.entrypoints.llm import LLMEngine
        with pytest.raises(ArtifactError, match="not one of the trusted keys"):
            LLMEngine(str(signed), trusted_keys=str(keys["trusted"]))

    def test_manifest_changed_after_signing_is_refused(self, signed, keys, capsys):
        def raise_max_len(m):
            m["numerics"]["max_model_len"] += 1
        if signed.is_dir():
            raw, checksum = forged_manifest((signed / MANIFEST).read_bytes(), raise_max_len)
            (signed / MANIFEST).write_bytes(raw)
            (signed / MANIFEST_CHECKSUM).write_bytes(checksum)
        else:
            entries = read_entries(signed)
            entries[MANIFEST], entries[MANIFEST_CHECKSUM] = forged_manifest(entries[MANIFEST], raise_max_len)
            write_entries(signed, entries)
        with pytest.raises(ArtifactError, match="does not match its manifest"):
            Artifact.open(signed, keys["trusted"])
        assert atom_run([str(signed), "verify"]) == 2         # without trusted keys too: the signature is wrong
        assert "does not match its manifest" in capsys.readouterr().err.replace("\n  ", " ")

    def test_member_changed_after_signing_is_refused_by_its_hash(self, signed, keys):
        art = Artifact.open(signed, keys["trusted"])
        name = "config/config.json"
        if signed.is_dir():
            flip_byte(signed / name, 3)
        else:
            with tarfile.open(signed) as tar:
                entry = next(m for m in tar.getmembers() if m.name.startswith(name))
            flip_byte(signed, entry.offset_data + 3)
        with pytest.raises(ArtifactError, match=f"member {name}"):
            Artifact.open(signed, keys["trusted"]).verify(full=True)
        assert art.signer.key_name == "ours.pub"

    def test_without_trusted_keys_unsigned_loads_as_before(self, tiny_llama_eager_artifact, capsys):
        from atom_aot.runtime.loading.loader import load_artifact
        assert load_artifact(tiny_llama_eager_artifact).execution == "eager"
        assert atom_run([str(tiny_llama_eager_artifact), "verify"]) == 0
        assert "signature: none" in capsys.readouterr().out

    def test_serve_refuses_before_the_engine_starts(self, tiny_llama_eager_artifact, keys, capsys, monkeypatch):
        from atom_aot.server.__main__ import main as serve
        refused_before_any_member(monkeypatch)
        assert serve([str(tiny_llama_eager_artifact), "--trusted-keys", str(keys["trusted"]), "--port", "0"]) == 2
        assert "is not signed" in capsys.readouterr().err.replace("\n  ", " ")


class TestSigning:
    def test_a_cached_artifact_is_signed_in_place_and_keeps_its_build_key(self, tiny_llama_dir,
                                                                          tiny_llama_eager_artifact, keys, tmp_path):
        cache = tmp_path / "cache"
        cache.mkdir()
        copy = copy_of(tiny_llama_eager_artifact, cache / tiny_llama_eager_artifact.name)
        before = Artifact.open(copy).manifest_bytes
        key = SigningKey.load(keys["ours"])
        result = build(str(tiny_llama_dir), BuildConfig(arch="cpu", compile="none"), cache_dir=cache,
                       show_progress=False, signing_key=key)
        assert result.cached and result.path == copy and result.signed_by == key.fingerprint
        signed = Artifact.open(copy, keys["trusted"])
        assert signed.manifest_bytes == before and signed.manifest.build_key == result.key
        assert [m.name for m in tarfile.open(copy).getmembers()][:3] == [MANIFEST, MANIFEST_CHECKSUM, SIGNATURE]
        assert not sign_artifact(copy, key).changed          # signed by this key already: left as it is

    def test_a_fresh_build_is_written_signed_with_the_unsigned_build_key(self, tiny_llama_dir,
                                                                         tiny_llama_eager_artifact, keys, tmp_path):
        key = SigningKey.load(keys["ours"])
        result = build(str(tiny_llama_dir), BuildConfig(arch="cpu", compile="none"), out=tmp_path / "fresh.atom",
                       show_progress=False, signing_key=key)
        assert not result.cached and result.signed_by == key.fingerprint
        assert result.key == Artifact.open(tiny_llama_eager_artifact).manifest.build_key
        assert Artifact.open(result.path, keys["trusted"]).signer.fingerprint == key.fingerprint

    def test_a_bad_signing_key_fails_before_the_build(self, tiny_llama_dir, tmp_path, capsys):
        assert build_cli.main(["--model", str(tiny_llama_dir), "--sign-key", str(tmp_path / "none.pem"),
                               "--out", str(tmp_path / "never.atom")]) == 2
        error = " ".join(capsys.readouterr().err.split())          # the message is wrapped to the terminal's width
        assert "cannot read it" in error and not (tmp_path / "never.atom").exists()

    def test_sign_cli_signs_a_folder_and_refuses_build_flags(self, eager_folder, keys, tmp_path, capsys):
        folder = copy_of(eager_folder, tmp_path / "art")
        assert build_cli.main(["--sign", str(folder), "--sign-key", str(keys["ours"])]) == 0
        assert SigningKey.load(keys["ours"]).fingerprint in capsys.readouterr().out
        assert (folder / SIGNATURE).is_file() and Artifact.open(folder, keys["trusted"]).signer is not None
        assert build_cli.main(["--sign", str(folder), "--sign-key", str(keys["ours"]), "--force"]) == 2
        assert "--force cannot apply" in capsys.readouterr().err.replace("\n  ", " ")
        assert build_cli.main(["--sign", str(folder)]) == 2
        assert "needs --sign-key" in capsys.readouterr().err.replace("\n  ", " ")

    def test_key_files_are_checked(self, keys, tmp_path):
        with pytest.raises(ArtifactError, match="holds no public keys"):
            TrustedKeys.load(tmp_path)
        shutil.copy(keys["ours"], tmp_path / "ours.pem")
        with pytest.raises(ArtifactError, match="holds a private key"):
            TrustedKeys.load(tmp_path)
        with pytest.raises(ArtifactError, match="not a folder"):
            TrustedKeys.load(tmp_path / "missing")
        encrypted = tmp_path / "encrypted.key"
        encrypted.write_bytes(Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret")))
        with pytest.raises(ArtifactError, match="is encrypted"):
            SigningKey.load(encrypted)
        with pytest.raises(ArtifactError, match="not a PEM private key"):
            SigningKey.load(keys["trusted"] / "ours.pub")
