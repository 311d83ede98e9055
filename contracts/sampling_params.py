"""Sampling parameters of one request: how to pick tokens, what to report and when to stop.

Every bad value raises ``ValueError`` naming the field and the range it must lie in. Checks
that need the model (token ids against the vocabulary) run in :meth:`SamplingParams.verify`,
which the engine calls when the request arrives.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

_GREEDY_EPS = 1e-5
MAX_LOGPROBS = 20  # the default of --max-logprobs (vLLM's); the input processor applies the limit
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1  # every integer a request carries fits in 64 bits (it crosses to the engine)
FLOAT32_MAX = 3.4028234663852886e38  # the engine samples in float32: a larger value becomes inf there


def check_int(name: str, value: Any, lo: int = INT64_MIN, hi: int = INT64_MAX, hint: str = "") -> int:
    """``value`` as an ``int`` in ``[lo, hi]``, or ``ValueError`` naming ``name``, the range and
    the bound it broke as pydantic's error type (``[type=greater_than_equal]``,
    ``[type=less_than_equal]``, ``[type=int_type]``), the words vLLM's pydantic errors carry
    and clients match on."""
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "int_type"
    elif value < lo:
        kind = "greater_than_equal"
    elif value > hi:
        kind = "less_than_equal"
    else:
        return value
    raise ValueError(f"{name}={value!r} must be an integer in [{lo}, {hi}]{hint} [type={kind}]")


def check_finite(name: str, value: Any) -> float:
    """``value`` as a finite ``float`` that float32 holds, or ``ValueError`` naming ``name``
    (NaN and infinities, including JSON's ``1e400``, are refused, and so is ``1e300``: the
    sampler's float32 tensors would hold it as infinity, and ``-inf / inf`` masks nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={value!r} must be a number")
    try:
        out = float(value)
    except OverflowError:  # an int beyond float's range
        out = math.inf
    if not math.isfinite(out) or abs(out) > FLOAT32_MAX:
        raise ValueError(
            f"{name}={value!r} must be a finite number (not NaN or infinity) of magnitude at most "
            f"{FLOAT32_MAX:.4g} (the engine samples in float32)"
        )
    return out


def _logit_bias(bias: Any) -> dict[int, float]:
    """``logit_bias`` with integer keys, or ``ValueError`` naming every key that is not a token id
    (an integer, or a string of one) and every value that is not a number."""
    try:
        items = list(dict(bias).items())
    except (TypeError, ValueError):
        raise ValueError("logit_bias must map token ids (integers, or strings of integers) to numbers") from None
    out: dict[int, float] = {}
    bad_keys, bad_values = [], []
    for key, value in items:
        try:
            tok = key if isinstance(key, int) and not isinstance(key, bool) else int(str(key).strip())
        except ValueError:
            bad_keys.append(key)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad_values.append(key)
            continue
        out[tok] = float(value)
    if bad_keys:
        raise ValueError(
            f"logit_bias has keys that are not token ids: {', '.join(repr(k) for k in bad_keys[:10])}; "
            "each key must be a token id (an integer, or a string of one)"
        )
    if bad_values:
        raise ValueError(f"logit_bias values for {', '.join(repr(k) for k in bad_values[:10])} must be numbers")
    return out


@dataclass
class StructuredOutputsParams:
    """One output constraint: a JSON schema (dict or JSON string), any JSON object
    (``json_object=True``), a regular expression, a choice among strings, or an EBNF grammar
    (GBNF dialect, as xgrammar reads it). Exactly one must be set.

    ``reasoning_end_token_ids``: the constraint applies only after the output has generated
    these tokens in a row (a reasoning parser's end tag, e.g. ``</think>``); until then the
    output is free. ``None``: from the first token."""

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    reasoning_end_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        given = [
            name
            for name, value in (
                ("json", self.json),
                ("json_object", self.json_object or None),
                ("regex", self.regex),
                ("choice", self.choice),
                ("grammar", self.grammar),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "structured_outputs must set exactly one of json, json_object, regex, choice, grammar; "
                f"got {given or 'none'}"
            )
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise ValueError("structured_outputs.json must be a JSON schema object")
        if self.choice is not None:
            if not isinstance(self.choice, list) or not self.choice or not all(isinstance(c, str) for c in self.choice):
                raise ValueError("structured_outputs.choice must be a non-empty list of strings")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")
        end = self.reasoning_end_token_ids
        if end is not None:
            if not isinstance(end, (list, tuple)) or not end or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in end):
                raise ValueError(
                    f"structured_outputs.reasoning_end_token_ids={end!r} must be a non-empty list of token ids (ints >= 0), or None"
                )
            self.reasoning_end_token_ids = list(end)

    @property
    def kind(self) -> str:
        for name in ("json", "regex", "choice", "grammar"):
            if getattr(self, name) is not None:
                return name
        return "json_object"

    def key(self) -> tuple[str, str]:
        """A hashable identity of the constraint (compiled grammars are cached by it)."""
        kind = self.kind
        value: Any = {"json": self.json, "regex": self.regex, "choice": self.choice, "grammar": self.grammar}.get(kind)
        return kind, json.dumps(value, sort_keys=True)


@dataclass
class SamplingParams:
    """Per-request sampling and stopping settings (OpenAI / vLLM names).

    Sampling runs in this order over the raw logits (see :mod:`host.core.worker.sampler`): allowed
    token ids, bad words, ``min_tokens`` and ``logit_bias``, penalties, temperature (below 1e-5
    means greedy), ``min_p``, ``top_k``, ``top_p``, then the draw. ``logprobs`` and
    ``prompt_logprobs`` report the raw model distribution (before any of those steps).

    ``max_tokens=None`` means "until EOS, a stop condition or ``max_model_len``". ``top_k`` 0 or
    -1 disables top-k. ``min_tokens`` tokens are generated before EOS, ``stop_token_ids`` or a
    ``stop`` string may end the request. With ``n > 1`` the prompt's KV blocks are shared by
    the ``n`` samples through the prefix cache; a ``seed`` then seeds sample ``i`` with
    ``seed + i``.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = field(default_factory=list)
    stop_token_ids: list[int] | None = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | dict[str, Any] | None = None
    detokenize: bool = True
    # filled by the engine front end from bad_words and the tokenizer
    bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        self.bad_words = None if self.bad_words is None else list(self.bad_words)
        if self.top_k == -1:
            self.top_k = 0
        if isinstance(self.structured_outputs, dict):
            known = {"json", "json_object", "regex", "choice", "grammar", "reasoning_end_token_ids"}
            unknown = sorted(set(self.structured_outputs) - known)
            if unknown:
                raise ValueError(
                    f"structured_outputs has unknown key(s) {unknown}; use one of {', '.join(sorted(known))}"
                )
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias(self.logit_bias)
        self._validate()

    def _validate(self) -> None:
        def number(name: str) -> float:
            return check_finite(name, getattr(self, name))

        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n={self.n!r} must be an integer >= 1")
        check_int("n", self.n, 1)
        if number("temperature") < 0.0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 means greedy)")
        if not 0.0 < number("top_p") <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]; 1 disables nucleus sampling")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be an integer >= 1, or 0 / -1 to disable top-k")
        check_int("top_k", self.top_k, 0, hint="; 0 or -1 disables top-k")
        if not 0.0 <= number("min_p") <= 1.0:
            raise ValueError(f"min_p={self.min_p} must be in [0, 1]; 0 disables it")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= number(name) <= 2.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in [-2, 2]; 0 disables it")
        if not number("repetition_penalty") > 0.0:
            raise ValueError(f"repetition_penalty={self.repetition_penalty} must be > 0; 1 disables it")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed={self.seed!r} must be an integer or None")
        if self.seed is not None:  # sample i of n draws with seed + i
            check_int("seed", self.seed, INT64_MIN, INT64_MAX - (self.n - 1), hint=f" with n={self.n} (64-bit)")
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            raise ValueError(f"max_tokens={self.max_tokens!r} must be an integer >= 1 (or None for no limit)")
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, 1, hint=" (or None for no limit)")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"min_tokens={self.min_tokens!r} must be an integer >= 0")
        check_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} must be <= max_tokens={self.max_tokens}")
        for tok in self.stop_token_ids:
            if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                raise ValueError(f"stop_token_ids contains {tok!r}; every entry must be an integer >= 0")
            check_int("stop_token_ids entry", tok, 0)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop contains {s!r}; every entry must be a non-empty string")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                # the engine's --max-logprobs bounds it further (InputProcessor.validate)
                check_int(name, value, -1, hint=" (-1: the whole vocabulary), or None")
        for tok, bias in (self.logit_bias or {}).items():
            if tok < 0:
                raise ValueError(f"logit_bias has token id {tok}; token ids are >= 0")
            check_int("logit_bias token id", tok, 0)
            if not -100.0 <= check_finite(f"logit_bias[{tok}]", bias) <= 100.0:
                raise ValueError(f"logit_bias[{tok}]={bias} must be in [-100, 100]")
        if self.allowed_token_ids is not None:
            ids = list(self.allowed_token_ids)
            if not ids:
                raise ValueError("allowed_token_ids is empty; give at least one token id, or None for no restriction")
            for tok in ids:
                if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                    raise ValueError(f"allowed_token_ids contains {tok!r}; every entry must be an integer >= 0")
                check_int("allowed_token_ids entry", tok, 0)
            self.allowed_token_ids = ids
        for word in self.bad_words or []:
            if not isinstance(word, str) or not word:
                raise ValueError(f"bad_words contains {word!r}; every entry must be a non-empty string")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams or a dict of its fields")

    def verify(self, vocab_size: int) -> None:
        """Model-dependent checks: every token id named by these params is in the vocabulary."""
        def check(name: str, ids: Any) -> None:
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                shown = ", ".join(str(t) for t in sorted(bad)[:10]) + (f" (and {len(bad) - 10} more)" if len(bad) > 10 else "")
                raise ValueError(f"{name} has token ids out of vocabulary (the vocabulary is [0, {vocab_size})): {shown}")

        check("logit_bias", (self.logit_bias or {}).keys())
        check("allowed_token_ids", self.allowed_token_ids or [])
        check("stop_token_ids", self.stop_token_ids)
        for word in self.bad_words_token_ids:
            check("bad_words", word)
        so = self.structured_outputs
        if isinstance(so, StructuredOutputsParams) and so.reasoning_end_token_ids:
            check("structured_outputs.reasoning_end_token_ids", so.reasoning_end_token_ids)

    @property
    def is_greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature below 1e-5)."""
        return self.temperature < _GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def needs_history(self) -> bool:
        """Whether sampling this request's next token reads the tokens it generated so far
        (penalties, bad words, min_tokens, a seeded generator keyed by the output count, a
        grammar): such a request needs them all on the host before its step is planned, so
        asynchronous scheduling steps aside while it runs."""
        return (
            self.has_penalties
            or bool(self.bad_words_token_ids)
            or self.min_tokens > 0
            or (self.seed is not None and not self.is_greedy)
            or self.structured_outputs is not None
        )

    @property
    def max_stop_len(self) -> int:
        return max((len(s) for s in self.stop), default=0)

    def clone_for_sample(self, index: int) -> "SamplingParams":
        """The params of sample ``index`` of an ``n > 1`` request: ``n=1`` and, when seeded,
        ``seed + index`` (so the samples differ but stay reproducible)."""
        import copy

        child = copy.copy(self)
        child.n = 1
        if self.seed is not None:
            child.seed = self.seed + index
        return child
