"""MTP speculative decoding on a tiny random DeepSeek-V3 (one MTP layer): greedy outputs token for
token equal to decoding without speculation for K = 1, 2, 3; the proposer's drafts equal an eager
computation of the MTP layer (and transformers' modules for the first); acceptance statistics;
preemption and prefix caching; sampled tokens that follow the target's distribution; refusals of
artifacts that cannot serve it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from atom_aot import LLMEngine, SamplingParams
from atom_aot.artifact.kv_cache import KVCacheSpec
from atom_aot.artifact.phase import Phase
from atom_aot.errors import StartupError
from atom_aot.models.registry import kv_cache_layout
from atom_aot.runtime.execution.kv_cache import allocate_kv_cache
from atom_aot.runtime.spec.mtp_graphs import MTPGraphs
from atom_aot.runtime.spec.setup import check_mtp
from deepseek_factories import TINY_DEEPSEEK, make_copying_deepseek, make_tiny_deepseek, mtp_reference
from engine_factories import poison_kv_cache
from factories import random_prompts
from test_deepseek import loaded_model, one_sequence_step
from test_spec_engine import tokens

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_deepseek(tmp_path_factory.mktemp("models") / "tiny-deepseek-mtp", seed=11)


@pytest.fixture(scope="module")
def artifact(model_dir, build_artifact) -> str:
    return str(build_artifact(model_dir, compile="none"))


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(4, 380, seed=41, lengths=(5, 30))


@pytest.fixture(scope="module")
def baseline(artifact):
    return LLMEngine(artifact)


def mtp_engine(artifact, k: int, **options) -> LLMEngine:
    return LLMEngine(artifact, method="mtp", num_speculative_tokens=k, **options)


def recorded_drafts(engine) -> list[tuple[list[int], list[int], torch.Tensor]]:
    """Every (known tokens, drafts, the MTP layer's cache rows [computed, latent] of the sequence)
    the engine's MTP proposer returns, from now on."""
    proposer, seen = engine.core.runner.proposer, []
    propose, layer = proposer.propose, engine.loaded.model_config.num_hidden_layers

    def recording(seqs, limits):
        drafts = propose(seqs, limits)
        for seq, d in zip(seqs, drafts):
            rows = proposer.kv_cache[layer, 0, seq.block_table].flatten(0, 2)[:seq.num_computed_tokens].clone()
            seen.append((list(seq.token_ids), list(d), rows))
        return drafts
    proposer.propose = recording
    return seen


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_outputs_equal_decoding_without_speculation(artifact, baseline, prompts, k):
    engine = mtp_engine(artifact, k)
    assert tokens(engine, prompts, GREEDY) == tokens(baseline, prompts, GREEDY)
    stats = engine.print_mtp_statistics()
    assert stats["method"] == "mtp" and stats["num_speculative_tokens"] == k
    assert stats["proposed_total"] > 0 and len(stats["acceptance_per_position"]) == k
    assert 1 <= stats["mean_accepted_length"] <= k + 1


def test_drafts_equal_the_mtp_layer_run_eagerly(artifact, model_dir):
    """After the prefill of a prompt of P tokens and its target token t_P: the first draft is the
    argmax of the MTP layer at position P - 1 (target hidden h_{P-1}, token t_P), here and by
    transformers' modules; the second chains the layer at position P on its own output and draft."""
    prompt = random_prompts(1, 380, seed=43, lengths=(21, 21))[0]
    engine = mtp_engine(artifact, 2)
    seen = recorded_drafts(engine)
    engine.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    known, drafts, _ = seen[0]
    assert known[:-1] == prompt and len(drafts) == 2
    n = len(prompt)
    cfg, model = loaded_model(model_dir)
    kv = allocate_kv_cache(KVCacheSpec("float32", kv_cache_layout(cfg)), 4, 16, torch.device("cpu"))
    with torch.no_grad():
        hidden = model.hidden_states(one_sequence_step(prompt, torch.arange(n), kv))              # [P, hidden]
        logits, mtp_hidden = model.mtp_logits(hidden, one_sequence_step(known[1:], torch.arange(n), kv))
        first = int(logits[-1].argmax())
        chained, _ = model.mtp_logits(mtp_hidden[-1:], one_sequence_step([first], torch.tensor([n]), kv))
    assert drafts == [first, int(chained[-1].argmax())]
    assert first == int(mtp_reference(model_dir, known)[-1].argmax())


def eager_drafts(model, cfg, known: list[int], k: int) -> tuple[list[int], torch.Tensor]:
    """The drafts after `known` computed from scratch: the target over known[:-1], the MTP layer over
    every position with the next tokens, then chained k - 1 times on its own output; and the MTP
    layer's cache rows [len(known) - 1, latent] of the computed positions."""
    n = len(known) - 1
    kv = allocate_kv_cache(KVCacheSpec("float32", kv_cache_layout(cfg)), 8, 16, torch.device("cpu"))
    with torch.no_grad():
        hidden = model.hidden_states(one_sequence_step(known[:-1], torch.arange(n), kv))         # [n, hidden]
        logits, mtp_hidden = model.mtp_logits(hidden, one_sequence_step(known[1:], torch.arange(n), kv))
        cache = kv[cfg.num_hidden_layers, 0].flatten(0, 2)[:n].clone()                           # [n, latent]
        drafts = [int(logits[-1].argmax())]
        for step in range(1, k):
            logits, mtp_hidden = model.mtp_logits(mtp_hidden[-1:], one_sequence_step(
                drafts[-1:], torch.tensor([n - 1 + step]), kv))
            drafts.append(int(logits[-1].argmax()))
    return drafts, cache


@pytest.fixture(scope="module")
def copying(tmp_path_factory, build_artifact):
    model_dir = make_copying_deepseek(tmp_path_factory.mktemp("models") / "copying-deepseek")
    return model_dir, str(build_artifact(model_dir, compile="none"))


def with_mtp_graphs(engine, sizes=(1, 2, 4)) -> None:
    """The engine's MTP step through MTPGraphs (runtime/spec/mtp_graphs.py) replayed as plain calls: steps of up to 4
    rows padded to a capture size, larger ones through the package as it is."""
    proposer, loaded = engine.core.runner.proposer, engine.loaded
    graphs = MTPGraphs(proposer.mtp, proposer.kv_cache, sizes, -(-engine.core.scheduler.config.max_model_len //
                                                                  loaded.block_size),
                       loaded.model_config.hidden_size, loaded.dtype)
    graphs.capture(record=lambda call: call)
    proposer.mtp = graphs


@pytest.mark.parametrize("which,graphs", [("random", False), ("copying", False), ("random", True), ("copying", True)],
                         ids=["random", "copying", "random-mtp-graphs", "copying-mtp-graphs"])
def test_every_draft_and_the_mtp_cache_equal_a_computation_from_scratch(which, graphs, artifact, model_dir, copying,
                                                                          prompts):
    """Batched, over many steps, with drafts rejected (random weights) or accepted (the copying model,
    runs of K + 1 tokens): the MTP layer's cache rows of every computed position (caught up after
    each step, chained positions overwritten) and its drafts equal a from-scratch computation; the
    same with the MTP step staged through its graphs (padding rows write nothing)."""
    model_dir, artifact = copying if which == "copying" else (model_dir, artifact)
    engine = mtp_engine(artifact, 3)
    if graphs:
        with_mtp_graphs(engine)
    seen = recorded_drafts(engine)
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    stats = engine.print_mtp_statistics()
    assert stats["acceptance_rate"] > 0.9 if which == "copying" else stats["acceptance_rate"] < 0.2
    cfg, model = loaded_model(model_dir)
    assert len(seen) >= 12
    for known, drafts, cache in [s for s in seen if s[1]]:          # none at max_tokens
        expected, expected_cache = eager_drafts(model, cfg, known, len(drafts))
        assert drafts == expected
        torch.testing.assert_close(cache, expected_cache, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("poisoned", [False, True], ids=["as-allocated", "cache-starts-nan"])
def test_preemption_and_prefix_caching(artifact, baseline, poisoned, monkeypatch):
    """Greedy equal with preemption and prefix hits. The decode rows of a batch read each other's context lengths
    of latents: with the cache starting as NaN, a key past a sequence's own context that the op let through (a
    zero probability times NaN) turned that request's tokens to 0, in about half the processes when it depended on
    what the allocator handed back."""
    if poisoned:
        poison_kv_cache(monkeypatch)
    shared = random_prompts(1, 380, seed=45, lengths=(40, 40))[0]
    prompts = [shared + p for p in random_prompts(6, 380, seed=46, lengths=(4, 10))]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = tokens(baseline, prompts, params)
    engine = mtp_engine(artifact, 2, num_kv_blocks=14, max_model_len=96)
    assert tokens(engine, prompts, params) == expected
    assert engine.core.scheduler.num_preemptions > 0
    assert tokens(engine, prompts[:2], params) == expected[:2]             # again, from the prefix cache
    assert engine.core.block_manager.prefix_hits > 0


def test_stops_inside_a_run(artifact, baseline, prompts):
    first = baseline.generate(prompts[:1], GREEDY)[0]
    engine = mtp_engine(artifact, 3)
    for params in (SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                   SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[first["token_ids"][6]])):
        assert tokens(engine, prompts, params) == tokens(baseline, prompts, params)


class TestRefusals:
    @staticmethod
    def loaded(layers: int, forwards: dict, architecture: str = "DeepseekV3ForCausalLM",
               declared: int | None = None):
        """`layers` the artifact holds, of `declared` (default: as many) that its config.json counts."""
        model = SimpleNamespace(name="tiny-deepseek", architecture=architecture)
        manifest = SimpleNamespace(model=model, rebuild_command=lambda: "atom-build tiny-deepseek --compile aoti",
                                   layout=SimpleNamespace(world_size=1))
        hf_config = {**TINY_DEEPSEEK, "architectures": [model.architecture], "vocab_size": 64,
                     "num_nextn_predict_layers": layers if declared is None else declared}
        return SimpleNamespace(hf_config=hf_config, model_config=SimpleNamespace(num_nextn_predict_layers=layers),
                               manifest=manifest, path="m.atom", forwards=forwards)

    def test_a_model_without_mtp_layers(self):
        with pytest.raises(StartupError, match=r"--method mtp needs a model with MTP layers.*has none"):
            check_mtp(self.loaded(0, {Phase.MIXED: object()}))

    def test_a_family_whose_mtp_layers_are_not_built(self):
        with pytest.raises(StartupError, match=r"\(Glm4MoeForCausalLM\) is served without the 1 MTP layer\(s\) of its "
                                               r"checkpoint: atom-aot does not build the MTP layers of Glm4MoeForCausalLM"):
            check_mtp(self.loaded(1, {Phase.MIXED: object()}, architecture="Glm4MoeForCausalLM"))

    def test_an_artifact_built_without_its_mtp_layers(self):
        """tests/test_deepseek_without_mtp.py builds one from a checkpoint as transformers saves it."""
        with pytest.raises(StartupError, match=r"m\.atom \(tiny-deepseek\) was built without them.*"
                                               r"num_nextn_predict_layers=1.*has no MTP tensors.*--method ngram"):
            check_mtp(self.loaded(0, {Phase.MIXED: object()}, declared=1))

    def test_an_artifact_without_the_mtp_package(self):
        with pytest.raises(StartupError, match=r"no `mtp` package.*Rebuild it with: atom-build tiny-deepseek"):
            check_mtp(self.loaded(1, {Phase.MIXED: object()}))

    def test_a_mixed_package_without_hidden_states(self):
        old = SimpleNamespace(returns_hidden=False)
        with pytest.raises(StartupError, match=r"does not return the hidden states.*Rebuild it with"):
            check_mtp(self.loaded(1, {Phase.MIXED: old, Phase.MTP: object()}))


def test_accepted_runs_stop_where_decoding_without_speculation_does(copying, prompts):
    """The copying model accepts every draft: runs of K + 1 tokens, cut by max_tokens inside a run."""
    _, artifact = copying
    baseline = LLMEngine(artifact)
    engine = mtp_engine(artifact, 3)
    for max_tokens in (7, 14):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        assert tokens(engine, prompts, params) == tokens(baseline, prompts, params)
    assert engine.print_mtp_statistics()["mean_accepted_length"] > 3


def test_compiled_packages(model_dir, build_artifact, artifact, prompts):
    """The AOTInductor build: the mixed package also returns the hidden states (LogitsAndHidden), the
    `mtp` package proposes, and greedy outputs equal the eager artifact's without speculation."""
    from atom_aot.runtime.loading.compiled import CompiledModel, CompiledMTP
    compiled = str(build_artifact(model_dir, compile="aoti"))
    engine = mtp_engine(compiled, 2)
    mixed = engine.loaded.forwards[Phase.MIXED]
    assert isinstance(mixed, CompiledModel) and mixed.returns_hidden
    assert isinstance(engine.loaded.forwards[Phase.MTP], CompiledMTP)
    seen = recorded_drafts(engine)
    assert tokens(engine, prompts, GREEDY) == tokens(LLMEngine(artifact), prompts, GREEDY)
    assert tokens(LLMEngine(compiled), prompts[:2], GREEDY) == tokens(LLMEngine(artifact), prompts[:2], GREEDY)
    cfg, model = loaded_model(model_dir)
    for known, drafts, _ in [s for s in seen if s[1]][:6]:
        assert drafts == eager_drafts(model, cfg, known, len(drafts))[0]


def test_sampled_tokens_follow_the_targets_distribution(copying, prompts):
    """MTP drafts of sampled requests (top-k 2 at temperature 3, the copying model: its draft is often the
    likelier of the two, so drafts are accepted and rejected): the token after the first, conditioned on
    the commonest first, against the target's exact top-2 probabilities at that temperature."""
    from test_spec_rejection import chi_square_p_value
    _, artifact = copying
    baseline, engine = LLMEngine(artifact), mtp_engine(artifact, 1)
    prompt, temperature = prompts[0], 3.0
    outs = engine.generate([prompt] * 240, [SamplingParams(top_k=2, temperature=temperature, max_tokens=3, seed=s)
                                            for s in range(240)])
    firsts = [o["token_ids"][0] for o in outs]
    first = max(set(firsts), key=firsts.count)
    seconds = [o["token_ids"][1] for o in outs if o["token_ids"][0] == first]
    exact = baseline.add_request([prompt + [first]], SamplingParams(temperature=0, max_tokens=1, logprobs=2))
    top = next(u for _ in range(20) for u in baseline.step() if u.request_id == exact[0]).logprobs[0].top
    probs = (torch.tensor([lp for _, lp in top]) / temperature).softmax(dim=0)
    counts = torch.tensor([float(seconds.count(token)) for token, _ in top])
    assert counts.sum() == len(seconds) >= 60
    assert chi_square_p_value(counts, probs) > 1e-3
    assert 0 < engine.print_mtp_statistics()["acceptance_rate"] < 1


def test_each_mtp_position_is_a_decode_row_of_its_own():
    """The MTP layer's step feeds the decode package, one query row per sequence: a sequence's positions become
    rows of their own, each with its sequence's block table and the context up to itself (runtime/spec/verify_rows.py)."""
    from atom_aot.runtime.spec.mtp import MTPProposer
    proposer = MTPProposer(None, None, torch.zeros(1, 2, 4, 16, 1, 8), 16, torch.device("cpu"), 2)
    seqs = [SimpleNamespace(block_table=[3, 5]), SimpleNamespace(block_table=[7])]
    inputs, last_rows = proposer._inputs(seqs, [17, 4], [[11, 12, 13], [21]])
    assert inputs.input_ids.tolist() == [11, 12, 13, 21] and last_rows.tolist() == [2, 3]
    assert inputs.positions.tolist() == [17, 18, 19, 4] and inputs.seq_lens.tolist() == [18, 19, 20, 5]
    assert inputs.query_start_loc.tolist() == [0, 1, 2, 3, 4] and inputs.logits_indices.tolist() == [0, 1, 2, 3]
    assert inputs.block_tables.tolist() == [[3, 5], [3, 5], [3, 5], [7, 0]]
    assert inputs.slot_mapping.tolist() == [5 * 16 + 1, 5 * 16 + 2, 5 * 16 + 3, 7 * 16 + 4]
