"""``--speculative-config``: speculative decoding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from host.core.config.common import SPEC_METHODS, config_from_flag


@dataclass
class SpeculativeConfig:
    """``--speculative-config``: speculative decoding (docs/speculative.md; vLLM's keys).

    ``method``: ``ngram`` (prompt lookup: the tokens that followed the longest earlier
    occurrence of the sequence's last n-gram, n from ``prompt_lookup_max`` down to
    ``prompt_lookup_min``), ``draft_model`` (a small model of the same vocabulary, ``model``) or
    ``eagle`` (an EAGLE head, ``model``). ``num_speculative_tokens``: the drafts per step (k).
    The auto-off: a request whose moving acceptance rate over its last
    ``auto_off_window`` drafted steps falls below ``auto_off_threshold`` gets no drafts for
    ``auto_off_probe_steps`` steps, then is probed again (``auto_off_threshold`` 0: never off).
    ``disable_by_batch_size``: no drafts in a step whose running requests are at least this
    many (speculation pays at small batches).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    model: str | None = None
    auto_off_threshold: float = 0.2  # bench/spec_decode.py: 0.3 turned drafts off in dips they recover from
    auto_off_window: int = 8
    auto_off_probe_steps: int = 32
    disable_by_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(
                f"speculative_config method={self.method!r} is not one of {', '.join(SPEC_METHODS)} "
                '(e.g. --speculative-config \'{"method": "ngram", "num_speculative_tokens": 4}\')'
            )
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 32:
            raise ValueError(f"speculative_config num_speculative_tokens={k!r} must be an integer from 1 to 32")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (lo, hi)) or lo > hi:
            raise ValueError(
                f"speculative_config prompt_lookup_min={lo!r}, prompt_lookup_max={hi!r} must be integers "
                "with 1 <= prompt_lookup_min <= prompt_lookup_max"
            )
        if self.method in ("draft_model", "eagle") and not self.model:
            raise ValueError(
                f"speculative_config method={self.method!r} needs model (the draft's directory), e.g. "
                f'{{"method": "{self.method}", "model": "/path/to/draft", "num_speculative_tokens": 4}}'
            )
        if self.method == "ngram" and self.model:
            raise ValueError(
                f"speculative_config model={self.model!r} is not used by method 'ngram'; drop it, or use "
                "method draft_model / eagle"
            )
        t = self.auto_off_threshold
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0.0 <= t <= 1.0:
            raise ValueError(
                f"speculative_config auto_off_threshold={self.auto_off_threshold!r} must be from 0 to 1 (0: never off)"
            )
        for name in ("auto_off_window", "auto_off_probe_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative_config {name}={value!r} must be an integer >= 1")
        b = self.disable_by_batch_size
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise ValueError(f"speculative_config disable_by_batch_size={b!r} must be an integer >= 1 or unset")

    @property
    def kv_lookahead(self) -> int:
        """KV slots past a step's scheduled tokens that the proposer writes while drafting (the
        scheduler allocates them when blocks are free): k for draft_model, k - 1 for eagle (the
        model drafters' chain, core/spec_decode/worker/draft_model.py), none for ngram."""
        return {"draft_model": self.num_speculative_tokens, "eagle": self.num_speculative_tokens - 1}.get(self.method, 0)

    @classmethod
    def from_value(cls, value: "SpeculativeConfig | dict[str, Any] | str | None") -> "SpeculativeConfig | None":
        """A config from a dict, a JSON string (the flag), itself, or None (no speculation).
        Unknown keys are a ValueError naming the known ones."""
        return config_from_flag(cls, value, "--speculative-config", "speculative_config")
