"""LoRA adapters over HTTP: the server's adapter registry and, with
``--enable-lora-runtime-updates`` (or ``HOST_ALLOW_RUNTIME_LORA_UPDATING=1``), ``POST
/v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` and ``POST /v1/unload_lora_adapter``
``{"lora_name"}``, as vLLM serves them.

Without the opt-in the two routes are not attached (404, as on vLLM): loading an adapter reads
any directory the server can read, so an operator turns it on. With ``--api-key`` they need the
key like every other route. A bad adapter (missing file, rank above ``--max-lora-rank``, a module
other than q/k/v/o/gate/up/down, shapes of another model) or a taken name is a 400 naming the
problem, an unknown name to unload a 404; the server keeps serving either way. Loading validates
the directory and hashes its files off the event loop; the engine reads the weights at the first
request that uses the adapter.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from host.plugins.endpoints.common import off_loop
from host.plugins.endpoints.lora_registry import LoRARegistry
from host.sdk import APIError, EndpointPlugin


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_int_id: int | None = None  # vLLM's field; the name decides


def runtime_updates_enabled(settings: Any) -> bool:
    """``--enable-lora-runtime-updates`` (its environment variable is
    ``HOST_ALLOW_RUNTIME_LORA_UPDATING``)."""
    return bool(getattr(settings, "enable_lora_runtime_updates", False))


class LoRAAdaptersEndpoint(EndpointPlugin):
    """The registry on ``app.state.lora_registry`` (filled from ``--lora-modules`` before the
    engine starts: a bad module fails the start) and the load/unload routes behind the opt-in."""

    name = "lora_adapters"

    def attach_router(self, app: Any) -> None:
        state = app.state
        config = state.config
        registry = state.lora_registry = LoRARegistry(
            getattr(config, "lora", None), config.model.hf_config, state.served_model_names,
        )
        registry.load_modules(list(getattr(state.settings, "lora_modules", None) or []))
        if not runtime_updates_enabled(state.settings):
            return
        router = APIRouter()

        @router.post("/v1/load_lora_adapter", summary="Load a LoRA adapter (--enable-lora-runtime-updates)")
        async def load(body: LoadLoRAAdapterRequest, raw: Request) -> Response:
            try:
                registry.check_name(body.lora_name)
            except ValueError as exc:
                raise APIError(400, str(exc), param="lora_name") from None
            try:
                files = await off_loop(registry.validate, body.lora_name, body.lora_path)
                registry.add(body.lora_name, files)
            except ValueError as exc:
                raise APIError(400, str(exc), param="lora_path") from None
            return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type="text/plain")

        @router.post("/v1/unload_lora_adapter", summary="Unload a LoRA adapter (--enable-lora-runtime-updates)")
        async def unload(body: UnloadLoRAAdapterRequest, raw: Request) -> Response:
            try:
                registry.remove(body.lora_name)
            except KeyError as exc:
                raise APIError(404, exc.args[0], "NotFoundError", "lora_name") from None
            return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.", media_type="text/plain")

        app.include_router(router)

    def routes(self) -> list[tuple[str, str]]:
        return [("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter")]
