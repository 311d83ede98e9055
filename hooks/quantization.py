"""Hooks of the ``host.quantization`` family: quantization methods.

Loaded in the engine process (which resolves each layer's method: ``--quantization``, the
checkpoint's ``quantization_config``, a GGUF's blocks) and in worker processes (which load the
quantized weights and run the linear kernels); the API process loads it on first use, to accept
``--quantization NAME`` for any installed method and to list them (``host platform``).
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.quantization"
LOADED_IN = ("api", "engine", "worker")
LAZY_IN: tuple[str, ...] = ("api",)
SUMMARY = "quantization methods"


@hookspec
def host_register_quantization_methods(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.QuantizationMethod` subclasses.

    Call ``register(method_class)``; ``method_class.name`` is what ``--quantization NAME`` and a
    checkpoint's ``quantization_config.quant_method`` select. The class's ``get_linear_method``
    returns a :class:`host.sdk.LinearMethod` per layer, whose kernels may go through
    :mod:`host.sdk.kernels`. Registering a name twice is an error naming both plugins.
    """
