"""What a platform plugin may change in a loaded model: the decoder type it can recognise and
the per-layer kernels it attaches from the kernel table (``attach_layer_kernels``, in
``Platform.prepare_model``; the kernels themselves are offered through ``host_offer_kernels``); the
quantized layers (``QuantLinear``, ``QuantEmbedding``) its kernels read, and the layer factories a
third-party model class uses to be quantizable (``make_linear``, ``make_embedding``).

Stable re-exports of :mod:`host.core.models`; plugins import them from here, never from the
core. Not imported by ``host.sdk`` itself (this module imports the core, so it is loaded only by
the plugins that use it).
"""

from host.core.models.gguf_file import GGUFTensor
from host.core.models.layers import LAYER_KERNEL_OPS, attach_layer_kernels, set_layer_kernels
from host.core.models.llama import DecoderModel
from host.core.models.quant_linear import QuantEmbedding, QuantLinear, make_embedding, make_linear

__all__ = ["LAYER_KERNEL_OPS", "attach_layer_kernels", "DecoderModel", "GGUFTensor", "QuantEmbedding", "QuantLinear", "make_embedding", "make_linear", "set_layer_kernels"]
