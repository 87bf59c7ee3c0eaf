"""The backend registry: tuning rows name backends, the model calls whatever the row names."""
import pytest
import torch

from model_factories import mixed_step, tiny_model

from atom_aot.artifact.phase import Phase
from atom_aot.artifact.tuning import BackendChoice, PhaseTuning, Tuning
from atom_aot.build.config import BuildConfig
from atom_aot.build.tune import tune_kernels
from atom_aot.errors import ArtifactError
from atom_aot.ops.backends import make_backend
from atom_aot.ops.backends.reference import ReferenceAttention


def test_unknown_backend_is_refused_with_the_known_ones():
    with pytest.raises(ArtifactError, match="'aiter-v9'.*it has reference, triton"):
        make_backend("attention", BackendChoice("aiter-v9"))


def test_reference_takes_no_params():
    with pytest.raises(ArtifactError, match="cannot use these params"):
        make_backend("attention", BackendChoice("reference", {"paged_attention": (16, 16, 1, 4, 2)}))


def test_cpu_tuning_round_trips_into_the_model():
    model = tiny_model()
    tuning = tune_kernels(BuildConfig(arch="cpu"), model.config, 128)
    assert tuning.to_dict()["phases"] == {"mixed": {"attention": {"backend": "reference", "params": {}}}}
    row = Tuning.from_dict(tuning.to_dict()).for_phase(Phase.DECODE)     # no decode row: the mixed one
    model.use_kernels(row)
    backends = {id(layer.self_attn.attention_backend) for layer in model.model.layers}
    assert len(backends) == 1
    assert isinstance(model.model.layers[0].self_attn.attention_backend, ReferenceAttention)


def test_the_model_calls_only_the_chosen_backend():
    model, calls = tiny_model(), []

    class Recording(ReferenceAttention):
        def __call__(self, args):
            calls.append((args.layer, tuple(args.q.shape), args.qk_norm is not None))
            return super().__call__(args)

    row = PhaseTuning({"attention": BackendChoice("reference")})
    model.use_kernels(row)
    for layer in model.model.layers:
        layer.self_attn.attention_backend = Recording(row.op("attention"))
    with torch.no_grad():
        logits = model(mixed_step(model))
    assert logits.shape == (2, 64) and logits.dtype == torch.float32
    assert calls == [(0, (11, 4, 32), True), (1, (11, 4, 32), True)]
