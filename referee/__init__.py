"""The referee suite: cachescale's readings and predictions held against a real vLLM.

Importable as a package (like ``tests``), so its helpers are imported by name
(``referee.vllm``, ``referee.load``). Run as a pytest session of its own (``make
referee``); see referee/README.md.
"""
