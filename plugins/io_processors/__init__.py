"""Built-in IO processors (entry point ``host.io_processors: builtin_io``).

None are shipped yet; pooling models will bring the first. The module is registered so that the
group is exercised and listed like any other.
"""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_io_processors(register: Callable[..., None]) -> None:
    """The built-in registry is empty until a built-in processor exists."""
