"""A grammar compile worker: its own process, so that a compile running past its time limit can be ended
(a thread cannot be stopped) and so that a crash or a stack overflow in the grammar library takes only it.

Started by grammar_compiler.py as `python -m atom_aot.runtime.sampling.grammar_worker READ_FD WRITE_FD`; it talks
over those two pipes with `multiprocessing.connection` framing:
  in:  the tokenizer's `TokenizerInfo` as xgrammar's JSON, once; then one JSON job per compile
       ({"kind", "value", "choices"});
  out: per job, b"ok" + the compiled grammar as xgrammar's JSON, or b"no" + why it does not compile
       (in our words: grammar_errors.py).
It ends when its input closes, or within a second of its parent's end (a compile would otherwise run on).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from multiprocessing.connection import Connection

from atom_aot.runtime.sampling.grammar_errors import compile_error_message


JSON_OBJECT_SCHEMA = '{"type": "object"}'


def compile_spec(compiler, kind: str, value: str, choices: list[str]):
    """xgrammar's CompiledGrammar of one structured-output spec (`GrammarSpec`'s fields)."""
    if kind == "json_object":      # an object, as OpenAI and vLLM mean it (not any JSON value)
        return compiler.compile_json_schema(JSON_OBJECT_SCHEMA, any_whitespace=False)
    if kind == "json_schema":
        # compact JSON: "any whitespace" lets small models emit blanks until max_tokens
        return compiler.compile_json_schema(value, any_whitespace=False)
    if kind == "regex":
        return compiler.compile_regex(value)
    if kind == "choice":
        return compiler.compile_grammar(choice_grammar(choices))
    return compiler.compile_grammar(value)


def choice_grammar(choices: list[str] | tuple[str, ...]) -> str:
    """EBNF whose language is exactly `choices` (xgrammar's string literals take JSON's escapes)."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)


def serve(inbox: Connection, outbox: Connection) -> None:
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    import xgrammar as xgr
    info = xgr.TokenizerInfo.deserialize_json(inbox.recv_bytes().decode())
    # one thread per worker: the pool's size is the CPU grammar work may take from decoding
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    outbox.send_bytes(b"ready")
    while True:
        try:
            job = json.loads(inbox.recv_bytes())
        except EOFError:
            return
        try:
            compiled = compile_spec(compiler, job["kind"], job["value"], job["choices"])
        except (RuntimeError, ValueError, RecursionError) as e:
            outbox.send_bytes(b"no" + compile_error_message(job["kind"], e).encode())
            continue
        outbox.send_bytes(b"ok" + compiled.serialize_json().encode())


def _exit_with_parent(parent: int) -> None:
    """xgrammar's compile releases the GIL, so this thread runs beside one."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
