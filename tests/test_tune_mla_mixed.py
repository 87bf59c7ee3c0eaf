"""How the build chooses the mixed row of an MLA model (build/tune_mla_mixed.py), on scripted timings: the chunk
and prefix kernels' configs, the prefix workspace's tile and capacity, the longest absorbed query run, the reference
op where it is faster; what inspect shows of it, and that the row reads back into the backend."""
import json
from pathlib import Path

import pytest

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.build import tune_mla_mixed
from atom_aot.build.config import BuildConfig
from atom_aot.build.measure import best_config
from atom_aot.models import ModelConfig
from atom_aot.ops.triton.mla_prefill import CHUNK_CANDIDATES, PREFIX_CANDIDATES
from atom_aot.ops.triton.mla_workspace import WORKSPACE_CANDIDATES

DECODE = {"mla_decode@1": (16, 32, 4, 2, 512, 32)}
DEEPSEEK_V3 = ModelConfig.from_json(Path(__file__).resolve().parents[1] / "scripts/gpu/configs/deepseek-v3.json")
FAST_TILE = WORKSPACE_CANDIDATES[3].as_args()[1:]


def scripted(monkeypatch, reference_ms: float, absorbed_wins_up_to: int, captured: bool = True,
             workspace_ms: float = 0.1):
    """MixedSteps.time answering from a script: the second chunk, the third prefix and the fourth workspace tile
    candidate fastest; a step's absorbed prefix work in proportion to the prefix tokens the workspace cannot hold,
    the workspace costing `workspace_ms` (its fastest tile) when it has a capacity; the absorbed form faster than
    the naive one for runs up to `absorbed_wins_up_to` tokens."""
    calls = []

    def time(self, shape, choice):
        calls.append((shape, choice))
        if choice.backend == "reference":
            return reference_ms
        if not captured:
            self.uncaptured.add(tune_mla_mixed.shape_name(shape))
        p = choice.params
        if shape[0] == tune_mla_mixed.RUN_BATCH:          # a run-length shape: tokens per sequence = shape[1]
            return 1.0 if p["absorbed_runs"][0] >= shape[1] and shape[1] <= absorbed_wins_up_to else 2.0
        capacity, *tile = p["mla_prefix_workspace"]
        prefix_tokens = shape[0] * shape[2]
        overflow = max(prefix_tokens - capacity, 0) / prefix_tokens if prefix_tokens else 0.0
        chunk = 1.0 if p["mla_chunk"] == CHUNK_CANDIDATES[1].as_args() else 3.0
        absorbed = 0.5 if p["mla_prefix"] == PREFIX_CANDIDATES[2].as_args() else 1.5
        workspace = 0.0 if capacity == 0 else workspace_ms * (1 if tuple(tile) == FAST_TILE else 4)
        return chunk + overflow * absorbed + workspace
    monkeypatch.setattr(tune_mla_mixed.MixedSteps, "time", time)
    return calls


def tune(cfg=DEEPSEEK_V3, config=BuildConfig(arch="sm90")):
    return tune_mla_mixed.tune_mixed(cfg, config, DECODE, best_config)


@pytest.mark.parametrize("wins_up_to,runs", [(1, 1), (2, 2), (4, 4), (8, 8)])
def test_the_triton_row_takes_the_fastest_configs_and_the_longest_winning_run(monkeypatch, wins_up_to, runs):
    calls = scripted(monkeypatch, reference_ms=50.0, absorbed_wins_up_to=wins_up_to)
    choice, measured, label = tune()
    # 4096 tokens: within 5% of 8192's geometric mean (only the 16384-token prefix step overflows it further)
    assert choice == BackendChoice("triton", {**DECODE, "mla_chunk": CHUNK_CANDIDATES[1].as_args(),
                                              "mla_prefix": PREFIX_CANDIDATES[2].as_args(),
                                              "mla_prefix_workspace": (4096, *FAST_TILE), "absorbed_runs": (runs,)})
    assert f"query runs of <= {runs} tokens absorbed" in label and "into a 4096-token workspace" in label
    assert set(measured["mla_chunk"]) == {"1x2048+0", "8x1024+0"} and measured["triton_in_cuda_graphs"]
    timed_runs = {shape[1] for shape, _ in calls if shape[0] == tune_mla_mixed.RUN_BATCH}
    assert timed_runs == {n for n in tune_mla_mixed.RUN_LENGTHS if n <= max(2 * runs, 2)}   # stops at the first loss


def test_the_capacities_are_those_whose_workspace_fits_and_the_tiles_are_timed_at_the_largest(monkeypatch):
    """At DeepSeek-V3's 128 heads in bf16 a 16384-token workspace is over 1 GiB: not a candidate on one rank; on
    two (64 heads each) it is. The prefix kernel's configs are timed with no workspace (every prefix absorbed)."""
    calls = scripted(monkeypatch, reference_ms=50.0, absorbed_wins_up_to=2)
    _, measured, _ = tune()
    assert set(measured["prefix_capacity"]["2x1024+8192"]) == {"0", "2048", "4096", "8192"}
    assert {key.split(",")[0] for key in measured["mla_prefix_workspace"]["1x1024+2048"]} == {"8192"}
    prefix_timed = {c.params["mla_prefix_workspace"][0] for _, c in calls
                    if c.backend == "triton" and c.params["mla_prefix"] != PREFIX_CANDIDATES[2].as_args()}
    assert prefix_timed == {0}
    assert tune_mla_mixed.workspace_capacities(DEEPSEEK_V3, BuildConfig(arch="sm90", tensor_parallel_size=2))[-1] == 16384


def test_no_workspace_where_it_does_not_pay(monkeypatch):
    scripted(monkeypatch, reference_ms=50.0, absorbed_wins_up_to=2, workspace_ms=5.0)
    choice, _, label = tune()
    assert choice.params["mla_prefix_workspace"] == (0, *FAST_TILE)
    assert "no prefix workspace: measured faster without" in label


def test_the_reference_is_kept_where_it_is_faster(monkeypatch):
    scripted(monkeypatch, reference_ms=0.1, absorbed_wins_up_to=2)
    choice, measured, label = tune()
    assert choice == BackendChoice("reference") and "reference" in label
    assert set(measured["against_reference"]) == {"8x1024+0", "1x1024+2048", "1x2048+4096"}
    assert measured["against_reference"]["8x1024+0"] == {"triton": 1.1, "reference": 0.1}


def test_a_path_that_did_not_capture_is_recorded(monkeypatch):
    scripted(monkeypatch, reference_ms=50.0, absorbed_wins_up_to=2, captured=False)
    _, measured, _ = tune()
    assert measured["triton_in_cuda_graphs"] is False


def test_inspect_shows_the_mixed_row_and_its_timings(monkeypatch):
    from atom_aot.runtime.inspect import measurement_lines
    scripted(monkeypatch, reference_ms=50.0, absorbed_wins_up_to=4)
    choice, measured, _ = tune()
    text = "\n".join(measurement_lines({"mla_mixed": measured}))
    assert "mla_mixed / absorbed_runs / 4" in text and "mla_mixed / against_reference / 8x1024+0" in text
    assert "mla_mixed / mla_chunk / 1x2048+0" in text and "mla_mixed / prefix_capacity / 2x1024+8192" in text


def test_the_row_round_trips_through_tuning_json_into_the_backend(monkeypatch):
    """The chosen row written as tuning.json and read back: the same params, and the backend runs them."""
    from atom_aot.artifact.phase import Phase
    from atom_aot.artifact.tuning import PhaseTuning, Tuning
    from atom_aot.ops.backends import make_backend
    scripted(monkeypatch, reference_ms=50.0, absorbed_wins_up_to=2)
    choice, measured, label = tune()
    tuning = Tuning("sm90", True, {Phase.MIXED: PhaseTuning({"mla_attention": choice})}, {"mla_attention": label},
                    {"mla_mixed": measured})
    read = Tuning.from_dict(json.loads(tuning.to_json()))
    assert read.for_phase(Phase.MIXED).op("mla_attention") == choice
    backend = make_backend("mla_attention", read.for_phase(Phase.MIXED).op("mla_attention"))
    assert backend.workspace == [4096, *FAST_TILE] and backend.absorbed_max == 2
