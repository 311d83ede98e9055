"""What a model is run for (``--runner generate|pooling|auto``, ``--convert embed``) and, for a
pooling model, how its last hidden states become one vector (:class:`PoolerConfig`).

Resolved once at start-up by :func:`resolve_runner` (every process then reads
``config.model.runner`` / ``config.model.pooler``):

- ``auto``: ``pooling`` for an encoder architecture (:data:`POOLING_ARCHITECTURES`, e.g.
  ``BertModel``) or with ``--convert embed``, else ``generate``.
- ``pooling`` on a decoder (``*ForCausalLM``) is ``--convert embed``: its final hidden states
  are pooled (last token by default) instead of sampled from.
- ``generate`` on an encoder is refused: it has no language-model head.

The pooler: ``--pooler-config`` JSON wins, key by key; then the model directory's
sentence-transformers files (``modules.json`` naming a ``Pooling`` module whose
``config.json`` says mean / CLS / last token, and a ``Normalize`` module); then the
defaults: CLS for an encoder, the last token for a converted decoder, normalized.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed")
POOLING_TYPES = ("MEAN", "CLS", "LAST")
POOLING_ARCHITECTURES = ("BertModel",)
"""Encoder architectures: bidirectional, no language-model head; they only pool."""


@dataclass
class PoolerConfig:
    """How the pooler reduces one prompt's hidden states: ``pooling_type`` (MEAN over the
    prompt's tokens, CLS = the first token, LAST = the last token) and ``normalize`` (L2, the
    default of requests that leave ``normalize`` unset). ``source`` says where it came from."""

    pooling_type: str = "LAST"
    normalize: bool = True
    source: str = "default"

    def __post_init__(self) -> None:
        self.pooling_type = str(self.pooling_type).upper()
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooler_config pooling_type={self.pooling_type!r} is not supported; use one of {', '.join(POOLING_TYPES)}"
            )
        if not isinstance(self.normalize, bool):
            raise ValueError(f"pooler_config normalize={self.normalize!r} must be true or false")


def parse_pooler_override(value: dict[str, Any] | str | None) -> dict[str, Any]:
    """``--pooler-config`` (JSON or a dict) as a checked dict; unknown keys are a ValueError."""
    from host.core.config import json_flag_object

    if value is None:
        return {}
    return dict(json_flag_object(value, "--pooler-config", "pooler_config", {"pooling_type", "normalize"}))


def sentence_transformers_pooler(path: str) -> PoolerConfig | None:
    """The pooler a sentence-transformers model directory declares (``modules.json`` with a
    ``Pooling`` module), or ``None`` when it has none."""
    modules_file = os.path.join(path, "modules.json")
    if not os.path.isfile(modules_file):
        return None
    with open(modules_file) as f:
        modules = json.load(f)
    pooling = next((m for m in modules if str(m.get("type", "")).endswith(".Pooling")), None)
    if pooling is None:
        return None
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    cfg_file = os.path.join(path, pooling.get("path", ""), "config.json")
    cfg: dict[str, Any] = {}
    if os.path.isfile(cfg_file):
        with open(cfg_file) as f:
            cfg = json.load(f)
    if cfg.get("pooling_mode_cls_token"):
        kind = "CLS"
    elif cfg.get("pooling_mode_lasttoken"):
        kind = "LAST"
    elif cfg.get("pooling_mode_mean_tokens", True):
        kind = "MEAN"
    else:
        modes = sorted(k for k, v in cfg.items() if k.startswith("pooling_mode") and v)
        raise ValueError(
            f"{cfg_file} asks for pooling {modes}, which is not supported (mean, cls, lasttoken are); "
            'pass --pooler-config \'{"pooling_type": "MEAN"}\' to choose one'
        )
    return PoolerConfig(kind, normalize, source=os.path.relpath(cfg_file, path))


def resolve_runner(
    runner: str, convert: str | None, architecture: str, path: str, pooler_override: dict[str, Any] | str | None = None
) -> tuple[str, PoolerConfig | None]:
    """``(runner, pooler)`` for a model of ``architecture`` in directory ``path``: ``pooler`` is
    ``None`` for a generating model. Bad combinations are a ValueError naming the flag."""
    convert = convert or "auto"
    if runner not in RUNNERS:
        raise ValueError(f"runner={runner!r} is not supported; use one of {', '.join(RUNNERS)}")
    if convert not in CONVERTS:
        raise ValueError(f"convert={convert!r} is not supported; use one of {', '.join(CONVERTS)}")
    encoder = architecture in POOLING_ARCHITECTURES
    if runner == "auto":
        runner = "pooling" if encoder or convert == "embed" else "generate"
    if runner == "generate":
        if encoder:
            raise ValueError(
                f"{architecture} is an encoder: it cannot generate text; run it with --runner pooling (or auto)"
            )
        if convert == "embed":
            raise ValueError("--convert embed makes a pooling model; drop --runner generate or use --runner pooling")
        if pooler_override:
            raise ValueError("--pooler-config applies to pooling models; add --runner pooling or --convert embed")
        return runner, None
    if convert == "none" and not encoder:
        raise ValueError(
            f"--runner pooling on the decoder {architecture} needs --convert embed (its final hidden states "
            "are pooled); drop --convert none"
        )
    override = parse_pooler_override(pooler_override)
    pooler = sentence_transformers_pooler(path) if os.path.isdir(path) else None
    if pooler is None:
        pooler = PoolerConfig("CLS" if encoder else "LAST", True)
    if override:
        merged = {"pooling_type": pooler.pooling_type, "normalize": pooler.normalize, **override}
        pooler = PoolerConfig(merged["pooling_type"], merged["normalize"], source="--pooler-config")
    return runner, pooler


def check_pooling_support(config: Any) -> None:
    """Refuse at start-up what a pooling model cannot combine with (each a ValueError with the
    reason and the fix): speculative decoding, LoRA, pipeline parallelism."""
    if config.model.runner != "pooling":
        return
    if config.speculative is not None:
        raise ValueError("--speculative-config drafts generated tokens; a pooling model generates none: drop it")
    if config.lora is not None:
        raise ValueError("--enable-lora is not supported with a pooling model (--runner pooling); drop it")
    if config.parallel.pipeline_parallel_size > 1:
        raise ValueError("a pooling model runs with --pipeline-parallel-size 1 (the pooler needs every layer's output)")
