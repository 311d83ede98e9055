"""The floor every role folder stands on: the types that cross from one part of the engine to
another, and nothing else.

- :mod:`.messages` — the engine-core <-> front-end messages (requests in, outputs and stats out),
  the same ``msgspec`` structs in-process and on the ZMQ wire.
- :mod:`.request` — :class:`Request`, the engine core's record of one request, and the block-hash
  types it carries.
- :mod:`.scheduler_output` — the scheduler's plan of one step (what the workers run).
- :mod:`.runner_output` — the model runner's result of one step (what the scheduler reads back).
- :mod:`.forward_context` — what a model's layers read during one forward.
- :mod:`.sampling_params`, :mod:`.pooling_params`, :mod:`.lora_request` — what a user asks for.

Contract: modules here import only the standard library, third-party packages and each other —
nothing else of ``host`` (tests/test_layering.py), so every layer above (:mod:`host.interfaces`,
:mod:`host.core`, :mod:`host.sdk`, the plugins) may use them.
"""
