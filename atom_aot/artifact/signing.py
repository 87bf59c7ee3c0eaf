"""Who made an artifact: an ed25519 signature over the manifest's bytes, which hold every member's
sha256, so one signature covers the whole artifact without hashing it again.

The signature sits beside the manifest as `manifest.sig` (in the `.atom` archive and in the folder
form alike), outside the member table, so signing never changes the manifest or the build key:

    manifest.sig   {"algorithm": "ed25519", "public_key": <base64 raw 32 bytes>, "signature": <base64 64 bytes>}

Keys are PEM files as `openssl genpkey -algorithm ed25519` writes them (PKCS8 private key) and
`openssl pkey -pubout` derives (SubjectPublicKeyInfo public key). A folder of trusted public keys
(`--trusted-keys DIR`) names who may have signed the artifacts a runtime loads.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from atom_aot.errors import ArtifactError

ALGORITHM = "ed25519"
PUBLIC_KEY_SUFFIXES = (".pem", ".pub")
MAKE_KEYS = ("openssl genpkey -algorithm ed25519 -out signing.pem && "
             "openssl pkey -in signing.pem -pubout -out trusted/signing.pub")


def fingerprint(public_key: bytes) -> str:
    """`sha256:` and the hex sha256 of the raw 32-byte public key (what `verify` prints)."""
    return "sha256:" + hashlib.sha256(public_key).hexdigest()


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass(frozen=True)
class Signature:
    """The contents of manifest.sig."""
    public_key: bytes       # the signer's raw 32-byte ed25519 public key
    signature: bytes        # 64 bytes over the manifest's exact bytes

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def to_bytes(self) -> bytes:
        return json.dumps({"algorithm": ALGORITHM, "public_key": base64.b64encode(self.public_key).decode(),
                           "signature": base64.b64encode(self.signature).decode()}, indent=1).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "Signature":
        try:
            fields = json.loads(data)
            if fields.get("algorithm") != ALGORITHM:
                raise ValueError(f"algorithm {fields.get('algorithm')!r}, expected {ALGORITHM!r}")
            public, signature = (base64.b64decode(fields[k], validate=True) for k in ("public_key", "signature"))
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as e:
            raise ArtifactError(f"{where}: its signature file is malformed ({type(e).__name__}: {e}). Nothing "
                                f"from this artifact was loaded. Sign it again: atom-build --sign ART --sign-key KEY."
                                ) from None
        if len(public) != 32 or len(signature) != 64:
            raise ArtifactError(f"{where}: its signature file holds a {len(public)}-byte key and a {len(signature)}-"
                                f"byte signature (ed25519: 32 and 64). Nothing from this artifact was loaded.")
        return cls(public, signature)

    def matches(self, manifest_raw: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(self.signature, manifest_raw)
            return True
        except InvalidSignature:
            return False


@dataclass(frozen=True)
class SigningKey:
    """A private key read from a PEM file, for `atom-build --sign-key`."""
    path: Path
    key: Ed25519PrivateKey

    @classmethod
    def load(cls, path: str | Path) -> "SigningKey":
        path = Path(path)
        data = _read_key_file(path, "--sign-key")
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except TypeError:
            raise ArtifactError(f"--sign-key {path} is encrypted: atom-build reads unencrypted PEM keys only. Make "
                                f"one with: {MAKE_KEYS}") from None
        except ValueError:
            raise ArtifactError(f"--sign-key {path} is not a PEM private key. Make an ed25519 key with: "
                                f"{MAKE_KEYS}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ArtifactError(f"--sign-key {path} is a {type(key).__name__.removeprefix('_')}, not an ed25519 key "
                                f"(the only kind atom-aot signs with). Make one with: {MAKE_KEYS}")
        return cls(path, key)

    @property
    def public_key(self) -> bytes:
        return _raw_public(self.key.public_key())

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def sign(self, manifest_raw: bytes) -> Signature:
        return Signature(self.public_key, self.key.sign(manifest_raw))


@dataclass(frozen=True)
class TrustedKey:
    name: str               # the key file's name in the trusted-keys folder
    public_key: bytes       # raw 32 bytes


@dataclass(frozen=True)
class Signer:
    """Who signed an artifact whose signature matched its manifest."""
    fingerprint: str
    key_name: str | None    # the trusted key file it matched (None: not checked against trusted keys)

    def describe(self) -> str:
        return self.fingerprint + (f" (trusted key {self.key_name})" if self.key_name else "")


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys of a `--trusted-keys` folder: every *.pem and *.pub file in it (not its subfolders)."""
    folder: Path
    keys: tuple[TrustedKey, ...]

    @classmethod
    def load(cls, folder: str | Path) -> "TrustedKeys":
        folder = Path(folder)
        if not folder.is_dir():
            raise ArtifactError(f"--trusted-keys {folder} is not a folder: it must be a folder of ed25519 public "
                                f"keys (*.pem or *.pub). Make a key pair with: {MAKE_KEYS}")
        files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in PUBLIC_KEY_SUFFIXES)
        if not files:
            raise ArtifactError(f"--trusted-keys {folder} holds no public keys (*.pem or *.pub files), so no artifact "
                                f"could be trusted. Put the signers' public keys there; make a key pair with: "
                                f"{MAKE_KEYS}")
        return cls(folder, tuple(TrustedKey(p.name, _public_key(p)) for p in files))

    def find(self, public_key: bytes) -> TrustedKey | None:
        return next((k for k in self.keys if k.public_key == public_key), None)

    def listing(self) -> str:
        return ", ".join(f"{k.name} ({fingerprint(k.public_key)})" for k in self.keys)

    def check(self, manifest_raw: bytes, signature_raw: bytes | None, where: str) -> Signer:
        """The signer of an artifact whose manifest is `manifest_raw`, refused unless it is one of these keys and its
        signature matches those bytes."""
        if signature_raw is None:
            raise ArtifactError(f"{where} is not signed, and --trusted-keys {self.folder} accepts only artifacts "
                                f"signed by one of its keys: {self.listing()}. Nothing from it was loaded. Sign it "
                                f"with atom-build --sign {where} --sign-key KEY.")
        signature = Signature.from_bytes(signature_raw, where)
        trusted = self.find(signature.public_key)
        if trusted is None:
            raise ArtifactError(f"{where} is signed by key {signature.fingerprint}, which is not one of the trusted "
                                f"keys in {self.folder}: {self.listing()}. Nothing from it was loaded.")
        if not signature.matches(manifest_raw):
            raise ArtifactError(f"{where}: its signature by trusted key {trusted.name} does not match its manifest "
                                f"(the manifest was changed after signing, or the signature is damaged). Nothing "
                                f"from it was loaded. Copy it again from its source.")
        return Signer(signature.fingerprint, trusted.name)


def read_signer(manifest_raw: bytes, signature_raw: bytes | None, where: str) -> Signer | None:
    """Who signed the artifact, checked against the key it names (None: unsigned); for `verify` without trusted keys,
    which can say who signed it but not whether that key is trusted."""
    if signature_raw is None:
        return None
    signature = Signature.from_bytes(signature_raw, where)
    if not signature.matches(manifest_raw):
        raise ArtifactError(f"{where}: its signature by key {signature.fingerprint} does not match its manifest (the "
                            f"manifest was changed after signing, or the signature is damaged).")
    return Signer(signature.fingerprint, None)


def _public_key(path: Path) -> bytes:
    data = _read_key_file(path, "--trusted-keys")
    if b"PRIVATE KEY" in data:
        raise ArtifactError(f"--trusted-keys: {path} holds a private key; the folder takes public keys only "
                            f"(openssl pkey -in {path.name} -pubout -out {path.stem}.pub), and the private key "
                            f"belongs with the signer alone.")
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise ArtifactError(f"--trusted-keys: {path} is not a PEM public key. Make one with: {MAKE_KEYS}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ArtifactError(f"--trusted-keys: {path} is a {type(key).__name__.removeprefix('_')}, not an ed25519 "
                            f"public key (the only kind atom-aot signs with).")
    return _raw_public(key)


def _read_key_file(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise ArtifactError(f"{flag} {path}: cannot read it ({e.strerror or e}).") from None
