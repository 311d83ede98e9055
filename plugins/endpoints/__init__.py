"""Built-in HTTP routes (entry point ``host.endpoints: builtin_endpoints``).

The OpenAI-compatible routes arrive with the serving issue; until then this registers none.
"""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_endpoints(register: Callable[..., None]) -> None:
    """The built-in endpoint registry is empty until the HTTP server lands."""
