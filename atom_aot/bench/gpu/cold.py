"""Cold start of either engine: fresh processes timed from spawn to their first token, by the same timer
(atom_aot.bench.cold_start.time_to_first_token). Ours starts from the scenario's artifact three times; vLLM
starts from the model folder with an empty compile cache, twice with that cache warm, and with enforce_eager."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from atom_aot.bench.cold_start import CHILD_OURS, time_to_first_token
from atom_aot.bench.gpu.scenarios import GPU_MEMORY_UTILIZATION, MAX_NUM_SEQS, Scenario, engine_kwargs_vllm

CHILD_VLLM = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=sys.argv[1], **json.loads(sys.argv[2]))
llm.generate([TokensPrompt(prompt_token_ids=[1000, 2000, 3000, 4000, 5000])],
             SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
print("FIRST_TOKEN", flush=True)
"""

SHARED = {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION, "max_num_seqs": MAX_NUM_SEQS}
TIMEOUT_S = 600


def cold_start(which: str, s: Scenario, model: Path, artifact: Path | None) -> dict:
    if which == "ours":
        kwargs = json.dumps({**SHARED, "max_model_len": s.max_model_len, **dict(s.ours_kwargs)})
        return {f"artifact_run{i}": time_to_first_token([sys.executable, "-c", CHILD_OURS, str(artifact), kwargs],
                                                        timeout=TIMEOUT_S) for i in (1, 2, 3)}
    kwargs = {**SHARED, "max_model_len": s.max_model_len, "seed": 0, **engine_kwargs_vllm(s)}
    with tempfile.TemporaryDirectory(prefix="vllm-cache-") as cache:
        os.environ["VLLM_CACHE_ROOT"] = cache        # the children inherit it: the first fills it
        runs = {}
        for name, extra in (("cold_compile_cache", {}), ("warm_compile_cache", {}), ("warm_compile_cache_2", {}),
                            ("enforce_eager", {"enforce_eager": True})):
            cmd = [sys.executable, "-c", CHILD_VLLM, str(model), json.dumps({**kwargs, **extra})]
            runs[name] = time_to_first_token(cmd, timeout=TIMEOUT_S)
    return runs
