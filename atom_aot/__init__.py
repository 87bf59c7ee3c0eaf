"""atom-aot: an LLM inference engine whose build step compiles a model ahead of time into a
versioned artifact, and whose runtime loads it and serves with no compilation."""
from atom_aot.version import __version__  # noqa: F401


def __getattr__(name):   # lazy, so `import atom_aot` stays cheap for the CLIs
    if name == "LLMEngine":
        from atom_aot.entrypoints.llm import LLMEngine
        return LLMEngine
    if name == "SamplingParams":
        from atom_aot.runtime.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(name)


__all__ = ["LLMEngine", "SamplingParams", "__version__"]
