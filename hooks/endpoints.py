"""Hooks of the ``host.endpoints`` family: HTTP routes of the API server.

Loaded in the API process only. Endpoint plugins widen the network surface, so third-party ones
are default-deny: installed but not named in ``--plugins`` / ``HOST_PLUGINS``, they are skipped
with a warning that says how to enable them.
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.endpoints"
LOADED_IN = ("api",)
LAZY_IN: tuple[str, ...] = ()
SUMMARY = "HTTP routes (third-party ones are opt-in)"


@hookspec
def host_register_endpoints(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.EndpointPlugin` instances.

    Call ``register(endpoint_plugin)`` with an instance. The host calls its ``attach_router(app)``
    after the core routes are attached and ``await init_state(engine_client, state, args)`` after
    the core state is set. A plugin whose ``required_tasks`` do not intersect the served model's
    tasks is skipped with an INFO log. Two plugins declaring the same method and path are an
    error naming both.
    """
