"""The activation memory the engine keeps free beside the KV cache: measured at build (graphs.json step_memory),
scaled by the engine's own budgets, else a bound; and the probe's largest mixed step, run here on the CPU."""
import json
from types import SimpleNamespace

import pytest
import torch

from atom_aot.artifact.graph_plan import GraphPlan, StepMemory
from atom_aot.errors import ArtifactError
from atom_aot.runtime.config import RuntimeConfig, max_scored_prompt_rows
from atom_aot.runtime.execution.memory import (RESERVE_SLACK_BYTES, activation_bound, activation_reserve, measured_reserve)

MEASURED = StepMemory(bytes_per_token=90_000, bytes_per_logits_row=4_000_000, tokens=8192, rows=256)


class TestPlan:
    def test_step_memory_survives_json(self):
        plan = GraphPlan((1, 2, 4), 12345, "measured", MEASURED)
        assert GraphPlan.from_json(plan.to_json()) == plan

    def test_an_artifact_built_before_the_measurement_reads_as_unmeasured(self):
        old = json.dumps({"capture_sizes": [1, 2], "pool_bytes": 10, "note": "measured"})
        assert GraphPlan.from_json(old).step_memory is None

    @pytest.mark.parametrize("bad", [{"bytes_per_token": -1}, {"rows": 0}, {"tokens": "8192"}])
    def test_a_malformed_measurement_is_refused_by_name(self, bad):
        raw = json.loads(GraphPlan((1,), 10, "m", MEASURED).to_json())
        raw["step_memory"].update(bad)
        with pytest.raises(ArtifactError, match="step_memory"):
            GraphPlan.from_json(json.dumps(raw))


def loaded_with(step_memory, vocab_size=128_256, hidden_size=4096, intermediate_size=14336):
    config = SimpleNamespace(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size)
    return SimpleNamespace(graph_plan=GraphPlan((1,), 0, "m", step_memory), model_config=config)


class TestReserve:
    def test_measured_scales_with_the_engines_budgets(self):
        config = RuntimeConfig(max_num_batched_tokens=4096, max_num_seqs=128)
        expected = (max(4096 * MEASURED.bytes_per_token, 128 * MEASURED.bytes_per_logits_row)
                    + max_scored_prompt_rows(128) * 128_256 * 4 + RESERVE_SLACK_BYTES)
        assert measured_reserve(MEASURED, config, 128_256) == expected
        assert activation_reserve(loaded_with(MEASURED), config) == expected

    def test_speculation_samples_a_row_per_draft_token_too(self):
        plain = RuntimeConfig(max_num_batched_tokens=256, max_num_seqs=64)
        speculating = RuntimeConfig(max_num_batched_tokens=256, max_num_seqs=64, method="ngram",
                                    num_speculative_tokens=3)
        rows_part = measured_reserve(MEASURED, speculating, 1000) - measured_reserve(MEASURED, plain, 1000)
        assert rows_part == 3 * 64 * MEASURED.bytes_per_logits_row      # the sampler's part is the larger in both

    def test_without_a_measurement_every_token_is_as_wide_as_the_vocabulary(self):
        config = RuntimeConfig(max_num_batched_tokens=8192)
        loaded = loaded_with(None)
        assert activation_reserve(loaded, config) == activation_bound(loaded, config) == \
            8192 * 128_256 * 4 + RESERVE_SLACK_BYTES

    def test_the_measured_reserve_of_a_llama_shape_is_below_the_bound(self):
        # the bound counted logits for every token of the step; logits are computed for sampled rows only
        config = RuntimeConfig().for_target("sm90")      # a GPU's default step budget
        assert activation_reserve(loaded_with(MEASURED), config) < activation_bound(loaded_with(None), config)


class TestProbeInputs:
    def test_the_largest_mixed_step_is_the_same_prompts_one_by_one(self, tiny_llama_artifact):
        """prefill_step_inputs: S prompts of L tokens in one step give each prompt's logits of its last token,
        as the same prompt alone does (its own cache blocks, its own positions)."""
        from atom_aot.artifact.phase import Phase
        from atom_aot.entrypoints.graph_probe import prefill_step_inputs
        from atom_aot.runtime.execution.kv_cache import allocate_kv_cache
        from atom_aot.runtime.loading.loader import load_artifact
        loaded = load_artifact(tiny_llama_artifact)
        mixed = loaded.forwards[Phase.MIXED]
        block_size, vocab = loaded.block_size, loaded.model_config.vocab_size
        torch.manual_seed(0)
        kv_cache = allocate_kv_cache(loaded.kv_cache, 16, block_size, loaded.device)
        inputs = prefill_step_inputs(3 * 24, 24, kv_cache, block_size, vocab)
        assert inputs.seq_lens.tolist() == [24] * 3 and inputs.logits_indices.tolist() == [23, 47, 71]
        batched = mixed(inputs).clone()
        assert batched.shape == (3, vocab)
        for i in range(3):
            alone = inputs._replace(
                input_ids=inputs.input_ids[24 * i:24 * (i + 1)], positions=inputs.positions[:24],
                slot_mapping=inputs.slot_mapping[:24], block_tables=inputs.block_tables[:1],
                seq_lens=inputs.seq_lens[:1], query_start_loc=inputs.query_start_loc[:2],
                logits_indices=inputs.logits_indices[:1])
            torch.testing.assert_close(mixed(alone)[0], batched[i], rtol=1e-4, atol=1e-4)

    def test_the_measurement_runs_the_step_and_the_sampler(self, tiny_llama_artifact):
        """measure_step_memory's calls, on the CPU with a stand-in for the CUDA allocator's statistics: the mixed
        step over MEASURED_STEP_TOKENS (prompts cut to max_model_len) and the sampler with every option."""
        from atom_aot.artifact.phase import Phase
        from atom_aot.entrypoints import graph_probe
        from atom_aot.runtime.loading.loader import load_artifact
        loaded = load_artifact(tiny_llama_artifact)
        ran = []

        def peak(run, device):
            out = run()
            ran.append(out)
            return 1000
        measured = graph_probe.measure_step_memory(loaded.forwards[Phase.MIXED], loaded.rank_config,
                                                   loaded.block_size, loaded.kv_cache, 512, 8, loaded.device, peak)
        step_logits, sampled = ran
        assert step_logits.shape == (graph_probe.MEASURED_STEP_TOKENS // 512, loaded.model_config.vocab_size)
        assert sampled.top_ids.shape == (8, graph_probe.MEASURED_SAMPLING["logprobs"])
        assert measured == StepMemory(1, 125, graph_probe.MEASURED_STEP_TOKENS, 8)
