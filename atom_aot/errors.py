"""The errors a user can cause and fix. Each message says what is wrong and what to do; the
command-line tools print them as one paragraph, with no traceback. Torch-free, so a front end
can catch them without loading torch."""


class ArtifactError(Exception):
    """An artifact that cannot be used here (corrupt, truncated, or made for another target)."""


class BuildError(Exception):
    """A build that cannot go ahead."""


class StartupError(Exception):
    """A runtime configuration this artifact cannot run with (a KV pool too small, say)."""


class UnsupportedArchitectureError(ValueError):
    """A model family atom-aot has no implementation of."""


class RequestError(ValueError):
    """A request the engine cannot take."""


class ContextLengthError(RequestError):
    """Prompt + max_tokens do not fit in max_model_len."""


class RankFailure(RuntimeError):
    """Another tensor-parallel rank died or stopped answering: the engine cannot go on."""


class RankStopped(RuntimeError):
    """Another rank of a data-parallel-attention artifact went away: the ranks step together, so this
    engine cannot go on (runtime/parallel/attention_dp.py)."""


USER_ERRORS = (ArtifactError, BuildError, StartupError, UnsupportedArchitectureError, ValueError, FileNotFoundError)
