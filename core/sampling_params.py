"""Sampling parameters of one request: how to pick tokens and when to stop.

A minimal, validated version; a later issue adds penalties, logit bias, structured output...
Every bad value raises ``ValueError`` naming the field and the range it must lie in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    """Per-request sampling and stopping settings (OpenAI-style names).

    ``max_tokens=None`` means "until EOS, a stop condition or ``max_model_len``".
    ``top_k=0`` (or ``-1``, normalised to 0) disables top-k. ``min_tokens`` tokens are
    generated before EOS or ``stop_token_ids`` may end the request.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    detokenize: bool = True
    skip_special_tokens: bool = True
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        if self.top_k == -1:
            self.top_k = 0
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n={self.n!r} must be an integer >= 1")
        if self.temperature < 0.0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 means greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]; 1 disables nucleus sampling")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be an integer >= 0 (0 or -1 disables top-k)")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} must be an integer or None")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"max_tokens={self.max_tokens!r} must be an integer >= 1 (or None for no limit)")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"min_tokens={self.min_tokens!r} must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens={self.min_tokens} must be <= max_tokens={self.max_tokens}"
            )
        for tok in self.stop_token_ids:
            if not isinstance(tok, int) or tok < 0:
                raise ValueError(f"stop_token_ids contains {tok!r}; every entry must be an integer >= 0")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop contains {s!r}; every entry must be a non-empty string")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise ValueError(f"logprobs={self.logprobs!r} must be an integer >= 0 (or None)")

    @property
    def is_greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature below 1e-5)."""
        return self.temperature < _GREEDY_EPS
