"""Pooling parameters of one request: what a pooling model returns for a prompt instead of tokens.

A request carries :class:`PoolingParams` in place of sampling parameters. The engine runs its
whole prompt in one step, the worker's pooler reduces the last hidden states to one vector
(:mod:`host.core.pooling.pooler`), and the request finishes in that step with its blocks freed.

Every bad value raises ``ValueError`` naming the field and what it must be. Checks that need
the model (``dimensions`` against the hidden size) run in :meth:`PoolingParams.verify`, which
the front end calls when the request arrives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POOLING_TASKS = ("embed", "score", "encode")  # "encode": the raw pooled vector, never normalized


@dataclass
class PoolingParams:
    """How to pool one prompt.

    ``task``: ``"embed"`` (the model's pooled embedding, normalized by the model's default),
    ``"score"`` (the same embedding; the caller compares two of them by cosine) or ``"encode"``
    (the raw pooled vector: no normalization unless ``normalize=True``).
    ``normalize``: L2-normalize the vector; ``None`` = the model's default (its
    sentence-transformers ``Normalize`` module, else on for ``embed``/``score``).
    ``dimensions``: keep the first ``dimensions`` values (Matryoshka truncation), re-normalized
    afterwards when normalizing. ``None`` = the full hidden size.
    """

    task: str = "embed"
    normalize: bool | None = None
    dimensions: int | None = None

    def __post_init__(self) -> None:
        if self.task not in POOLING_TASKS:
            raise ValueError(f"task={self.task!r} is not a pooling task; use one of {', '.join(POOLING_TASKS)}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"normalize={self.normalize!r} must be true, false or null (the model's default)")
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int) or self.dimensions < 1
        ):
            raise ValueError(f"dimensions={self.dimensions!r} must be a positive integer or null (the full size)")

    def verify(self, hidden_size: int) -> None:
        """``ValueError`` when ``dimensions`` exceeds the model's embedding size ``hidden_size``."""
        if self.dimensions is not None and self.dimensions > hidden_size:
            raise ValueError(
                f"dimensions={self.dimensions} exceeds the model's embedding size {hidden_size}; "
                f"use dimensions <= {hidden_size} or leave it unset"
            )

    def clone(self) -> PoolingParams:
        return PoolingParams(task=self.task, normalize=self.normalize, dimensions=self.dimensions)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PoolingParams:
        """From a JSON-like dict; unknown keys are a ``ValueError`` listing the valid ones."""
        valid = ("task", "normalize", "dimensions")
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ValueError(f"unknown pooling parameter(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
        return cls(**d)
