"""Endpoint plugin base class: adds HTTP routes to the API server."""

from __future__ import annotations

from typing import Any, ClassVar


class EndpointPlugin:
    """A set of HTTP routes plus the state they need.

    ``required_tasks``: ``None`` means always eligible; otherwise the plugin is attached only when
    the served model supports one of these tasks (``"generate"``, ``"embed"``...).
    ``attach_router(app)`` runs after the core routes are attached; ``init_state`` after the
    core state is set (``engine_client`` is ``None`` when no engine is running).
    """

    name: ClassVar[str] = ""
    required_tasks: ClassVar[tuple[str, ...] | None] = None

    def attach_router(self, app: Any) -> None:
        raise NotImplementedError

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        """Set up per-server state; default: nothing."""

    def routes(self) -> list[tuple[str, str]]:
        """``(method, path)`` pairs this plugin serves, for conflict detection and listings."""
        return []
