"""host's paged attention as a transformers attention function (``attn_implementation="host_paged"``).

transformers models call attention through its ``AttentionInterface`` registry:
``fn(module, query, key, value, attention_mask, scaling=..., sliding_window=..., **kw)`` with
``query`` [batch, heads, tokens, head_dim] and ``key`` / ``value`` [batch, kv_heads, tokens,
head_dim] (KV heads not repeated), returning ``(output [batch, tokens, heads, head_dim], weights)``.
:func:`host_paged_attention` is registered under :data:`HOST_ATTENTION` and hands each call to
the :class:`~host.core.models.attention_layer.Attention` layer attached to the calling module
(``module.host_attention``), so the paged KV-cache write and attention of the selected backend,
the opaque op of compiled models and the dense no-context path all apply as for native models.
The fallback feeds the flattened step as batch 1, so ``batch`` is always 1 and ``tokens`` are
the step's tokens of every sequence; the attention mask transformers passes is ignored (the
backend knows each sequence's extent from the forward context).

transformers builds no mask for an implementation that is absent from its mask registry
(``masking_utils.ALL_MASK_ATTENTION_FUNCTIONS``): ``create_causal_mask`` and the sliding-window
variant return ``None`` at once, so no [tokens, tokens] tensor is made per step. Nothing is
registered there on purpose.

Before the layers exist, a *probe* (:func:`probe_attention_calls`) runs one token through the
model and records each attention module's call: its heads, head size, ``scaling``,
``sliding_window``, ``softcap`` (the attention logit soft-cap, passed to host's backend) and any
argument host's backends cannot honour.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Iterator

import torch

HOST_ATTENTION = "host_paged"

# keyword arguments that change the attention result and that no host backend implements
_UNSUPPORTED = {
    "s_aux": "attention sinks",
}


@dataclass
class AttentionCall:
    """What one attention module asked for in the probe."""

    module: torch.nn.Module
    num_heads: int
    num_kv_heads: int
    head_size: int
    scaling: float
    sliding_window: int | None
    logits_soft_cap: float | None = None  # the module's ``softcap`` (Gemma 2's attention soft-cap)


_PROBE: contextvars.ContextVar[list[AttentionCall] | None] = contextvars.ContextVar("host_attention_probe", default=None)


@contextlib.contextmanager
def probe_attention_calls() -> Iterator[list[AttentionCall]]:
    """Within the block, calls of modules without ``host_attention`` are recorded (in call order)
    into the yielded list and answered with zeros."""
    calls: list[AttentionCall] = []
    token = _PROBE.set(calls)
    try:
        yield calls
    finally:
        _PROBE.reset(token)


def _record(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            scaling: float | None, sliding_window: int | None, kwargs: dict[str, Any]) -> None:
    calls = _PROBE.get()
    name = type(module).__name__
    if calls is None:
        raise RuntimeError(f"{name} has no host_attention layer: build the model with TransformersForCausalLM")
    for arg, what in _UNSUPPORTED.items():
        given = kwargs.get(arg)
        if given is not None:
            shown = f"a {tuple(given.shape)} tensor" if isinstance(given, torch.Tensor) else repr(given)
            raise ValueError(
                f"{name} uses {what} ({arg}={shown}), which the transformers fallback does not hand to "
                "host's attention; this architecture cannot run with --model-impl transformers (use its native "
                "implementation where one is registered: gpt-oss has one)"
            )
    if not getattr(module, "is_causal", True):
        raise ValueError(f"{name} attends bidirectionally; --model-impl transformers runs causal decoders only")
    if query.shape[0] != 1:
        raise ValueError(f"{name} got a query batch of {query.shape[0]}; the fallback feeds batch 1")
    head_size = query.shape[-1]
    if key.shape[-1] != head_size or value.shape[-1] != head_size:
        raise ValueError(
            f"{name} has query/key/value head sizes {query.shape[-1]}/{key.shape[-1]}/{value.shape[-1]}; "
            "host's KV cache needs one head size (this architecture cannot run with --model-impl transformers)"
        )
    calls.append(AttentionCall(
        module=module,
        num_heads=int(query.shape[1]),
        num_kv_heads=int(key.shape[1]),
        head_size=int(head_size),
        scaling=float(scaling) if scaling is not None else head_size**-0.5,
        sliding_window=int(sliding_window) if sliding_window else None,
        logits_soft_cap=float(kwargs["softcap"]) if kwargs.get("softcap") else None,
    ))


def host_paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``host_paged`` attention function: ``module.host_attention`` over the step's tokens.
    Returns ``([1, tokens, heads, head_dim], None)``; ``attention_mask`` is not read."""
    layer = getattr(module, "host_attention", None)
    _, heads, tokens, head_size = query.shape
    if layer is None:
        _record(module, query, key, value, scaling, sliding_window, kwargs)
        return query.new_zeros(1, tokens, heads, head_size), None
    q = query[0].transpose(0, 1).reshape(tokens, heads * head_size)
    k = key[0].transpose(0, 1).reshape(tokens, -1)
    v = value[0].transpose(0, 1).reshape(tokens, -1)
    out = layer(q, k, v)
    return out.view(1, tokens, heads, head_size), None


def register_host_attention() -> str:
    """Register :func:`host_paged_attention` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(HOST_ATTENTION, host_paged_attention)
    return HOST_ATTENTION
