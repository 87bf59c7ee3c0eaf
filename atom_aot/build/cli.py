"""`atom-build`: compile a model ahead of time into a versioned artifact."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atom_aot.artifact.build_options import ARCHES, BuildOptions
from atom_aot.config_flags import add_arguments, from_namespace


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="atom-build",
        description="Compile a model ahead of time into an artifact that `atom-run` serves with no compilation.",
        epilog="Building needs the target present: --arch must be this machine's arch (or auto), since kernel "
               "choices and graph-pool sizes are measured on it. Same inputs give the same build key, and the "
               "build then returns the cached artifact at once.")
    p.add_argument("--model", default=None,
                   help="Hugging Face model folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--arch", default="auto", choices=("auto",) + ARCHES,
                   help="target; auto = this machine (building for an arch that is not present is an error)")
    add_arguments(p, BuildOptions, exclude=("arch",))
    p.add_argument("--out", type=Path, default=None, help="output path (.atom file, or a folder)")
    p.add_argument("--cache-dir", type=Path, default=None, help="artifact cache (default: artifacts/)")
    p.add_argument("--print-key", action="store_true", help="print the build key and exit without building")
    p.add_argument("--force", action="store_true", help="rebuild even if the cache has this key")
    p.add_argument("--summary-json", action="store_true", help="print the result as one JSON line (for tools)")
    signing = p.add_argument_group("signing (docs/artifact-format.md)")
    signing.add_argument("--sign-key", type=Path, default=None, help="sign the artifact (built, or found in the "
                         "cache) with this ed25519 private key, a PEM file as `openssl genpkey -algorithm ed25519` "
                         "makes; the build key does not change")
    signing.add_argument("--sign", type=Path, default=None, metavar="ART", help="sign the existing artifact ART with "
                         "--sign-key instead of building (its members are checked first)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def build_config(args: argparse.Namespace):
    """The BuildConfig the flags ask for, with --arch auto resolved to this machine (checked here, before
    the model is read)."""
    from atom_aot.arch import detect_arch
    from atom_aot.build.config import BuildConfig
    return from_namespace(BuildConfig, args, arch=detect_arch() if args.arch == "auto" else args.arch)


def main(argv=None) -> int:
    from atom_aot.cli_util import run_cli
    return run_cli(lambda: _main(parse_args(argv)))


def _main(args: argparse.Namespace) -> int:
    from atom_aot.artifact.signing import SigningKey
    from atom_aot.build.pipeline import build, plan
    if args.sign is not None:
        return sign_existing(args)
    signing_key = SigningKey.load(args.sign_key) if args.sign_key else None    # a bad key fails before the build
    config = build_config(args)
    if args.print_key:
        if signing_key is not None:
            raise ValueError("--print-key prints the build key, which signing does not change: drop --sign-key")
        _, _, key, _ = plan(args.model, config)
        print(key)
        return 0
    result = build(args.model, config, cache_dir=args.cache_dir, out=args.out, force=args.force,
                   signing_key=signing_key)
    if args.summary_json:
        print(json.dumps({"path": str(result.path), "key": result.key, "cached": result.cached,
                          "seconds": result.seconds, "signed_by": result.signed_by}))
    else:
        print(summary(result))
    return 0


def sign_existing(args: argparse.Namespace) -> int:
    """`atom-build --sign ART --sign-key KEY`: no build, so every build flag given with it is refused by name."""
    from atom_aot.artifact.resign import sign_artifact
    from atom_aot.artifact.signing import SigningKey
    defaults = parser().parse_args([])
    given = sorted(f"--{name.replace('_', '-')}" for name, value in vars(args).items()
                   if name not in ("sign", "sign_key", "summary_json") and value != getattr(defaults, name))
    if given:
        raise ValueError(f"--sign signs an existing artifact without building, so {', '.join(given)} cannot apply: "
                         f"drop them, or build with --sign-key instead of --sign")
    if args.sign_key is None:
        raise ValueError(f"--sign {args.sign} needs --sign-key KEY, the ed25519 private key (PEM) to sign it with")
    signed = sign_artifact(args.sign, SigningKey.load(args.sign_key))
    if args.summary_json:
        print(json.dumps({"path": str(signed.path), "signed_by": signed.fingerprint, "changed": signed.changed}))
    else:
        print(f"artifact   {signed.path}\nsignature  {signed.fingerprint} ({args.sign_key.name})"
              + ("" if signed.changed else ": it was signed by this key already, left as it was"))
    return 0


def summary(result) -> str:
    from atom_aot.artifact.reader import Artifact
    manifest = Artifact.open(result.path).manifest
    lines = [f"artifact   {result.path}", f"build key  {result.key}",
             "status     " + ("cache hit: the artifact with this key was reused" if result.cached else "built")]
    if not result.cached:
        lines.append("stages     " + ", ".join(f"{k} {v:.1f}s" for k, v in result.seconds.items()))
    sizes = {}
    for name, member in manifest.members.items():
        group = name.split("/")[0] if "/" in name else "other"
        sizes[group] = sizes.get(group, 0) + member.stored_size
    total = f" (file {result.path.stat().st_size / 2**20:.1f} MiB)" if result.path.is_file() else ""
    lines.append("sizes      " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(sizes.items())) + total)
    if result.signed_by:
        lines.append(f"signature  {result.signed_by}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
