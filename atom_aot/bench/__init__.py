"""Measuring tools: the serving benchmark (`bench.serving`), GSM8K accuracy (`bench.gsm8k`), and
the Hugging Face reference they compare against (`bench.hf_reference`).

They are clients: they talk to a server over HTTP (or run transformers), never to engine internals,
so the same commands measure us and the peers.
"""
