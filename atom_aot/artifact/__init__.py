"""The contract between `atom-build` and the runtime, torch-free: typed, versioned descriptions of
an artifact (manifest, build options, tuning, graph plan, the forward signature) and their reader
and writer. Build writes it, runtime reads it; neither imports the other, and nobody else parses
the artifact's JSON."""
