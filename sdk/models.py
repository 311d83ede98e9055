"""What a model plugin builds an architecture from, and what a platform plugin may change in a
loaded model.

For a ``host.models`` plugin: the base class :class:`ModelForCausalLM` (the contract, with
default ``compute_logits`` / ``load_weights``), the paged :class:`Attention` layer (the one piece
every architecture must use: it reads and writes the KV cache of its ``layer_idx``), the layers
host's own models use (:class:`RMSNorm`, :class:`RotaryEmbedding` with
``rope_parameters_from_config``, :class:`SiluAndMul`), the quantizable layer factories
(``make_linear``, ``make_embedding``), :class:`ModelShard` (a rank's place under -tp/-pp) and
host's Llama implementation (:class:`LlamaForCausalLM`, :class:`DecoderModel`) to subclass.

For a platform plugin: the per-layer kernels it attaches from the kernel table
(``attach_layer_kernels``, in ``Platform.prepare_model``; the kernels themselves are offered
through ``host_offer_kernels``) and the quantized layers (``QuantLinear``, ``QuantEmbedding``) its
kernels read.

Stable re-exports of :mod:`host.core.models`; plugins import them from here, never from the
core. Not imported by ``host.sdk`` itself (this module imports the core, so it is loaded only by
the plugins that use it).
"""

from host.core.models.attention_layer import Attention
from host.core.models.gguf_file import GGUFTensor
from host.core.models.layers import (
    LAYER_KERNEL_OPS,
    RMSNorm,
    RotaryEmbedding,
    SiluAndMul,
    attach_layer_kernels,
    rope_parameters_from_config,
    set_layer_kernels,
)
from host.core.models.llama import DecoderAttention, DecoderModel, LlamaForCausalLM
from host.core.models.parallel_layers import ModelShard
from host.core.models.quant_linear import QuantEmbedding, QuantLinear, make_embedding, make_linear
from host.interfaces.model import ModelForCausalLM

__all__ = [
    "LAYER_KERNEL_OPS", "Attention", "DecoderAttention", "DecoderModel", "GGUFTensor", "LlamaForCausalLM", "ModelForCausalLM",
    "ModelShard", "QuantEmbedding", "QuantLinear", "RMSNorm", "RotaryEmbedding", "SiluAndMul",
    "attach_layer_kernels", "make_embedding", "make_linear", "rope_parameters_from_config", "set_layer_kernels",
]
