"""What a pooling request returns to the caller: the pooled vector of its prompt.

:class:`PoolingRequestOutput` is what ``AsyncLLM.encode`` yields (once, finished) and
``LLM.encode`` returns; :class:`EmbeddingRequestOutput` is ``LLM.embed``'s view of the same
result with ``.outputs.embedding`` (vLLM's shape).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PoolingOutput:
    """The pooled vector of one prompt, float32 values as Python floats."""

    data: list[float]


@dataclass
class PoolingRequestOutput:
    """The result of one pooling request: the prompt's token ids and its pooled vector."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: PoolingOutput
    finished: bool = True
    prompt: str | None = None


@dataclass
class EmbeddingOutput:
    """One prompt's embedding (``len(embedding)`` = the model's size or the requested ``dimensions``)."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """``LLM.embed``'s result for one prompt."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True
    prompt: str | None = None

    @classmethod
    def from_pooling(cls, out: PoolingRequestOutput) -> EmbeddingRequestOutput:
        return cls(out.request_id, out.prompt_token_ids, EmbeddingOutput(out.outputs.data), out.finished, out.prompt)
