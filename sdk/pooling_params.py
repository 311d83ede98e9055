"""The pooling request parameters and outputs a plugin builds or reads: :class:`PoolingParams`
(task, normalize, dimensions) and :class:`PoolingRequestOutput` / :class:`PoolingOutput` (what
``AsyncLLM.encode`` yields), :class:`EmbeddingRequestOutput` (what ``LLM.embed`` returns).

Stable re-export of :mod:`host.contracts.pooling_params` and :mod:`host.core.pooling.output`;
plugins import them from here, never from the core. Not imported by ``host.sdk`` itself.
"""

from host.contracts.pooling_params import POOLING_TASKS, PoolingParams
from host.core.pooling.output import (
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
)

__all__ = [
    "POOLING_TASKS",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "PoolingOutput",
    "PoolingParams",
    "PoolingRequestOutput",
]
