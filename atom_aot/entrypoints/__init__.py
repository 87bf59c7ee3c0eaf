"""What users call, above build, runtime and server: the `LLMEngine` API (which builds a model
before running it) and `atom-run` (which dispatches to the runtime's commands or the server)."""
