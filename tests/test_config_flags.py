"""Command-line flags generated from the config dataclasses: every field reachable by its flag,
round trips through each tool, and bad values refused before anything loads."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from atom_aot.build import cli as build_cli
from atom_aot.build.config import BuildConfig
from atom_aot.build.isolated import cli_args
from atom_aot.config_flags import cli_fields, to_argv
from atom_aot.runtime import cli as runtime_cli
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.server.args import parse_args as parse_serve_args
from atom_aot.server.args import runtime_config

CHANGED_RUNTIME = RuntimeConfig(max_num_seqs=3, max_num_batched_tokens=77, max_model_len=100,
                                enable_prefix_caching=False, scheduler_delay_factor=0.5, scheduling_policy="priority",
                                kv_cache_memory_bytes=1 << 20,
                                gpu_memory_utilization=0.5, num_kv_blocks=9, enforce_eager=True, seed=7,
                                async_scheduling=False, num_threads=3, method="draft", num_speculative_tokens=3,
                                draft_model="draft.atom", ngram_min_n=1, ngram_max_n=5,
                                trusted_keys="trusted", grammar_compile_timeout=2.5, grammar_compile_workers=3)


def test_every_runtime_field_is_a_flag_and_the_example_changes_them_all():
    assert {f.name for f in cli_fields(RuntimeConfig)} == RuntimeConfig.field_names()
    defaults = RuntimeConfig()
    assert all(getattr(CHANGED_RUNTIME, name) != getattr(defaults, name) for name in RuntimeConfig.field_names())


def test_serve_flags_round_trip():
    argv = to_argv(CHANGED_RUNTIME)
    assert "--no-prefix-caching" in argv and "--enforce-eager" in argv
    assert runtime_config(parse_serve_args(["art.atom", *argv])) == CHANGED_RUNTIME
    assert runtime_config(parse_serve_args(["art.atom"])) == RuntimeConfig()


def test_generate_flags_round_trip_and_keep_seed_for_the_prompts():
    from atom_aot.config_flags import from_namespace
    args = runtime_cli.parse_generate_args(["hi", "--seed", "5", *to_argv(CHANGED_RUNTIME, skip=("seed",))])
    assert from_namespace(RuntimeConfig, args) == dataclasses.replace(CHANGED_RUNTIME, seed=0)
    assert args.prompt_seed == 5 and args.prompt == ["hi"]


@pytest.mark.parametrize("config", [
    BuildConfig(arch="cpu"),
    BuildConfig(arch="cpu", dtype="bfloat16", quant="fp8", kv_cache_dtype="fp8", capture_sizes=(), max_model_len=64,
                block_size=32, compile="none", tensor_parallel_size=2, enable_expert_parallel=True),
    BuildConfig(arch="sm90", capture_sizes=(1, 2, 8)),
])
def test_the_child_build_gets_the_same_config(config, tmp_path):
    args = build_cli.parse_args(cli_args("model-dir", config, tmp_path))
    assert build_cli.build_config(args) == config
    assert (args.model, args.cache_dir) == ("model-dir", tmp_path)


def test_build_flags_keep_their_spellings():
    args = build_cli.parse_args(["-tp", "2", "--ep", "--capture-sizes", "none", "--kv-cache-dtype", "bf16"])
    assert (args.tensor_parallel_size, args.enable_expert_parallel, args.capture_sizes) == (2, True, ())
    assert args.arch == "auto" and build_cli.build_config(args).arch in ("cpu", "sm80", "sm90", "sm100")


def _atom_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "atom_aot.entrypoints.run_cli", *args], capture_output=True,
                          text=True, timeout=120, env=os.environ.copy())


@pytest.mark.parametrize("command", [["generate", "hi"], ["serve"]])
@pytest.mark.parametrize("flag, value, message", [
    ("--max-num-seqs", "0", "max_num_seqs (--max-num-seqs) must be an integer >= 1, got 0"),
    ("--scheduler-delay-factor", "-1", "scheduler_delay_factor (--scheduler-delay-factor) must be a number >= 0"),
    ("--kv-cache-memory-bytes", "0", "kv_cache_memory_bytes (--kv-cache-memory-bytes) must be an integer >= 1"),
])
def test_bad_engine_flags_fail_before_anything_loads(tmp_path, command, flag, value, message):
    """The artifact does not exist, so any attempt to load would report that instead."""
    result = _atom_run(str(tmp_path / "missing.atom"), *command, flag, value)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {message}") and "Traceback" not in result.stderr
    assert result.stderr.count("error:") == 1 and not any(line.startswith("INFO") for line in result.stderr.splitlines())


def test_bad_build_flags_name_the_flag():
    with pytest.raises(SystemExit):
        build_cli.parse_args(["--capture-sizes", "1,x"])
    with pytest.raises(ValueError, match="--block-size must be a power of two"):
        build_cli.build_config(build_cli.parse_args(["--block-size", "12"]))


def test_atom_run_lists_all_its_commands():
    result = _atom_run("--help")
    assert result.returncode == 0
    assert all(command in result.stdout for command in ("generate", "serve", "inspect", "verify"))
