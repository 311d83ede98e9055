"""``gguf``: weights kept in the GGUF block formats they are stored in (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K).

Selected by default for a GGUF source (``--quantization none`` dequantizes instead). Every linear
layer and the token embedding (the tied LM head with it) keep the file's blocks; tensors the file
stores in float (norms, or an F16/F32 projection) or in a block format outside this list are
given to the layer dequantized and computed with ``F.linear``. A fused layer (q/k/v, gate/up)
concatenates shards of one block type into one tensor (``layer.qweights[i]``, ``layer.qtypes[i]``,
``layer.shard_rows[i]`` rows); shards of different types stay separate runs.

With ``--quantized-activations q8`` (``GGUFMethod.activations == "q8"``) every layer computes
through ``host_quant::gguf_linear_q8`` instead: the activation rows are quantized to int8 blocks
of 32 with a float32 scale and multiplied with integer dot products (llama.cpp's scheme; the
layer records it as ``layer.quantized_activations`` for kernels that read layers directly).

The routed experts of a mixture-of-experts layer keep their blocks too (``get_moe_method``:
:class:`host.plugins.quantization.gguf_moe.GGUFMoEMethod`, computing through ``gguf_linear``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from host.plugins.quantization import ops
from host.plugins.quantization.gguf_blocks import BLOCKS, F32, NAMES, embedding_reference
from host.plugins.quantization.gguf_moe import GGUFMoEMethod
from host.sdk.quantization import EmbeddingMethod, QuantizationMethod


def _is_blocks(tensor: Any) -> bool:
    return not isinstance(tensor, torch.Tensor) and hasattr(tensor, "qtype") and tensor.qtype in BLOCKS


class GGUFLinearMethod(EmbeddingMethod):
    """Linear (and embedding) layers over GGUF blocks; the weights are what the file holds."""

    scheme = "gguf"

    def __init__(self, activations: str = "none") -> None:
        self.activations = activations

    def create_weights(self, layer: Any, input_size: int, output_sizes: list[int], params_dtype: torch.dtype) -> None:
        layer.quantized_activations = self.activations
        layer._gguf_pending = [None] * len(output_sizes)
        layer._gguf_device = torch.empty(0).device  # the device the model is built on
        layer.qweights, layer.qtypes, layer.shard_rows = [], [], []

    def load_weight(self, layer: Any, shard: int, tensor: Any) -> None:
        if _is_blocks(tensor):
            layer._gguf_pending[shard] = (tensor.qtype, tensor.data)
        else:
            if hasattr(tensor, "dequantize") and not isinstance(tensor, torch.Tensor):
                tensor = tensor.dequantize(layer.params_dtype)
            layer._gguf_pending[shard] = (F32, tensor.to(layer.params_dtype))

    def process_weights_after_loading(self, layer: Any) -> None:
        runs: list[tuple[int, list[torch.Tensor]]] = []
        for qtype, data in layer._gguf_pending:
            if runs and runs[-1][0] == qtype:
                runs[-1][1].append(data)
            else:
                runs.append((qtype, [data]))
        layer.qweights, layer.qtypes, layer.shard_rows = [], [], []
        for i, (qtype, parts) in enumerate(runs):
            data = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)).contiguous().to(layer._gguf_device)
            layer.register_buffer(f"qweight_{i}", data, persistent=False)
            layer.qweights.append(data)
            layer.qtypes.append(int(qtype))
            layer.shard_rows.append(int(data.shape[0]))
        del layer._gguf_pending

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        q8 = self.activations == "q8"
        if len(layer.qweights) == 1:
            y = self._run(x2, layer.qweights[0], layer.qtypes[0], bias, q8)
        else:
            y = torch.cat([self._run(x2, w, t, None, q8) for w, t in zip(layer.qweights, layer.qtypes)], dim=-1)
            if bias is not None:
                y = y + bias
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def _run(x: torch.Tensor, weight: torch.Tensor, qtype: int, bias: torch.Tensor | None, q8: bool = False) -> torch.Tensor:
        if qtype == F32:
            return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
        return (ops.gguf_linear_q8 if q8 else ops.gguf_linear)(x, weight, qtype, bias)

    def embed(self, layer: Any, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        (weight,), (qtype,) = layer.qweights, layer.qtypes
        if qtype == F32:
            return F.embedding(ids, weight).to(dtype)
        return embedding_reference(ids, weight, qtype, dtype)


class GGUFMethod(QuantizationMethod):
    """Keeps a GGUF file's blocks: no dequantization at load, dequantized in registers by the kernels."""

    name = "gguf"
    online = False
    quantizes_embeddings = True
    summary = "GGUF blocks as stored: " + ", ".join(NAMES.values())
    kept_qtypes: ClassVar[tuple[int, ...]] = tuple(BLOCKS)
    supported_activations: ClassVar[tuple[str, ...]] = ("none", "q8")
    activations: str = "none"  # set from --quantized-activations by the worker's plan

    def get_linear_method(self, layer_name: str) -> GGUFLinearMethod:
        return GGUFLinearMethod(self.activations)

    def get_embedding_method(self, layer_name: str) -> GGUFLinearMethod:
        return GGUFLinearMethod(self.activations)

    def get_moe_method(self, layer_name: str) -> GGUFMoEMethod:
        return GGUFMoEMethod(self.activations)
