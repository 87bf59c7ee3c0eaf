"""Grammar compiles off the engine loop (runtime/sampling/grammar_compiler.py), through the real worker processes: a
compile over its time limit refuses its request and its worker is replaced; errors are in our words; compiled
grammars are cached by spec; and an engine keeps decoding while a request's grammar compiles."""
from __future__ import annotations

import asyncio
import time

import pytest
from factories import make_tokenizer
from test_engine_messages import Loopback, request

from atom_aot.errors import RequestError
from atom_aot.runtime.processes.messages import Added, AddRequests, Call, Failure, Reply, decode, encode
from atom_aot.runtime.sampling import structured_output
from atom_aot.runtime.sampling.grammar_errors import compile_error_message
from atom_aot.runtime.sampling.structured_output import Grammars
from atom_aot.runtime.sampling_params import GrammarSpec, SamplingParams

LIMIT_S = 0.25
# 5,000 choices sharing a long prefix: seconds to compile on any vocabulary (5 s on a busy 2-core host)
SLOW = GrammarSpec("choice", choices=tuple("p" * 50 + str(i) for i in range(5000)))


@pytest.fixture(scope="module")
def grammars(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer = make_tokenizer(folder)
    grammars = Grammars(folder, len(tokenizer), frozenset({tokenizer.eos_token_id}), LIMIT_S, compile_workers=1)
    yield grammars
    grammars.close()


def test_a_compile_over_its_limit_refuses_its_request_and_the_next_compile_gets_a_fresh_worker(grammars):
    grammars.compiled(GrammarSpec("regex", "[0-9]{2}"))          # the worker is up: the limit is all that counts
    start = time.perf_counter()
    with pytest.raises(RequestError, match=r"did not compile within 0.25 s \(--grammar-compile-timeout\)"):
        grammars.compiled(SLOW)
    assert time.perf_counter() - start < 1.5 and grammars.pool.num_timeouts == 1
    assert grammars.compiled(GrammarSpec("regex", "[a-c]{3}")) is not None


@pytest.mark.parametrize("spec, reason", [
    (GrammarSpec("regex", "(("), "the regex of this request's structured output does not compile: Regex parsing "
                                 "error at position 3: The parenthesis is not closed."),
    (GrammarSpec("json_schema", '{"type": "foo"}'), 'the JSON schema of this request\'s structured output does '
                                                    'not compile: Unsupported type "foo"'),
    (GrammarSpec("json_schema", "not json"), "the JSON schema of this request's structured output does not "
                                             "compile: Failed to parse JSON: syntax error at line 1 near: ot json."),
    (GrammarSpec("ebnf", "root ::= foo"), "the grammar of this request's structured output does not compile: EBNF "
                                          "parser error at line 1, column 10: Rule \"foo\" is not defined"),
])
def test_errors_say_what_is_wrong_without_the_librarys_source_paths(grammars, spec, reason):
    with pytest.raises(RequestError) as error:
        grammars.compiled(spec)
    assert str(error.value) == reason and ".cc" not in reason


def test_error_messages_drop_source_locations_checks_and_echoes():
    raw = RuntimeError("[03:10:52] /project/cpp/json_schema_converter.cc:936: Check failed: (error.empty()) is "
                       "false: Failed to parse JSON: bad. The JSON string is:" + "x" * 10000 + "\nmore")
    assert compile_error_message("json_schema", raw) == ("the JSON schema of this request's structured output does "
                                                         "not compile: Failed to parse JSON: bad.")
    assert compile_error_message("regex", RecursionError()).endswith("does not compile: it nests too deeply")


def test_a_repeated_spec_compiles_once_and_the_least_recent_is_dropped(grammars, monkeypatch):
    monkeypatch.setattr(structured_output, "CACHE_ENTRIES", 2)
    first, second, third = (GrammarSpec("regex", f"[0-9]{{{n}}}x") for n in (5, 6, 7))
    pending = grammars.request(first)
    assert grammars.request(first) is pending                    # asked again while compiling: one compile
    compiled = pending.result()
    hits = grammars.cache_hits
    again = grammars.request(first)
    assert again.done() and again.result() is compiled and grammars.cache_hits == hits + 1
    grammars.compiled(second)
    grammars.compiled(third)                                     # first is the least recently used: dropped
    assert grammars.compiled(first) is not compiled and grammars.cache_hits == hits + 1     # compiled anew
    assert grammars.request(third).done() and grammars.cache_hits == hits + 2


@pytest.fixture(scope="module")
def engine(tiny_llama_eager_artifact):
    from atom_aot import LLMEngine
    engine = LLMEngine(str(tiny_llama_eager_artifact), grammar_compile_timeout=LIMIT_S, grammar_compile_workers=1)
    yield engine
    engine.close()


def test_the_engine_decodes_others_while_a_grammar_compiles_and_refuses_it_at_the_limit(engine):
    core = engine.core
    core.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), request_id="free")
    told: list = []
    core.add_request([8, 9], SamplingParams(max_tokens=4, grammar=SLOW), request_id="slow", on_admitted=told.append)
    tokens_while_compiling, first_grammar_step = 0, None
    while core.has_unfinished():
        outputs = core.step()
        tokens_while_compiling += sum(len(o.new_token_ids) for o in outputs if o.request_id == "free" and not told)
        assert all(o.request_id == "free" for o in outputs)      # the refused request never ran
    assert tokens_while_compiling >= 1
    [error] = told
    assert "did not compile within 0.25 s (--grammar-compile-timeout)" in error
    assert not core.scheduler.has_unfinished() and core.block_manager.num_free_blocks == core.block_manager.num_blocks
    core.add_request([8, 9], SamplingParams(max_tokens=4, grammar=SLOW), request_id="gone", on_admitted=told.append)
    assert core.has_unfinished()
    core.abort("gone")                                           # the client left while its grammar compiled
    assert told[1] == "the request was aborted while its grammar compiled" and not core.has_unfinished()


def test_an_offline_request_whose_grammar_fails_is_refused_before_it_is_queued(engine):
    with pytest.raises(RequestError, match="the regex of this request's structured output does not compile"):
        engine.generate(["a", "b"], SamplingParams(max_tokens=3, grammar=GrammarSpec("regex", "((")))
    assert engine.is_finished()


@pytest.fixture
def loopback():
    loopback = Loopback()
    yield loopback
    asyncio.run(loopback.close())


def test_the_engine_loop_answers_an_add_once_its_requests_grammars_compiled(loopback):
    """The reply to AddRequests waits for every request's grammar (the loop steps meanwhile); one that does not
    compile refuses the call and aborts the call's requests already queued."""
    told = {}
    loopback.core.add_checked = lambda prompt, params, request_id, arrival_time, on_admitted: told.update(
        {request_id: on_admitted})

    def call(call_id: int, *ids: str) -> None:
        loopback.loop._handle(decode(encode(Call(call_id, AddRequests([request(i, 2) for i in ids])))))

    def replies() -> list:
        sent, loopback.outbox.sent = loopback.outbox.sent, []
        return [decode(data) for data in sent]

    call(0, "a", "b")
    told["a"](None)
    assert replies() == []                                       # b's grammar is still compiling
    told["b"](None)
    assert replies() == [Reply(0, result=Added(2))]
    call(1, "c", "d")
    told["c"](None)
    told["d"]("the regex of this request's structured output does not compile: no")
    assert replies() == [Reply(1, failure=Failure("the regex of this request's structured output does not "
                                                  "compile: no", rejected=True))]
    assert loopback.core.aborted == [("c", "abort")]
