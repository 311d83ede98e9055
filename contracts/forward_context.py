"""The per-step context every attention layer reads: batch metadata and KV cache tensors.

The model runner sets it around one forward pass; layers call :func:`get_forward_context`.
Models therefore keep the plain ``forward(input_ids, positions)`` signature of a Hugging Face
model, and the attention backend gets what it needs without threading arguments through
every module.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import torch


@dataclass
class ForwardContext:
    """What one forward pass needs beyond token ids and positions.

    ``attn_metadata`` is the object the backend's metadata builder returned (shared by every
    layer); with a hybrid KV cache (several KV cache groups, each with its own block tables)
    ``layer_attn_metadata[i]`` is layer ``i``'s group's metadata instead (``None`` with one
    group). ``kv_caches[i]`` is layer ``i``'s view into the KV buffer; ``lora_mapping`` (with
    ``--enable-lora``) each token's adapter slot, a
    :class:`~host.core.lora.punica.LoRAMapping`, or ``None`` (every token on the base model).
    """

    attn_metadata: Any
    kv_caches: list["torch.Tensor"]
    extra: dict[str, Any] = field(default_factory=dict)
    lora_mapping: Any = None
    layer_attn_metadata: list[Any] | None = None

    def metadata_of(self, layer_idx: int) -> Any:
        """The attention metadata layer ``layer_idx`` reads (its KV cache group's)."""
        per_layer = self.layer_attn_metadata
        return self.attn_metadata if per_layer is None else per_layer[layer_idx]


_CONTEXT: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar(
    "host_forward_context", default=None
)


@contextlib.contextmanager
def set_forward_context(ctx: ForwardContext | None) -> Iterator[None]:
    token = _CONTEXT.set(ctx)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def get_forward_context() -> ForwardContext | None:
    """The context of the forward pass in progress, or ``None`` outside the model runner."""
    return _CONTEXT.get()
