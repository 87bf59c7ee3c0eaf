"""What the HTTP front end and the engine process say to each other over ZMQ.

Both processes are ours and trust each other, so messages are these dataclasses, pickled. The
front end PUSHes `Call` (one `EngineRequest`), `Abort` or `Shutdown` to the engine; the engine
PUSHes `Ready` or `StartupFailed` once, then `Reply` (one per `Call`), `Outputs` (one per step
that produced tokens) and a `Heartbeat` every HEARTBEAT_S, busy or idle, so that liveness and
/metrics never wait for an answer. Token ids only: text never crosses this boundary.

Each request type names its reply type (`EngineRequest[R]`), so `EngineClient.call(request)`
returns an R, and the engine answers through a table from request type to handler.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from atom_aot.runtime.outputs import CoreOutput, CoreStats
from atom_aot.runtime.sampling_params import SamplingParams

R = TypeVar("R")

HEARTBEAT_S = 0.5        # the engine's heartbeat period (a step longer than this delays one)


class EngineRequest(Generic[R]):
    """A question for the engine, answered by one reply of type R."""


@dataclass
class NewRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float          # time.perf_counter() of the front end: CLOCK_MONOTONIC, same host


# -- requests and their replies ---------------------------------------------------------------
@dataclass
class Added:
    count: int


@dataclass
class AddRequests(EngineRequest[Added]):
    """All or none: the engine checks every request before it queues any (the n choices of one call)."""
    requests: list[NewRequest]


@dataclass
class ProfileStarted:
    dir: str                     # where the trace will be written


@dataclass
class StartProfile(EngineRequest[ProfileStarted]):
    pass


@dataclass
class ProfileStopped:
    trace: str                   # the trace file written


@dataclass
class StopProfile(EngineRequest[ProfileStopped]):
    pass


# -- front end -> engine ----------------------------------------------------------------------
@dataclass
class Call:
    call_id: int
    request: EngineRequest


@dataclass
class Abort:
    request_ids: list[str]
    reason: str = "abort"


@dataclass
class Shutdown:
    pass


@dataclass
class Wake:
    """To every rank of a data-parallel-attention artifact when one of them gets requests: the ranks
    step together, so the idle ones must stop waiting on their inbox (runtime/processes/engine_process.py)."""


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
class Failure:
    message: str
    rejected: bool = False       # the request's fault (-> 400), not the engine's (-> 500)
    code: str | None = None      # OpenAI error code for a rejection, e.g. context_length_exceeded


@dataclass
class Reply:
    """The answer to the `Call` with this id: its request's reply type, or a failure."""
    call_id: int
    result: object = None
    failure: Failure | None = None


@dataclass
class Outputs:
    outputs: list[CoreOutput]


@dataclass
class EngineStats:
    core: CoreStats
    compile_counts: dict[str, int]   # compilations in the engine process since it started (must stay 0)


@dataclass
class Heartbeat:
    """The engine is alive and has taken `steps` steps; the numbers /metrics shows."""
    steps: int
    stats: EngineStats


def encode(message) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes):
    return pickle.loads(data)
