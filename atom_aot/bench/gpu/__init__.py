"""GPU benchmarks of named scenarios, atom-aot against vLLM (`python -m atom_aot.bench.gpu SCENARIO`): the
scenario table (scenarios.py), the measuring code both engines share (measure.py, cold.py, serve.py), the
runner that prepares and runs them (runner.py, __main__.py) and the one result file per run (result.py)."""
