"""What the config modules share: the accepted values of the flags with a fixed set of choices
(``EngineArgs`` offers them as choices) and the parsing of JSON-object flags."""

from __future__ import annotations

from typing import Any

DTYPES = ("auto", "float32", "bfloat16", "float16", "half", "float")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
"""vLLM's other spellings of a dtype (``--dtype half``), and the canonical names they mean."""
MODEL_IMPLS = ("auto", "host", "transformers")
"""``--model-impl``: a native class, the transformers fallback, or auto (native when registered)."""
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
SCHEDULING_POLICIES = ("fcfs", "priority")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
"""``--kv-cache-dtype``: ``auto`` keeps K/V in the model dtype; ``fp8`` (alias ``fp8_e4m3``) stores them
as float8_e4m3fn with a per-layer scale (docs/quantization.md, "fp8 KV cache")."""
QUANTIZED_ACTIVATIONS = ("none", "q8")
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")
SPEC_METHODS = ("ngram", "draft_model", "eagle")


def json_flag_object(value: Any, flag: str, name: str, known: set[str]) -> dict[str, Any]:
    """A JSON-object flag's value (``--kv-transfer-config '{...}'``) as a dict: a JSON string is
    parsed, a dict taken as it is; bad JSON, a non-object and unknown keys are ``ValueError``s
    naming the flag and the known keys."""
    import json

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{flag} is not valid JSON ({e}): {value!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name}={value!r} must be a JSON object")
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{name} has unknown keys {unknown}; known keys: {', '.join(sorted(known))}")
    return value


def config_from_flag(cls: type, value: Any, flag: str, name: str) -> Any:
    """A config dataclass from a JSON-object flag's value: itself or ``None`` as they are, else
    :func:`json_flag_object` checked against the dataclass's fields."""
    import dataclasses

    if value is None or isinstance(value, cls):
        return value
    return cls(**json_flag_object(value, flag, name, {f.name for f in dataclasses.fields(cls)}))
