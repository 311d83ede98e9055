"""The endpoint suite: the routes a plugin declares are the routes it attaches, and they answer."""

from __future__ import annotations

from typing import Any, ClassVar

from host.sdk.conformance.base import RegistrationCheck
from host.sdk.endpoint import EndpointPlugin


class EndpointConformance(RegistrationCheck):
    """Set ``endpoint`` (an :class:`EndpointPlugin` instance). Optional: ``settings`` (server
    settings the plugin reads while attaching, as ``ServerSettings`` field values: a plugin that
    attaches a route only behind a flag is checked with the flag on), :meth:`prepare_app` (more
    ``app.state`` the plugin reads), and ``calls``, a list of ``(method, path, json_body_or_None,
    expected_status)`` made against a bare app holding only this plugin's routes (for routes that
    need no engine)."""

    endpoint: ClassVar[EndpointPlugin | None] = None
    settings: ClassVar[dict[str, Any]] = {}
    calls: ClassVar[list[tuple[str, str, Any, int]]] = []
    registry_kind = "endpoints"
    group = "host.endpoints"

    def registered_name(self) -> str:
        return self.endpoint.name

    def prepare_app(self, app: Any) -> None:
        """Set the ``app.state`` the server gives plugins (settings, served names, config None)."""
        from host.core.entrypoints.api_server import ServerSettings

        app.state.settings = ServerSettings(**self.settings)
        app.state.served_model_names = ["conformance-model"]
        app.state.config = None

    def _app(self) -> Any:
        from fastapi import FastAPI

        app = FastAPI()
        self.prepare_app(app)
        self.endpoint.attach_router(app)
        return app

    def test_declares_exactly_the_routes_it_attaches(self) -> None:
        assert self.endpoint is not None, "set `endpoint` to an instance of your EndpointPlugin"
        assert self.endpoint.name, "set the class field `name`"
        attached = {(m, r.path) for r in _flat_routes(self._app().routes) if r.path not in _FASTAPI_OWN
                    for m in r.methods if m != "HEAD"}
        declared = {(m.upper(), p) for m, p in self.endpoint.routes()}
        assert declared == attached, (
            f"routes() says {sorted(declared)} but attach_router added {sorted(attached)}; "
            "routes() feeds the allowlist, the startup banner and the API-key rules, so keep them equal"
        )

    def test_its_calls_answer_as_expected(self) -> None:
        from fastapi.testclient import TestClient

        with TestClient(self._app()) as client:
            for method, path, body, status in self.calls:
                response = client.request(method, path, json=body)
                assert response.status_code == status, f"{method} {path}: {response.status_code} {response.text[:200]}"


_FASTAPI_OWN = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def _flat_routes(routes: Any) -> list[Any]:
    """The app's routes with included routers opened up (newer FastAPI keeps an included router
    as one entry holding ``original_router``)."""
    flat = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            flat.extend(_flat_routes(inner.routes))
        elif getattr(route, "methods", None):
            flat.append(route)
    return flat
