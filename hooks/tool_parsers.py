"""Hooks of the ``host.tool_parsers`` family: parsers of a model's tool calls.

Loaded in the API process only, where the chat route turns generated text into ``tool_calls``.
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.tool_parsers"
LOADED_IN = ("api",)
LAZY_IN: tuple[str, ...] = ()
SUMMARY = "tool-call parsers (--tool-call-parser)"


@hookspec
def host_register_tool_parsers(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.ToolParser` subclasses.

    Call ``register(parser_class)``; ``parser_class.name`` is the key ``--tool-call-parser``
    selects it by. The chat route creates one ``parser_class(tokenizer)`` per server and calls
    ``extract(text, tools)`` on a finished output, or feeds a :class:`host.sdk.ToolCallStream`
    the growing text of a streamed one (see :mod:`host.interfaces.tool_parser`).
    """
