"""How the build chooses the mixed row of an MLA model (build/tune_mla_mixed.py), on scripted timings: the chunk
and prefix kernels' configs, the longest absorbed query run, the reference op where it is faster; and what
inspect shows of it."""
import pytest

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.build import tune_mla_mixed
from atom_aot.build.config import BuildConfig
from atom_aot.build.measure import best_config
from atom_aot.ops.triton.mla_prefill import CHUNK_CANDIDATES, PREFIX_CANDIDATES

DECODE = {"mla_decode@1": (16, 32, 4, 2, 512, 32)}


def scripted(monkeypatch, reference_ms: float, absorbed_wins_up_to: int, captured: bool = True):
    """MixedSteps.time answering from a script: the second chunk and the third prefix candidate fastest, the
    absorbed form faster than the naive one for runs up to `absorbed_wins_up_to` tokens."""
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
        chunk = 1.0 if p["mla_chunk"] == CHUNK_CANDIDATES[1].as_args() else 3.0
        return chunk + (0.5 if p["mla_prefix"] == PREFIX_CANDIDATES[2].as_args() else 1.5)
    monkeypatch.setattr(tune_mla_mixed.MixedSteps, "time", time)
    return calls


@pytest.mark.parametrize("wins_up_to,runs", [(1, 1), (2, 2), (4, 4), (8, 8)])
def test_the_triton_row_takes_the_fastest_configs_and_the_longest_winning_run(monkeypatch, wins_up_to, runs):
    calls = scripted(monkeypatch, reference_ms=50.0, absorbed_wins_up_to=wins_up_to)
    choice, measured, label = tune_mla_mixed.tune_mixed(None, BuildConfig(arch="sm90"), DECODE, best_config)
    assert choice == BackendChoice("triton", {**DECODE, "mla_chunk": CHUNK_CANDIDATES[1].as_args(),
                                              "mla_prefix": PREFIX_CANDIDATES[2].as_args(), "absorbed_runs": (runs,)})
    assert f"query runs of <= {runs} tokens absorbed" in label
    assert set(measured["mla_chunk"]) == {"1x2048+0", "8x1024+0"} and measured["triton_in_cuda_graphs"]
    timed_runs = {shape[1] for shape, _ in calls if shape[0] == tune_mla_mixed.RUN_BATCH}
    assert timed_runs == {n for n in tune_mla_mixed.RUN_LENGTHS if n <= max(2 * runs, 2)}   # stops at the first loss


def test_the_reference_is_kept_where_it_is_faster(monkeypatch):
    scripted(monkeypatch, reference_ms=0.1, absorbed_wins_up_to=2)
    choice, measured, label = tune_mla_mixed.tune_mixed(None, BuildConfig(arch="sm90"), DECODE, best_config)
    assert choice == BackendChoice("reference") and "reference" in label
    assert measured["against_reference"]["8x1024+0"] == {"triton": 1.5, "reference": 0.1}


def test_a_path_that_did_not_capture_is_recorded(monkeypatch):
    scripted(monkeypatch, reference_ms=50.0, absorbed_wins_up_to=2, captured=False)
    _, measured, _ = tune_mla_mixed.tune_mixed(None, BuildConfig(arch="sm90"), DECODE, best_config)
    assert measured["triton_in_cuda_graphs"] is False


def test_inspect_shows_the_mixed_row_and_its_timings(monkeypatch):
    from atom_aot.runtime.inspect import measurement_lines
    scripted(monkeypatch, reference_ms=50.0, absorbed_wins_up_to=4)
    choice, measured, _ = tune_mla_mixed.tune_mixed(None, BuildConfig(arch="sm90"), DECODE, best_config)
    text = "\n".join(measurement_lines({"mla_mixed": measured}))
    assert "mla_mixed / absorbed_runs / 4" in text and "mla_mixed / against_reference / 8x1024+0" in text
    assert "mla_mixed / mla_chunk / 1x2048+0" in text
