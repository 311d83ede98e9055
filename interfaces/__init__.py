"""The base classes and tables the engine calls, for the engine and its plugins alike.

Attention backends, platforms, KV connectors, quantization methods, stat loggers, executors,
endpoints, tool and reasoning parsers, IO processors, the API errors and the kernel table: each
module states the contract one extension point offers. :mod:`host.core` imports them from here;
plugin authors get them re-exported by :mod:`host.sdk`.

Contract: modules here import only the standard library, third-party packages, each other and
:mod:`host.contracts` — nothing of :mod:`host.core` (tests/test_layering.py).
"""
