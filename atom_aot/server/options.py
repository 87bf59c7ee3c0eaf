"""What the server (not the engine) lets an operator choose: request limits, the engine's queue
bound, and how long shutdown and a stalled stream may take. Each field is a `serve` flag; a
request over a limit is refused with a message that names the flag raising it."""
from __future__ import annotations

from dataclasses import dataclass, fields

from atom_aot.config_flags import flag


# the think-tag families (server/serving/reasoning_parsers.py) and GPT-OSS's harmony
REASONING_PARSERS = ("deepseek_r1", "qwen3", "glm45", "openai_gptoss")
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "deepseek_v3", "deepseek_v31", "glm45", "qwen3_coder", "openai")
GRAMMAR_LIMITS = ("max_json_schema_bytes", "max_json_schema_depth", "max_grammar_choices", "max_regex_length",
                  "max_grammar_length", "max_tools")


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
    tool_call_parser: str | None = flag(None, "--tool-call-parser", choices=TOOL_CALL_PARSERS,
                                        help="how tool calls are read from the model's text, as vLLM's parser of "
                                        "that name: hermes (<tool_call>{json}</tool_call>: Qwen2.5/Qwen3, Hermes), "
                                        "llama3_json ({\"name\": ..., \"parameters\": ...}: Llama 3.x), "
                                        "deepseek_v3 (DeepSeek-V3/R1's <｜tool▁call▁begin｜> calls with a json "
                                        "block), deepseek_v31 (DeepSeek-V3.1's), glm45 (GLM-4.5/4.6's "
                                        "<arg_key>/<arg_value> pairs), qwen3_coder (Qwen3-Coder's <function=...> "
                                        "<parameter=...>; glm45 and qwen3_coder type the values by the tool's "
                                        "schema) or openai (GPT-OSS's harmony messages to functions.NAME)")
    reasoning_parser: str | None = flag(None, "--reasoning-parser", choices=REASONING_PARSERS,
                                        help="return the model's reasoning apart from its answer, as the message's "
                                        "reasoning and reasoning_content, as vLLM's parser of that name: "
                                        "deepseek_r1 (DeepSeek-R1, QwQ: the text before </think>), qwen3 (Qwen3: "
                                        "likewise; enable_thinking false in chat_template_kwargs: all content), "
                                        "glm45 (GLM-4.5/4.6/4.7: likewise, <think> may open reasoning again) or "
                                        "openai_gptoss (GPT-OSS's harmony analysis channel)")

    trust_request_chat_template: bool = flag(False, "--trust-request-chat-template", help="let a chat request "
                                             "bring its own Jinja chat_template (vLLM's flag of the same name); "
                                             "without it such a request is refused")
    max_json_depth: int = flag(64, "--max-json-depth", help="how deeply a request body's JSON may nest (objects "
                               "and arrays); a deeper body is refused before it is parsed into a request")

    # structured outputs: what a request may ask to compile (grammar_limits.py; the compile's time limit is the
    # engine's --grammar-compile-timeout)
    max_json_schema_bytes: int = flag(65536, "--max-json-schema-bytes", help="size of a structured output's JSON "
                                      "schema (response_format, guided_json, the schema a tool_choice builds)")
    max_json_schema_depth: int = flag(32, "--max-json-schema-depth", help="how deeply a structured output's JSON "
                                      "schema may nest (objects and arrays)")
    max_grammar_choices: int = flag(1024, "--max-grammar-choices", help="alternatives a structured output may "
                                    "list: guided_choice entries, or a JSON schema's enum values and anyOf/oneOf "
                                    "branches together")
    max_regex_length: int = flag(4096, "--max-regex-length", help="characters of a guided_regex")
    max_grammar_length: int = flag(65536, "--max-grammar-length", help="characters of a guided_grammar (EBNF), "
                                   "and of a guided_choice's entries together")
    max_tools: int = flag(128, "--max-tools", help="tools one chat request may carry")
    default_completion_max_tokens: int = flag(
        16, "--default-completion-max-tokens", help="max_tokens of a /v1/completions request that gives none "
        "(OpenAI's and vLLM's 16; ATOM's server, python -m atom_aot.entrypoints.openai_server: 256), capped to "
        "what fits the model's context")

    def __post_init__(self):
        for name in ("max_prompts_per_request", "max_n", "max_seqs_per_request", "max_queued_seqs", "max_json_depth",
                     "default_completion_max_tokens", *GRAMMAR_LIMITS):
            value = getattr(self, name)
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name,
                     f"must be an integer >= 1, got {value!r}")
        for name in ("shutdown_timeout", "stalled_stream_timeout"):
            value = getattr(self, name)
            _require(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0, name,
                     f"must be a number of seconds > 0, got {value!r}")
        _require(not self.enable_auto_tool_choice or self.tool_call_parser is not None, "enable_auto_tool_choice",
                 f"needs --tool-call-parser ({', '.join(TOOL_CALL_PARSERS)}): it says how to read the calls")
        _require(self.reasoning_parser != "openai_gptoss" or self.tool_call_parser in (None, "openai"),
                 "reasoning_parser", f"openai_gptoss reads GPT-OSS's harmony output, whose tool calls only "
                 f"--tool-call-parser openai reads (not {self.tool_call_parser})")
        _require(self.reasoning_parser in (None, "openai_gptoss") or self.tool_call_parser != "openai",
                 "reasoning_parser", f"{self.reasoning_parser} reads <think> tags, which GPT-OSS does not write; "
                 f"--tool-call-parser openai reads GPT-OSS's harmony output, whose reasoning only "
                 f"--reasoning-parser openai_gptoss reads")
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
