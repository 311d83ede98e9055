"""Hooks of the ``host.io_processors`` family: request payloads to prompts and back.

Loaded in the API process only, where requests are parsed and responses built.
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.io_processors"
LOADED_IN = ("api",)
LAZY_IN: tuple[str, ...] = ()
SUMMARY = "request/response processors"


@hookspec
def host_register_io_processors(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.IOProcessor` subclasses.

    Call ``register(processor_class)``. A model asks for one by its ``name`` (an
    ``io_processor_plugin`` key in its ``config.json``; an engine setting to override it comes
    with a later issue); a model that asks for a processor no plugin registered fails at
    start-up with a ``ValueError`` listing the registered names.
    """
