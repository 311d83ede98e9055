"""Hooks of the ``host.reasoning_parsers`` family: splitters of a model's reasoning from its answer.

Loaded in the API process only, where the chat route fills ``reasoning_content``.
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.reasoning_parsers"
LOADED_IN = ("api",)
LAZY_IN: tuple[str, ...] = ()
SUMMARY = "reasoning parsers (--reasoning-parser)"


@hookspec
def host_register_reasoning_parsers(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.ReasoningParser` subclasses.

    Call ``register(parser_class)``; ``parser_class.name`` is the key ``--reasoning-parser``
    selects it by. The chat route creates one ``parser_class(tokenizer)`` per server and calls
    ``split(text, final)`` on the output (see :mod:`host.interfaces.reasoning_parser`).
    """
