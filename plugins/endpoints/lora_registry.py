"""The API process's LoRA adapters: name -> :class:`LoRARequest`, what ``model=<name>`` selects.

Filled at start from ``--lora-modules`` (``name=path``, or vLLM's JSON form
``{"name": ..., "path": ..., "base_model_name": ...}``; each adapter validated, a bad one fails the
start with the reason) and, with ``--enable-lora-runtime-updates``, by ``POST
/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (:mod:`.lora_routes`). Each adapter gets the
next id (1, 2, ...; an id is never reused) and the digest of its files, so an adapter unloaded and
loaded again from changed files is a new adapter to the worker (it reloads the weights) and to the
prefix cache (no KV its old weights computed is reused). A name taken by the base model or by a
loaded adapter is refused: to replace an adapter, unload it first (vLLM's rule).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from host.sdk.lora import LoRARequest, lora_requests_from_modules, read_adapter


@dataclass(frozen=True)
class ServedAdapter:
    """One adapter the server serves: the request it gives generations and the model it
    is listed under (``parent`` on ``/v1/models``)."""

    lora_request: LoRARequest
    parent: str


def base_model_name(text: str) -> str | None:
    """The ``base_model_name`` of a ``--lora-modules`` value in vLLM's JSON form (``None``: the
    first served name); the value's grammar is checked by ``lora_requests_from_modules``."""
    if not text.strip().startswith("{"):
        return None
    base = json.loads(text).get("base_model_name")
    if base is not None and not isinstance(base, str):
        raise ValueError(f"--lora-modules {text!r}: base_model_name={base!r} must be a model name")
    return base


class LoRARegistry:
    """The adapters of one server. ``lora_config`` is the engine's ``LoRAConfig`` (``None``:
    ``--enable-lora`` is off and nothing can be registered); ``hf_config`` the base model's
    ``transformers`` config (adapters are validated against its shapes); ``base_names`` the
    served model names (an adapter may not take one; the first is every adapter's default
    parent)."""

    def __init__(self, lora_config: Any, hf_config: Any, base_names: list[str]) -> None:
        self.lora_config = lora_config
        self.hf_config = hf_config
        self.base_names = list(base_names)
        self._adapters: dict[str, ServedAdapter] = {}
        self._next_id = 1

    def get(self, name: str) -> LoRARequest | None:
        """The request of adapter ``name``, ``None`` when no adapter has that name."""
        adapter = self._adapters.get(name)
        return None if adapter is None else adapter.lora_request

    def adapters(self) -> list[ServedAdapter]:
        """Every adapter, in the order they were registered."""
        return list(self._adapters.values())

    def check_name(self, name: Any) -> str:
        """``name`` when an adapter may be registered under it; else a ValueError saying why
        (LoRA off, not a string, the base model's, already loaded)."""
        if self.lora_config is None:
            raise ValueError("this server was started without LoRA; start it with --enable-lora to serve adapters")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"lora_name={name!r} must be a non-empty adapter name")
        if name in self.base_names:
            raise ValueError(f"lora_name {name!r} is the base model's name; choose another name for the adapter")
        if name in self._adapters:
            raise ValueError(f"the LoRA adapter {name!r} is already loaded; unload it first "
                             "(POST /v1/unload_lora_adapter) to load it again")
        return name

    def validate(self, name: Any, path: Any) -> Any:
        """Check ``name`` and the adapter directory at ``path`` (:func:`read_adapter`: files,
        rank, target modules, shapes; reads the files: run it off the event loop). Returns the
        validated adapter; a ValueError names the problem."""
        self.check_name(name)
        if not isinstance(path, str) or not path:
            raise ValueError(f"lora_path={path!r} must be the adapter's directory")
        return read_adapter(path, self.lora_config, self.hf_config)

    def add(self, name: str, files: Any, parent: str | None = None) -> LoRARequest:
        """Register a validated adapter (``files`` from :meth:`validate`) under the next id."""
        self.check_name(name)  # again: another load of this name may have finished meanwhile
        request = LoRARequest(name, self._next_id, files.path, files.digest)
        self._next_id += 1
        self._adapters[name] = ServedAdapter(request, parent or self.base_names[0])
        return request

    def load(self, name: str, path: str, parent: str | None = None) -> LoRARequest:
        """:meth:`validate` then :meth:`add` (blocking)."""
        return self.add(name, self.validate(name, path), parent)

    def remove(self, name: Any) -> LoRARequest:
        """Unregister adapter ``name`` (requests already running with it finish with it); a
        KeyError names an unknown one and the adapters there are."""
        adapter = self._adapters.pop(name, None) if isinstance(name, str) else None
        if adapter is None:
            known = ", ".join(self._adapters) or "none"
            raise KeyError(f"no LoRA adapter is loaded under the name {name!r} (loaded: {known})")
        return adapter.lora_request

    def load_modules(self, modules: list[str]) -> None:
        """Register every ``--lora-modules`` value (parsed by ``lora_requests_from_modules``, as
        ``host generate`` parses them); a bad one is a ValueError naming it."""
        for text, spec in zip(modules, lora_requests_from_modules(modules)):
            try:
                self.load(spec.lora_name, spec.lora_path, base_model_name(text))
            except ValueError as exc:
                raise ValueError(f"--lora-modules {text!r}: {exc}") from None


def lora_registry(state: Any) -> LoRARegistry | None:
    """This server's registry (``None`` when the LoRA routes plugin is not attached)."""
    return getattr(state, "lora_registry", None)


def lora_request_for(state: Any, model: str | None) -> LoRARequest | None:
    """The adapter ``model`` names, ``None`` for the base model (or an unknown name, which
    :func:`host.plugins.endpoints.common.check_model` has already refused)."""
    registry = lora_registry(state)
    return registry.get(model) if registry is not None and model else None
