"""`usage.prompt_tokens_details.cached_tokens`: the prompt tokens a request found in the prefix cache,
carried on every output of the request, the last one (after its blocks are freed) included."""
from __future__ import annotations

from atom_aot.runtime.sampling_params import SamplingParams
from engine_factories import BLOCK_SIZE, make_core, run_to_end


def _cached_tokens_of(core, prompt: list[int], request_id: str) -> list[int]:
    core.add_request(prompt, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), request_id=request_id)
    return [out.num_cached_tokens for out in run_to_end(core) if out.request_id == request_id]


def test_a_repeated_prompt_reports_its_cached_blocks_on_every_output():
    core = make_core(64)
    prompt = list(range(100, 100 + 5 * BLOCK_SIZE + 1))
    assert _cached_tokens_of(core, prompt, "first") == [0, 0, 0]
    # every full block but the one the last prompt token needs computed again
    assert _cached_tokens_of(core, prompt, "again") == [5 * BLOCK_SIZE] * 3


def test_no_prefix_caching_reports_zero():
    core = make_core(64, enable_prefix_caching=False)
    prompt = list(range(100, 100 + 5 * BLOCK_SIZE + 1))
    _cached_tokens_of(core, prompt, "first")
    assert _cached_tokens_of(core, prompt, "again") == [0, 0, 0]
