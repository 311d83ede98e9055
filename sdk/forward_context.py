"""The per-step forward context a kernel reads while the model runs (the attention metadata
of the current step, among others).

Stable re-export of :mod:`host.contracts.forward_context`; plugins import it from here, never
from the core. Worker process only. Not imported by ``host.sdk`` itself (see
:mod:`host.sdk.models`).
"""

from host.contracts.forward_context import ForwardContext, get_forward_context

__all__ = ["ForwardContext", "get_forward_context"]
