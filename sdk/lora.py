"""LoRA adapters as a plugin sees them: :class:`LoRARequest` (which adapter a request runs
with), :func:`read_adapter` (validate a PEFT adapter directory for a model: a ``ValueError``
names the problem and the fix), :func:`adapter_digest` (the sha256 of its files, the
content half of the prefix-cache key) and :func:`lora_requests_from_modules` (``--lora-modules``
values: ``name=path`` or vLLM's JSON form).

Stable re-export of :mod:`host.contracts.lora_request`, :mod:`host.core.lora.adapter` and
:mod:`host.core.lora.frontend`; plugins import them from here, never from the core. Not imported
by ``host.sdk`` itself (see :mod:`host.sdk.models`).
"""

from host.contracts.lora_request import LoRARequest
from host.core.lora.adapter import adapter_digest, read_adapter
from host.core.lora.frontend import lora_requests_from_modules

__all__ = ["LoRARequest", "adapter_digest", "lora_requests_from_modules", "read_adapter"]
