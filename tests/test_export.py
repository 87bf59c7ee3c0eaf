"""torch.export of the model with StepInputs: the dynamic dimensions come from the signature by
name, and the exported program (what AOTInductor compiles) equals the module on other sizes."""
import pytest
import torch
from torch.utils._pytree import treespec_dumps

from model_factories import mixed_step, tiny_model

from atom_aot.artifact.phase import Phase
from atom_aot.artifact.signature import INPUT_NAMES
from atom_aot.build.export import export_model
from atom_aot.models.step_inputs import SERIALIZED_NAME
from atom_aot.runtime.loading.compiled import input_type_names

BLOCK_SIZE = 16


def symbols(exported) -> dict[str, list[str]]:
    """Input name -> its sizes as the exported graph sees them (symbols for dynamic dims)."""
    placeholders = {n.name: n for n in exported.graph.nodes if n.op == "placeholder"}
    names = exported.graph_signature.user_inputs
    return {name.removeprefix("inputs_"): [str(s) for s in placeholders[name].meta["val"].shape] for name in names}


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_mixed_phase_keeps_every_dimension_of_the_signature_dynamic(model):
    exported = export_model(model, torch.float32, BLOCK_SIZE, 128, torch.device("cpu"), Phase.MIXED)
    sizes = symbols(exported)
    assert list(sizes) == list(INPUT_NAMES)                       # flattened in field order
    assert sizes["input_ids"] == sizes["positions"] == sizes["slot_mapping"]
    tokens, seqs, logits = sizes["input_ids"][0], sizes["seq_lens"][0], sizes["logits_indices"][0]
    assert len({tokens, seqs, logits}) == 3 and not tokens.isdigit()
    assert sizes["block_tables"][0] == seqs and sizes["query_start_loc"] == [f"{seqs} + 1"]
    assert not sizes["kv_cache"][2].isdigit() and sizes["kv_cache"][3] == str(BLOCK_SIZE)
    # what the runtime checks before it calls a package (AOTInductor stores the spec dumped like this)
    assert input_type_names(treespec_dumps(exported.call_spec.in_spec)) == (SERIALIZED_NAME,)


def test_decode_phase_ties_tokens_and_logits_rows_to_sequences(model):
    exported = export_model(model, torch.float32, BLOCK_SIZE, 128, torch.device("cpu"), Phase.DECODE)
    sizes = symbols(exported)
    seqs = sizes["seq_lens"][0]
    assert sizes["input_ids"] == sizes["logits_indices"] == sizes["block_tables"][:1] == [seqs]


def test_exported_program_equals_the_module_on_other_sizes(model):
    exported = export_model(model, torch.float32, BLOCK_SIZE, 128, torch.device("cpu"), Phase.MIXED)
    step = mixed_step(model)
    one_seq = step._replace(input_ids=step.input_ids[:5], positions=step.positions[:5],
                            slot_mapping=step.slot_mapping[:5], block_tables=step.block_tables[:1, :2],
                            seq_lens=step.seq_lens[:1], query_start_loc=step.query_start_loc[:2],
                            logits_indices=torch.tensor([2, 3, 4]))
    with torch.no_grad():
        want = model(one_seq._replace(kv_cache=one_seq.kv_cache.clone()))
        got = exported.module()(one_seq)
    assert got.shape == (3, 64) and torch.allclose(got, want, atol=1e-6)
