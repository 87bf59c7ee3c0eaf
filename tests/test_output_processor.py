"""OutputProcessor: token ids -> streamed text, stop strings, finish reasons, timings. The one
output path of the offline engine and the server, fed here with CoreOutputs as the core makes
them (one token per step) and a real byte-level BPE tokenizer."""
from __future__ import annotations

import pytest
from factories import make_tokenizer

from atom_aot.runtime.outputs import CoreOutput
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.text.output_processor import OutputProcessor, RequestOutput

TEXT = "The quick brown fox jumps over the lazy dog."
PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from atom_aot.runtime.text.tokenizer import load_tokenizer
    folder = tmp_path_factory.mktemp("tokenizer")
    make_tokenizer(folder)
    return load_tokenizer(folder)


class Run:
    """One request through a processor; records what the core was asked to abort."""

    def __init__(self, tokenizer, stop: list[str], request_id: str = "r", **params):
        self.aborted: list[list[str]] = []
        self.processor = OutputProcessor(tokenizer, abort_in_core=self.aborted.append)
        self.request_id = request_id
        self.processor.add_request(request_id, PROMPT, SamplingParams(stop_strings=stop, **params))

    def feed(self, token_ids: list[int], last_reason: str | None = None,
             times: tuple[float, float, float] = (10.0, 10.5, 12.5), stop_token: bool = False) -> list[RequestOutput]:
        """One CoreOutput per token, the last one finished with `last_reason` (by its token, an EOS or a stop
        token, when `stop_token`); stops feeding once an update finishes (the core would have been told to
        abort)."""
        arrival, first, finish = times
        updates = []
        for i, token in enumerate(token_ids):
            last = i == len(token_ids) - 1
            out = CoreOutput(self.request_id, [token], finish_reason=last_reason if last else None,
                             stop_token_id=token if last and stop_token else None,
                             num_prompt_tokens=len(PROMPT), arrival_time=arrival, first_token_time=first,
                             finish_time=finish if last and last_reason else None)
            updates += self.processor.process([out])
            if updates and updates[-1].finished:
                break
        return updates


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def test_a_stop_string_over_several_tokens_ends_the_request_and_aborts_it_in_the_core(tokenizer):
    stop = "fox jumps"
    assert len(ids(tokenizer, " " + stop)) > 2          # the stop string spans several tokens
    run = Run(tokenizer, [stop])
    updates = run.feed(ids(tokenizer, TEXT))
    last = updates[-1]
    assert last.finished and last.finish_reason == "stop"
    assert last.text == "The quick brown "
    assert run.aborted == [["r"]]
    assert not run.processor.has_unfinished()


def test_streamed_text_never_shows_part_of_a_stop_string(tokenizer):
    run = Run(tokenizer, ["fox jumps", "lazy"])
    updates = run.feed(ids(tokenizer, TEXT))
    final = updates[-1].text
    assert final == "The quick brown "
    for update in updates:
        assert final.startswith(update.text), update.text      # nothing later taken back
    assert "".join(u.delta_text for u in updates) == final


def test_the_earliest_of_several_stop_strings_wins(tokenizer):
    run = Run(tokenizer, ["lazy", "brown"])
    assert run.feed(ids(tokenizer, TEXT))[-1].text == "The quick "


def test_a_stop_string_completed_by_the_last_allowed_token(tokenizer):
    """The core finished the request (max_tokens) on the token that completes the stop string: the
    text is trimmed and the reason is "stop"; the core has nothing left to abort."""
    tokens = ids(tokenizer, "Hello world! How are")
    run = Run(tokenizer, ["How are"])
    last = run.feed(tokens, last_reason="length")[-1]
    assert (last.finish_reason, last.text) == ("stop", "Hello world! ")
    assert run.aborted == []


def test_finish_reasons_of_the_core_pass_through_with_all_the_text(tokenizer):
    for reason in ("length", "stop"):
        run = Run(tokenizer, ["not in the text"])
        updates = run.feed(ids(tokenizer, TEXT), last_reason=reason)
        assert (updates[-1].finish_reason, updates[-1].text) == (reason, TEXT)
        assert all(u.finish_reason is None for u in updates[:-1])
        assert "".join(u.delta_text for u in updates) == TEXT     # the held-back tail comes out at the end
        assert run.aborted == []


@pytest.mark.parametrize("stop_strings", [[], ["not in the text"]], ids=["no-stop-strings", "stop-strings"])
@pytest.mark.parametrize("listed", [True, False], ids=["stop_token_ids", "eos"])
def test_the_token_that_stopped_a_request_leaves_its_text_and_stays_in_its_tokens(tokenizer, stop_strings, listed):
    """vLLM's rule: the EOS or stop token that finished a request is an output token but not output text (whatever
    skip_special_tokens says); a stop token from stop_token_ids is the stop_reason, an EOS none."""
    text_ids, stop = ids(tokenizer, TEXT), ids(tokenizer, " lazy")[0]
    params = {"stop_token_ids": [stop]} if listed else {}
    run = Run(tokenizer, stop_strings, skip_special_tokens=False, **params)
    updates = run.feed(text_ids + [stop], last_reason="stop", stop_token=True)
    last = updates[-1]
    assert (last.finish_reason, last.text, last.token_ids) == ("stop", TEXT, text_ids + [stop])
    assert "".join(u.delta_text for u in updates) == TEXT and last.num_tokens_output == len(text_ids) + 1
    assert last.stop_reason == (stop if listed else None)
    assert all(u.stop_reason is None for u in updates[:-1])


def test_include_stop_str_in_output_keeps_the_stop_tokens_text(tokenizer):
    text_ids, stop = ids(tokenizer, TEXT), ids(tokenizer, " lazy")[0]
    run = Run(tokenizer, [], stop_token_ids=[stop], include_stop_str_in_output=True)
    last = run.feed(text_ids + [stop], last_reason="stop", stop_token=True)[-1]
    assert last.text == TEXT + tokenizer.decode([stop]) and last.stop_reason == stop


def test_a_stop_string_is_the_stop_reason(tokenizer):
    last = Run(tokenizer, ["fox jumps", "lazy"]).feed(ids(tokenizer, TEXT))[-1]
    assert (last.finish_reason, last.stop_reason) == ("stop", "fox jumps")
    assert Run(tokenizer, []).feed(ids(tokenizer, TEXT), last_reason="length")[-1].stop_reason is None


def test_timings(tokenizer):
    tokens = ids(tokenizer, "Hello world! How")
    run = Run(tokenizer, [])
    updates = run.feed(tokens, last_reason="length", times=(10.0, 10.5, 12.5))
    assert all(u.ttft == pytest.approx(0.5) for u in updates)
    assert all(u.tpot is None and u.latency is None for u in updates[:-1])
    last = updates[-1]
    assert last.latency == pytest.approx(2.5)
    assert last.tpot == pytest.approx(2.0 / (len(tokens) - 1))
    assert (last.num_tokens_input, last.num_tokens_output) == (len(PROMPT), len(tokens))


def test_an_aborted_request_gets_no_more_updates(tokenizer):
    run = Run(tokenizer, [])
    run.processor.abort("r")
    assert run.feed(ids(tokenizer, "Hello")) == []


def test_the_stream_callback_sees_every_update(tokenizer):
    seen = []
    processor = OutputProcessor(tokenizer, abort_in_core=lambda request_ids: None)
    processor.add_request("r", PROMPT, SamplingParams(), callback=seen.append)
    tokens = ids(tokenizer, "Hello world")
    updates = processor.process([CoreOutput("r", [t]) for t in tokens])
    assert seen == updates and len(updates) == len(tokens)


def test_each_update_keeps_the_tokens_it_had(tokenizer):
    """Updates share the request's token list (copying it per update cost O(length)); each still
    reads only the tokens it had."""
    tokens = ids(tokenizer, "Hello world! How are you today?")
    updates = Run(tokenizer, []).feed(tokens, last_reason="length")
    assert [u.token_ids for u in updates] == [tokens[:i + 1] for i in range(len(tokens))]
    assert updates[-1].as_dict()["token_ids"] == tokens and updates[-1].num_tokens_output == len(tokens)


def test_stop_strings_are_held_until_min_tokens(tokenizer):
    """vLLM's rule: a stop string in the text of the first min_tokens tokens does not end the request;
    one completed after them does."""
    tokens = ids(tokenizer, TEXT)
    early = ids(tokenizer, "The quick")
    processor = OutputProcessor(tokenizer, abort_in_core=lambda ids_: None)
    processor.add_request("r", PROMPT, SamplingParams(stop_strings=["quick", "lazy"], min_tokens=len(early)))
    updates = [processor.process([CoreOutput("r", [t], num_prompt_tokens=len(PROMPT))])[0] for t in tokens
               if processor.has_unfinished()]
    last = updates[-1]
    assert last.finish_reason == "stop"
    assert last.text.startswith("The quick") and last.text.endswith(" the ") and "lazy" not in last.text
