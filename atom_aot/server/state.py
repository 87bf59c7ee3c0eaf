"""Everything a request handler needs, made once at startup and hung on `app.state` (no globals)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from atom_aot.runtime.processes.messages import EngineInfo
from atom_aot.server.lifecycle.metrics import ServerMetrics
from atom_aot.server.options import ServerOptions
from atom_aot.server.serving.async_engine import AsyncEngine
from atom_aot.server.serving.logprobs import TokenRenderer
from atom_aot.server.serving.tokenizer_pool import tokenizer_pool


@dataclass
class ServerState:
    engine: AsyncEngine
    tokenizer: object
    info: EngineInfo
    model_name: str
    metrics: ServerMetrics
    options: ServerOptions = field(default_factory=ServerOptions)
    api_key: str | None = None
    draining: bool = False           # set on SIGTERM/SIGINT: new requests get 503, /ready says not ready
    created: int = field(default_factory=lambda: int(time.time()))
    tokenizer_config: dict | None = None     # read from the artifact on the first GET /tokenizer_info
    tokenize_pool: ThreadPoolExecutor = field(default_factory=tokenizer_pool)   # encodes off the event loop
    renderer: TokenRenderer = field(init=False)

    def __post_init__(self):
        self.renderer = TokenRenderer(self.tokenizer)
