"""Linear and embedding layers whose weights belong to a quantization method (worker processes).

The model builds every linear layer through :func:`make_linear` and its token embedding through
:func:`make_embedding`: with no method for that layer name the result is a plain ``nn.Linear`` /
``nn.Embedding`` (so unquantized models are unchanged), otherwise a :class:`QuantLinear` /
:class:`QuantEmbedding` whose ``method`` creates, loads and applies the weights. A fused layer
(q/k/v, gate/up) lists its shards' row counts in ``output_sizes``; the model's weight loader calls
``load_shard(i, tensor)`` for each checkpoint tensor, then :func:`finish_loading` once.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

LinearFor = Callable[[str], Any]
"""``layer name -> LinearMethod | None``: what a model asks the quantization plan (``None``: no plan)."""


class QuantLinear(nn.Module):
    """``y = x @ W^T + b`` with ``W`` held and applied by ``method`` (a ``LinearMethod``).

    ``bias`` is a plain float parameter (loaded like any other); the method's tensors are buffers
    it registers on this module, and it may set the attributes kernels read directly (``scheme``,
    ``qweight``/``scales`` or ``qweights``/``qtypes``/``shard_rows``).
    """

    def __init__(
        self,
        prefix: str,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        dtype: torch.dtype,
        method: Any,
    ) -> None:
        super().__init__()
        self.prefix = prefix
        self.in_features = input_size
        self.output_sizes = list(output_sizes)
        self.out_features = sum(output_sizes)
        self.params_dtype = dtype
        self.method = method
        self.scheme = method.scheme
        self.loaded_shards: set[int] = set()
        self.bias = nn.Parameter(torch.zeros(self.out_features, dtype=dtype)) if bias else None
        method.create_weights(self, input_size, self.output_sizes, dtype)

    def shard_slice(self, shard: int) -> slice:
        start = sum(self.output_sizes[:shard])
        return slice(start, start + self.output_sizes[shard])

    def load_shard(self, shard: int, tensor: Any) -> None:
        rows, cols = tuple(tensor.shape)
        if rows != self.output_sizes[shard] or cols != self.in_features:
            raise ValueError(
                f"checkpoint tensor for {self.prefix} (shard {shard}) has shape {(rows, cols)} but the layer "
                f"expects {(self.output_sizes[shard], self.in_features)}; the weights do not match config.json"
            )
        self.method.load_weight(self, shard, tensor)
        self.loaded_shards.add(shard)

    @property
    def fully_loaded(self) -> bool:
        return self.loaded_shards == set(range(len(self.output_sizes)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x, self.bias)

    def extra_repr(self) -> str:
        return f"{self.prefix}: in={self.in_features}, out={self.out_features}, scheme={self.scheme}, bias={self.bias is not None}"


class QuantEmbedding(nn.Module):
    """A token embedding held by an ``EmbeddingMethod``; also the LM head of a tied model
    (:meth:`linear`)."""

    def __init__(self, prefix: str, num_embeddings: int, embedding_dim: int, dtype: torch.dtype, method: Any) -> None:
        super().__init__()
        self.prefix = prefix
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.in_features = embedding_dim
        self.out_features = num_embeddings
        self.output_sizes = [num_embeddings]
        self.params_dtype = dtype
        self.method = method
        self.scheme = method.scheme
        self.loaded_shards: set[int] = set()
        self.bias = None
        method.create_weights(self, embedding_dim, [num_embeddings], dtype)

    load_shard = QuantLinear.load_shard
    fully_loaded = QuantLinear.fully_loaded

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.method.embed(self, ids, self.params_dtype)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ E^T``: the tied LM head."""
        return self.method.apply(self, x, None)

    def extra_repr(self) -> str:
        return f"{self.prefix}: {self.num_embeddings} x {self.embedding_dim}, scheme={self.scheme}"


def make_linear(
    linear_for: LinearFor | None,
    prefix: str,
    input_size: int,
    output_sizes: list[int],
    bias: bool,
    dtype: torch.dtype,
) -> nn.Module:
    """``nn.Linear`` when the plan has no method for ``prefix``, else a :class:`QuantLinear`."""
    method = None if linear_for is None else linear_for(prefix)
    if method is None:
        return nn.Linear(input_size, sum(output_sizes), bias=bias, dtype=dtype)
    return QuantLinear(prefix, input_size, output_sizes, bias, dtype, method)


def make_embedding(
    embedding_for: LinearFor | None, prefix: str, num_embeddings: int, embedding_dim: int, dtype: torch.dtype
) -> nn.Module:
    method = None if embedding_for is None else embedding_for(prefix)
    if method is None:
        return nn.Embedding(num_embeddings, embedding_dim, dtype=dtype)
    return QuantEmbedding(prefix, num_embeddings, embedding_dim, dtype, method)


def quantized_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (QuantLinear, QuantEmbedding))]


def finish_loading(model: nn.Module) -> None:
    """Let each method repack its loaded weights (``process_weights_after_loading``); a layer with
    a shard never loaded is a ``ValueError`` naming it."""
    missing = [m.prefix for m in quantized_layers(model) if not m.fully_loaded]
    if missing:
        raise ValueError(
            f"the checkpoint has no (or only partial) weights for {len(missing)} quantized layer(s), "
            f"e.g. {', '.join(missing[:6])}; is the checkpoint complete and does it match config.json?"
        )
    for module in quantized_layers(model):
        module.method.process_weights_after_loading(module)


def weight_bytes(model: nn.Module) -> int:
    """Bytes the model's weights occupy: parameters and buffers (quantized blocks and scales
    included; a tied LM head counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        try:
            key = tensor.data_ptr()
        except RuntimeError:  # an opaque tensor (oneDNN's packed layout) has no data pointer
            key = id(tensor)
        if key in seen or tensor.numel() == 0:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total
