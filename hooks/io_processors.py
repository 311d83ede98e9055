"""Hooks of the ``host.io_processors`` family: request payloads to prompts and back.

Loaded in the API process only, where requests are parsed and responses built.
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec


@hookspec
def host_register_io_processors(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.IOProcessor` subclasses.

    Call ``register(processor_class)``. A model asks for one by name (``--io-processor`` or an
    ``io_processor_plugin`` key in its ``config.json``); a model that asks for a processor no
    plugin registered fails at start-up with a ``ValueError`` listing the registered names.
    """
