"""One compiled call per decode step for Llama-family models on CPU.

A decode step of a small batch spends as long in Python — dispatching about ten small ops per
layer — as in streaming the weights. :class:`FusedDecode` hands the whole decoder stack to the
compiled ``llama_decode_step`` kernel instead (the CPU counterpart of replaying a captured CUDA
graph): the same kernels the layer-by-layer path uses, in the same order, so the results are
the same. It takes a step of at most ``max_rows`` tokens of causal attention (single-token
decodes, a speculative verify step's few tokens per request, a short prompt) when the model is
float32, every linear layer either has the plain weight copy of the small-batch linear kernel or
is a quantized layer the compiled kernels read (GGUF blocks: ``scheme == "gguf"`` with
``qweights``/``qtypes`` per shard; int8 rows: ``scheme == "int8"`` with ``qweight``/``scales``; a
GGUF layer with ``quantized_activations == "q8"`` runs the Q8-activation kernel), and the
attention backend is ``cpu_paged`` or ``torch_paged`` themselves (the kernel computes their
algorithm; a plugin's backend, even a subclass of theirs, runs its own code layer by layer); any other
step (longer prefills, bigger batches, encoders) runs layer by layer.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch
from torch import nn

from host.plugins.builtin_cpu.attention import CpuPagedAttentionImpl
from host.plugins.torch_paged.attention import TorchPagedAttentionImpl
from host.plugins.torch_paged.metadata import TorchPagedAttentionMetadata
from host.sdk.forward_context import get_forward_context
from host.sdk.gguf_formats import NAMES

logger = logging.getLogger("host.cpu")

_EMPTY = torch.empty(0)


# the linear kinds of llama_decode_plan's linear_meta
_FLOAT32, _INT8, _GGUF, _GGUF_Q8 = 0, 1, 2, 3
# the GGUF block types the compiled kernel reads: every format kept quantized (int(gguf.GGMLQuantizationType) -> name)
GGUF_QTYPES = NAMES
# the attention implementations whose algorithm the compiled step reproduces
_OWN_IMPLS = (CpuPagedAttentionImpl, TorchPagedAttentionImpl)


def _weight(linear: nn.Module) -> torch.Tensor | None:
    return getattr(linear, "plain_weight", None)


def _bias(linear: nn.Module) -> torch.Tensor:
    bias = getattr(linear, "bias", None)
    return _EMPTY if bias is None else bias.detach()


def _quant_reason(linear: nn.Module) -> str | None:
    """Why the compiled decode step cannot run this quantized layer (``None``: it can)."""
    scheme = linear.scheme
    bias = getattr(linear, "bias", None)
    if bias is not None and bias.dtype != torch.float32:
        return f"a {scheme} layer has a {bias.dtype} bias"
    if scheme == "int8":
        if linear.qweight.dtype != torch.int8 or linear.in_features % 32:
            return "an int8 layer whose input size is not a multiple of 32"
        return None
    if scheme == "gguf":
        for qw, qt in zip(linear.qweights, linear.qtypes):
            if int(qt) not in GGUF_QTYPES:
                return f"GGUF type {int(qt)} has no CPU kernel (supported: {', '.join(GGUF_QTYPES.values())})"
            if qw.dtype != torch.uint8 or qw.dim() != 2:
                return "GGUF blocks not held as a uint8 [rows, bytes] tensor"
        return None
    return f"{scheme} weights have no fused CPU kernel"


def _linear_spec(linear: nn.Module) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """(weight slot, quantized tensors, linear_meta entries) of one linear for ``llama_decode_plan``."""
    scheme = getattr(linear, "scheme", None)
    if scheme == "int8":
        return _EMPTY, [linear.qweight.contiguous(), linear.scales.float().contiguous()], [_INT8, 0]
    if scheme == "gguf":
        shards = [qw.contiguous() for qw in linear.qweights]
        kind = _GGUF_Q8 if getattr(linear, "quantized_activations", "none") == "q8" else _GGUF
        return _EMPTY, shards, [kind, len(shards), *(int(qt) for qt in linear.qtypes)]
    return _weight(linear), [], [_FLOAT32, 0]


class FusedDecode:
    """Callable installed as ``DecoderModel.decode_kernel``: returns the final hidden states of
    a qualifying decode step, or ``None`` to let the model run layer by layer."""

    def __init__(self, decoder: nn.Module, kernels: Any, max_rows: int) -> None:
        self.kernels = kernels
        self.max_rows = max_rows
        layers = list(decoder.layers)
        first = layers[0].self_attn
        self.num_heads, self.num_kv_heads, self.head_dim = first.num_heads, first.num_kv_heads, first.head_dim
        self.scale = first.attn.scale
        self.eps = float(decoder.norm.eps)
        self.final_norm = decoder.norm.weight
        self.cos_sin = decoder.rotary_emb.cos_sin_cache
        self.windows = [int(layer.self_attn.attn.sliding_window or 0) for layer in layers]
        self._plan: tuple[int, list[int]] | None = None  # (plan id, the KV caches' data pointers)
        self._release: weakref.finalize | None = None
        self.weights: list[torch.Tensor] = []
        self.quant_tensors: list[torch.Tensor] = []
        self.linear_meta: list[int] = []
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            slots = {}
            for key, linear in (("qkv", attn.qkv_proj), ("o", attn.o_proj), ("gate_up", mlp.gate_up_proj), ("down", mlp.down_proj)):
                slot, tensors, meta = _linear_spec(linear)
                slots[key] = slot
                self.quant_tensors += tensors
                self.linear_meta += meta
            self.weights += [
                layer.input_layernorm.weight,
                slots["qkv"],
                _bias(attn.qkv_proj),
                _EMPTY if attn.q_norm is None else attn.q_norm.weight,
                _EMPTY if attn.k_norm is None else attn.k_norm.weight,
                slots["o"],
                _bias(attn.o_proj),
                layer.post_attention_layernorm.weight,
                slots["gate_up"],
                _bias(mlp.gate_up_proj),
                slots["down"],
                _bias(mlp.down_proj),
            ]

    @classmethod
    def supports(cls, decoder: nn.Module) -> str | None:
        """Why this decoder cannot use the fused path (``None``: it can)."""
        from host.sdk.models import DecoderAttention, DecoderModel

        if not isinstance(decoder, DecoderModel) or len(decoder.layers) == 0:
            return "not a Llama-family decoder"
        if decoder.norm.weight.dtype != torch.float32:
            return "the model is not float32"
        if decoder.rotary_emb.rotary_dim % 2:
            return "odd rotary dimension"
        for layer in decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if not hasattr(mlp, "gate_up_proj") or type(attn).forward is not DecoderAttention.forward:
                return "the layers are not Llama-shaped (mixture-of-experts or their own attention)"
            if getattr(attn.attn, "sinks", None) is not None:
                return "the attention has sinks (the compiled step does not add them)"
            for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
                if getattr(linear, "scheme", None) is not None:
                    reason = _quant_reason(linear)
                    if reason is not None:
                        return reason
                elif _weight(linear) is None:
                    return "the small-batch linear kernel is off"
            if attn.attn.impl is None:
                return "no attention backend"
            if type(attn.attn.impl) not in _OWN_IMPLS:
                return f"the attention backend's {type(attn.attn.impl).__qualname__} runs its own code"
        return None

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
        ctx = get_forward_context()
        md = None if ctx is None else ctx.attn_metadata
        n = input_ids.shape[0]
        if (
            not isinstance(md, TorchPagedAttentionMetadata)
            or not md.causal
            or md.num_actual_tokens != n
            or n == 0
            or n > self.max_rows
            or md.write_token_index is not None
            or md.write_slots.numel() != n
            or any(cache.dtype != torch.float32 for cache in ctx.kv_caches[:1])
        ):
            return None
        if md.num_reqs == n:  # one new token per request: a row per request
            tables = md.block_table[:n].to(torch.int32).contiguous()
            seq_lens = md.seq_lens[:n].to(torch.int32).contiguous()
        else:
            tables, seq_lens = _rows_per_token(md, n)
        return self.kernels.llama_decode_step(
            self._plan_for(ctx.kv_caches),
            hidden.contiguous(),
            positions.to(torch.int64).contiguous(),
            md.write_slots.to(torch.int64).contiguous(),
            tables,
            seq_lens,
        )

    def _plan_for(self, kv_caches: list[torch.Tensor]) -> int:
        """The compiled kernel's plan over these KV caches (built on first use and whenever the
        caches are replaced): the weights and caches cross into C++ once, not every step."""
        key = [cache.data_ptr() for cache in kv_caches]
        if self._plan is None or self._plan[1] != key:
            if self._release is not None:
                self._release()  # the plan over the old caches
            plan = self.kernels.llama_decode_plan(
                self.weights, self.quant_tensors, self.linear_meta, list(kv_caches), self.windows, self.cos_sin,
                self.final_norm, self.num_heads, self.num_kv_heads, self.head_dim, self.eps, self.scale,
            )
            self._plan = (plan, key)
            self._release = weakref.finalize(self, self.kernels.llama_decode_release, plan)
        return self._plan[0]


def _rows_per_token(md: TorchPagedAttentionMetadata, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 block-table rows and sequence lengths with one row per batch token: a request with
    several new tokens (a speculative verify step, a short prompt) gives each its request's block
    table and the length up to and including itself. The kernel writes every row's K/V before it
    attends, so each row sees exactly the causal prefix it would see layer by layer."""
    reqs = md.num_reqs
    qsl = md.query_start_loc[: reqs + 1]
    req_of_token = torch.repeat_interleave(torch.arange(reqs, dtype=torch.int64), qsl[1:] - qsl[:-1])
    offset = torch.arange(n, dtype=torch.int64) - qsl[:-1][req_of_token]
    seq_lens = (md.context_lens[:reqs][req_of_token] + offset + 1).to(torch.int32)
    tables = md.block_table[:reqs].index_select(0, req_of_token.to(md.block_table.device)).to(torch.int32).contiguous()
    return tables, seq_lens


def attach_fused_decode(model: nn.Module, kernels: Any, max_rows: int) -> bool:
    """Install :class:`FusedDecode` on ``model.model`` when it qualifies; returns whether it did."""
    decoder = getattr(model, "model", None)
    reason = FusedDecode.supports(decoder) if decoder is not None else "no decoder"
    if reason is None and max_rows > 0:
        decoder.decode_kernel = FusedDecode(decoder, kernels, max_rows)
        logger.info("Fused decode path on for batches of up to %d requests", max_rows)
        return True
    logger.info("Fused decode path off: %s", reason or "the small-batch linear kernel is off")
    return False
