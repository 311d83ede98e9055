"""The request parameters a plugin builds or reads: :class:`SamplingParams` and the
structured-output constraint inside it.

Stable re-export of :mod:`host.core.sampling_params`; plugins import them from here, never
from the core. Not imported by ``host.sdk`` itself (see :mod:`host.sdk.models`).
"""

from host.core.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["SamplingParams", "StructuredOutputsParams"]
