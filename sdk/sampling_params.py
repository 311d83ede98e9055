"""The request parameters a plugin builds or reads: :class:`SamplingParams` and the
structured-output constraint inside it, and :class:`BeamSearchParams` (``use_beam_search``,
``BeamSearchParams.from_sampling_params``) with the :class:`BeamCompletion` outputs it yields.

Stable re-export of :mod:`host.contracts.sampling_params` and :mod:`host.core.frontend.beam_search`;
plugins import them from here, never from the core. Not imported by ``host.sdk`` itself (see :mod:`host.sdk.models`).
"""

from host.contracts.sampling_params import SamplingParams, StructuredOutputsParams
from host.core.frontend.beam_search import BeamCompletion, BeamSearchParams

__all__ = ["BeamCompletion", "BeamSearchParams", "SamplingParams", "StructuredOutputsParams"]
