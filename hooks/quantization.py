"""Hooks of the ``host.quantization`` family: quantization methods.

Loaded in the engine process (which resolves the method from the checkpoint or ``--quantization``)
and in worker processes (which load the quantized weights and run the linear kernels).
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec


@hookspec
def host_register_quantization_methods(register: Callable[..., None]) -> None:
    """Offer :class:`host.sdk.QuantizationMethod` subclasses.

    Call ``register(method_class)``; ``method_class.name`` is what ``--quantization`` and a
    checkpoint's ``quantization_config.quant_method`` match. Registering a name twice is an error
    naming both plugins.
    """
