"""The MoE op's build-time tuning (per token-count bucket) and the `triton` moe backend inside a tiny
Qwen3-MoE / Mixtral, against the reference; kernels under TRITON_INTERPRET=1 without a GPU."""
import itertools
from types import SimpleNamespace

import pytest
import torch

from model_factories import TINY_QWEN3, mixed_step, tiny_model
from triton_kernel_checks import rel_error
from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.artifact.phase import Phase
from atom_aot.artifact.tuning import BackendChoice, PhaseTuning, Tuning
from atom_aot.build.config import BuildConfig
from atom_aot.build.measure import best_config
from atom_aot.build.tune import _tune_moe, tune_kernels
from atom_aot.models import ModelConfig
from atom_aot.ops.backends import make_backend
from atom_aot.ops.triton import fused_moe as triton_moe

MOE = dict(TINY_QWEN3, architectures=["Qwen3MoeForCausalLM"], num_experts=5, num_experts_per_tok=3,
           moe_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[0])
MIXTRAL = dict(TINY_QWEN3, architectures=["MixtralForCausalLM"], num_local_experts=4, num_experts_per_tok=2,
               intermediate_size=40)


class TestTuning:
    def test_cpu_rows_name_the_reference_moe_only_for_moe_models(self):
        cpu = BuildConfig(arch="cpu")
        moe_row = tune_kernels(cpu, ModelConfig.from_hf_dict(MOE), 128).for_phase(Phase.MIXED)
        assert moe_row.op("moe") == BackendChoice("reference")
        assert "moe" not in tune_kernels(cpu, ModelConfig.from_hf_dict(TINY_QWEN3), 128).for_phase(Phase.MIXED).ops

    @pytest.mark.parametrize("quant", ["none", "fp8"])
    def test_each_bucket_keeps_its_fastest_candidate(self, monkeypatch, quant):
        """Timings are scripted (no GPU here): the kernels really run (on e4m3 experts for --quant fp8), the
        choice follows the times."""
        candidates = (triton_moe.MoEConfig(16, 16, 32, 1, 2, 1), triton_moe.MoEConfig(32, 16, 16, 2, 4, 2))
        monkeypatch.setattr(triton_moe, "CANDIDATE_CONFIGS", candidates)
        monkeypatch.setattr(triton_moe, "TOKEN_BUCKETS", (1, 4))
        monkeypatch.setattr("atom_aot.build.tune.PREFILL_MOE_TOKENS", 9)
        times = itertools.chain([2.0, 1.0], [1.0, 3.0])       # bucket 1: second wins; bucket 4: first wins

        def scripted(fn):
            assert fn().isfinite().all()
            return next(times), True
        monkeypatch.setattr("atom_aot.ops.triton.timing.measure_ms", scripted)
        choice, measured = _tune_moe(ModelConfig.from_hf_dict(MOE), SimpleNamespace(torch_dtype=torch.float32),
                                     DEVICE, weights_scheme=quant)
        assert choice == BackendChoice("triton", {"fused_moe@1": candidates[1].as_args(),
                                                  "fused_moe@4": candidates[0].as_args()})
        assert set(measured) == {1, 9} and measured[9] == {c.as_args(): t for c, t in zip(candidates, (1.0, 3.0))}
        # what tuning.json stores reads back and builds the backend
        row = PhaseTuning({"attention": BackendChoice("reference"), "moe": choice})
        read = Tuning.from_dict(Tuning("sm90", True, {Phase.MIXED: row}).to_dict())
        assert read.for_phase(Phase.DECODE).op("moe") == choice
        make_backend("moe", choice)


    @pytest.mark.parametrize("refusal", ["shared memory", "registers"])
    def test_a_candidate_the_gpu_cannot_launch_is_skipped(self, monkeypatch, caplog, refusal):
        """Triton's OutOfResources (shared memory) or ptxas's refusal (more registers than the warps leave, raised as
        PTXASError) at a candidate: recorded as None, logged, never chosen."""
        from triton.runtime.errors import OutOfResources, PTXASError
        too_big, fits = triton_moe.MoEConfig(16, 16, 32, 1, 2, 1), triton_moe.MoEConfig(32, 16, 16, 2, 4, 2)
        monkeypatch.setattr(triton_moe, "CANDIDATE_CONFIGS", (too_big, fits))
        monkeypatch.setattr(triton_moe, "TOKEN_BUCKETS", (1, 4))
        monkeypatch.setattr("atom_aot.build.tune.PREFILL_MOE_TOKENS", 9)
        calls = itertools.count()

        def scripted(fn):
            if next(calls) % 2 == 0:       # the first candidate of each bucket
                if refusal == "shared memory":
                    raise OutOfResources(300000, 232448, "shared memory")
                raise PTXASError("ptxas fatal   : (C7602) Insufficient registers (128) to compile instruction")
            return 5.0, True
        monkeypatch.setattr("atom_aot.ops.triton.timing.measure_ms", scripted)
        with caplog.at_level("INFO", logger="atom_aot"):
            choice, measured = _tune_moe(ModelConfig.from_hf_dict(MOE), SimpleNamespace(torch_dtype=torch.float32),
                                         DEVICE)
        assert choice.params == {"fused_moe@1": fits.as_args(), "fused_moe@4": fits.as_args()}
        assert measured[9] == {too_big.as_args(): None, fits.as_args(): 5.0}
        assert "does not fit this GPU" in caplog.text


@pytest.mark.parametrize("config", [MOE, MIXTRAL], ids=["qwen3moe", "mixtral"])
def test_triton_moe_in_the_model_equals_reference(config):
    model = tiny_model(**config)
    outs = []
    for moe in (BackendChoice("reference"), BackendChoice("triton", {"fused_moe@1": (16, 16, 32, 1, 2, 1),
                                                                     "fused_moe@8": (32, 32, 16, 2, 4, 2)})):
        model.use_kernels(PhaseTuning({"attention": BackendChoice("reference"), "moe": moe}))
        with torch.no_grad():
            outs.append(model(mixed_step(model)))
    assert rel_error(outs[1], outs[0]) < 1e-5


def test_a_config_that_did_not_launch_is_neverbest_config():
    # (64, 64) is fastest where it ran but did not fit the GPU at the second shape (None): the choice is
    # among configs that ran everywhere
    rows = {"1x1024": {(64, 64): 1.0, (128, 64): 1.5, (128, 128): None},
            "4x512": {(64, 64): None, (128, 64): 2.0, (128, 128): 1.0}}
    assert best_config(rows) == (128, 64)
    assert best_config({"a": {(1,): 2.0, (2,): 1.0}, "b": {(1,): 1.0, (2,): 3.0}}) == (1,)   # 2x slower once beats 3x
