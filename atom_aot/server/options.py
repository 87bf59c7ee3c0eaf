"""What the server (not the engine) lets an operator choose: request limits, the engine's queue
bound, and how long shutdown and a stalled stream may take. Each field is a `serve` flag; a
request over a limit is refused with a message that names the flag raising it."""
from __future__ import annotations

from dataclasses import dataclass, fields

from atom_aot.config_flags import flag


@dataclass(frozen=True)
class ServerOptions:
    max_prompts_per_request: int = flag(256, "--max-prompts-per-request",
                                        help="prompts one /v1/completions request may carry")
    max_n: int = flag(128, "--max-n", help="choices (n) one request may ask for")
    max_seqs_per_request: int = flag(1024, "--max-seqs-per-request",
                                     help="sequences one request may start (prompts x n)")
    max_queued_seqs: int = flag(4096, "--max-queued-seqs", help="sequences the engine holds (running and "
                                "waiting); a request that would go over is answered 429 with Retry-After")
    shutdown_timeout: float = flag(30.0, "--shutdown-timeout", help="seconds in-flight requests get to finish "
                                   "after SIGTERM/SIGINT; then they are answered with an error")
    stalled_stream_timeout: float = flag(30.0, "--stalled-stream-timeout", help="seconds a client may leave its "
                                         "output unread before its requests are aborted")
    enable_auto_tool_choice: bool = flag(False, "--enable-auto-tool-choice", help="let the model decide to call "
                                         "tools (tool_choice 'auto', the default when a request has tools); needs "
                                         "--tool-call-parser")
    tool_call_parser: str | None = flag(None, "--tool-call-parser", choices=("hermes", "llama3_json"),
                                        help="how tool calls are read from the model's text: hermes "
                                        "(<tool_call>{json}</tool_call>: Qwen2.5/Qwen3, Hermes) or llama3_json "
                                        "({\"name\": ..., \"parameters\": ...}: Llama 3.x)")

    def __post_init__(self):
        for name in ("max_prompts_per_request", "max_n", "max_seqs_per_request", "max_queued_seqs"):
            value = getattr(self, name)
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name,
                     f"must be an integer >= 1, got {value!r}")
        for name in ("shutdown_timeout", "stalled_stream_timeout"):
            value = getattr(self, name)
            _require(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0, name,
                     f"must be a number of seconds > 0, got {value!r}")
        _require(not self.enable_auto_tool_choice or self.tool_call_parser is not None, "enable_auto_tool_choice",
                 "needs --tool-call-parser (hermes or llama3_json): it says how to read the calls")
        _require(self.max_seqs_per_request <= self.max_queued_seqs, "max_seqs_per_request",
                 f"({self.max_seqs_per_request}) must not exceed max_queued_seqs ({self.max_queued_seqs}): "
                 f"such a request could never be queued")


def flag_of(name: str) -> str:
    """The command-line spelling of option `name` (what a refusal tells the operator to raise)."""
    option = next(f for f in fields(ServerOptions) if f.name == name)
    return option.metadata["cli"]["flags"][0]


def _require(ok: bool, name: str, problem: str) -> None:
    if not ok:
        raise ValueError(f"{flag_of(name)} {problem}")
