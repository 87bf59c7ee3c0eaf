"""The GPU path (sm90 and other CUDA arches): skipped without a GPU.

Tiny random-weight models built for this GPU's arch, in float32: greedy decoding through the
compiled packages (Triton attention, decode replayed as CUDA graphs) equals transformers on the
same weights; the runtime compiles nothing.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from atom_aot import LLMEngine, SamplingParams  # noqa: E402
from factories import make_tiny_model, random_prompts  # noqa: E402


KV_BLOCKS = 2048      # small pools: several engines (and transformers) share the GPU in one pytest run


def build_for_gpu(model_dir, cache, **options):
    """Built by a child atom-build: this process loads the artifact afterwards (see build/isolated.py)."""
    from atom_aot.arch import detect_arch
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.isolated import build_isolated
    from atom_aot.build.pipeline import plan
    config = BuildConfig(arch=detect_arch(), dtype="float32", capture_sizes=(1, 2, 4, 8, 16), **options)
    return build_isolated(str(model_dir), config, cache, plan(str(model_dir), config)[2])["path"]


def hf_greedy_cuda(model_dir, prompts, max_new):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).cuda().eval()
    outs = []
    for ids in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=max_new, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        outs.append(out[0, len(ids):].tolist())
    return outs


@pytest.fixture(scope="module", params=["LlamaForCausalLM", "Qwen3ForCausalLM"])
def gpu_model(request, tmp_path_factory, artifact_cache):
    model_dir = make_tiny_model(tmp_path_factory.mktemp("gpu") / request.param, request.param,
                                max_position_embeddings=1024)
    return model_dir, build_for_gpu(model_dir, artifact_cache)


def test_greedy_matches_hf_with_cuda_graphs(gpu_model):
    model_dir, artifact = gpu_model
    prompts = random_prompts(12, 380, seed=11, lengths=(3, 200))
    engine = LLMEngine(str(artifact), num_kv_blocks=KV_BLOCKS)
    assert engine.loaded.execution == "aotinductor" and engine.core.runner.forwards.decode is not None
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    assert [o["token_ids"] for o in outs] == hf_greedy_cuda(model_dir, prompts, 32)


def test_graphs_equal_eager(gpu_model):
    _, artifact = gpu_model
    prompts = random_prompts(5, 380, seed=12)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    graphs = LLMEngine(str(artifact), num_kv_blocks=KV_BLOCKS).generate(prompts, params)
    eager = LLMEngine(str(artifact), num_kv_blocks=KV_BLOCKS, enforce_eager=True).generate(prompts, params)
    assert [o["token_ids"] for o in graphs] == [o["token_ids"] for o in eager]


PROBE = """
import json, sys
from atom_aot import LLMEngine, SamplingParams
from atom_aot.runtime.loading.compile_counter import compile_counts, compilers_loaded
engine = LLMEngine(sys.argv[1], num_kv_blocks=2048)
engine.generate([[5, 6, 7], list(range(30, 90))], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
print(json.dumps({"counts": compile_counts(), "loaded": compilers_loaded()}))
"""


def test_runtime_compiles_nothing_on_gpu(gpu_model):
    _, artifact = gpu_model
    out = subprocess.run([sys.executable, "-c", PROBE, str(artifact)], capture_output=True, text=True, check=True,
                         env=os.environ)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["counts"] == {"dynamo_frames": 0, "inductor_compilations": 0, "triton_jit": 0}
    assert "torch._inductor" not in result["loaded"]


def test_async_scheduling_gives_the_same_outputs(gpu_model):
    """Pinned copies, readback events and decode inputs gathered on the device from the previous
    step's samples (CUDA graphs included): the same tokens as reading every step before the next,
    through EOS stops, a pool small enough to preempt, and seeded sampling; every block back."""
    _, artifact = gpu_model
    prompts = random_prompts(12, 380, seed=13, lengths=(3, 200))
    params = [SamplingParams(temperature=0, max_tokens=40) for _ in prompts[:6]] + \
        [SamplingParams(temperature=0.9, top_k=50, seed=i, max_tokens=24) for i in range(6)]
    results = []
    for async_scheduling in (False, True):
        engine = LLMEngine(str(artifact), num_kv_blocks=40, max_model_len=256, async_scheduling=async_scheduling)
        results.append([(o["token_ids"], o["finish_reason"]) for o in engine.generate(prompts, params)])
        bm = engine.core.block_manager
        assert engine.core.scheduler.num_preemptions > 0 and bm.num_free_blocks == bm.num_blocks
    assert results[0] == results[1]
