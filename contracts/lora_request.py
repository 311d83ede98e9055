"""LoRARequest: which adapter a request runs with (every process: it travels in the engine messages)."""

from __future__ import annotations

import msgspec


class LoRARequest(msgspec.Struct, frozen=True, omit_defaults=True):
    """One LoRA adapter a request runs with, as vLLM names it: ``LoRARequest("sql", 1, "/path")``.

    ``lora_name``: the name clients use (``model=<name>`` over HTTP). ``lora_int_id``: a positive
    integer unique per adapter in this engine (the worker's slot key). ``lora_path``: a PEFT
    adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``). ``digest``: the
    sha256 hex of those two files, filled by the front end's validation
    (:func:`host.core.lora.adapter.adapter_digest`); the worker keys its caches by
    ``(lora_int_id, digest)`` and the prefix cache hashes ``("lora", name, digest)``, so a changed
    adapter under the same name or id is reloaded and never meets stale KV. Frozen: it hashes,
    and the same object may be shared by many requests.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    digest: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name={self.lora_name!r} must be a non-empty adapter name, e.g. LoRARequest('sql', 1, '/path')")
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) or self.lora_int_id < 1:
            raise ValueError(
                f"lora_int_id={self.lora_int_id!r} of adapter {self.lora_name!r} must be an integer >= 1 "
                "(0 and below mean the base model in vLLM; pass lora_request=None for the base model)"
            )

    @property
    def key(self) -> tuple[int, str]:
        """What the worker's slots key an adapter by: its id and its content."""
        return (self.lora_int_id, self.digest)

    def with_digest(self, digest: str) -> "LoRARequest":
        """The same request with ``digest`` filled (the front end's validation does this)."""
        return msgspec.structs.replace(self, digest=digest)
