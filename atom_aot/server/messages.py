"""What the HTTP front end and the engine process say to each other over ZMQ.

Both processes are ours and trust each other, so messages are these dataclasses, pickled. The
front end PUSHes `Call`/`Abort`/`Shutdown` to the engine; the engine PUSHes `Ready` or
`StartupFailed` once, then `Reply` (one per `Call`) and `Outputs` (one per step that produced
tokens). Token ids only: text never crosses this boundary.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field

from atom_aot.runtime.outputs import CoreOutput
from atom_aot.runtime.sampling_params import SamplingParams


@dataclass
class NewRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float          # time.perf_counter() of the front end: CLOCK_MONOTONIC, same host


# -- front end -> engine ----------------------------------------------------------------------
@dataclass
class Call:
    """A question the engine answers with one `Reply`: add (args: list[NewRequest]), stats, ping,
    start_profile, stop_profile."""
    call_id: int
    method: str
    args: object = None


@dataclass
class Abort:
    request_ids: list[str]
    reason: str = "abort"


@dataclass
class Shutdown:
    pass


# -- engine -> front end ----------------------------------------------------------------------
@dataclass
class EngineInfo:
    """Facts about the loaded engine that the front end needs to check requests."""
    max_model_len: int
    vocab_size: int
    block_size: int
    num_kv_blocks: int
    execution: str               # "aotinductor" or "eager"
    build_key: str
    compile_counts: dict[str, int] = field(default_factory=dict)


@dataclass
class Ready:
    info: EngineInfo


@dataclass
class StartupFailed:
    message: str


@dataclass
class Reply:
    call_id: int
    result: object = None
    error: str | None = None          # set when the call failed
    rejected: bool = False            # the error is the request's fault (-> 400), not the engine's
    code: str | None = None           # OpenAI error code for a rejection, e.g. context_length_exceeded


@dataclass
class Outputs:
    outputs: list[CoreOutput]


def encode(message) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes):
    return pickle.loads(data)
