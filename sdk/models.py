"""What a platform plugin may change in a loaded model: the decoder type it can recognise and
the per-layer kernel hooks it can fill (``Platform.prepare_model`` is where it does so).

Stable re-exports of :mod:`host.core.models`; plugins import them from here, never from the
core. Not imported by ``host.sdk`` itself (the core imports ``host.sdk``, so this module,
which imports the core, is loaded only by the plugins that use it).
"""

from host.core.models.layers import set_layer_kernels
from host.core.models.llama import DecoderModel

__all__ = ["DecoderModel", "set_layer_kernels"]
