"""Hooks of the ``host.quantization`` family: quantization methods.

Loaded in the engine process (which resolves the method from the checkpoint's
``quantization_config``) and in worker processes (which load the quantized weights and run the
linear kernels).
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.quantization"
LOADED_IN = ("engine", "worker")
LAZY_IN: tuple[str, ...] = ()
SUMMARY = "quantization methods"


@hookspec
def host_register_quantization_methods(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.QuantizationMethod` subclasses.

    Call ``register(method_class)``; ``method_class.name`` is what a checkpoint's
    ``quantization_config.quant_method`` matches (an engine setting that names a method
    explicitly comes with the issue that wires quantization into the engine). Registering a name
    twice is an error naming both plugins.
    """
