"""Which implementation runs an architecture (``--model-impl auto|host|transformers``, vLLM's flag).

- ``host``: the native class a plugin registered for the architecture
  (:mod:`host.core.models.registry`); an architecture without one is a ``ValueError``.
- ``transformers``: the transformers fallback
  (:class:`~host.core.models.transformers_fallback.TransformersForCausalLM`) whenever the
  installed transformers has the architecture's causal LM class, native class or not.
- ``auto`` (the default): the native class when one is registered, else the fallback when
  transformers has the class, else the registry's ``ValueError``.

:func:`choose_model_class` makes the choice (the loader calls it in every worker);
:func:`check_model_impl` makes it once at start-up, stores it as ``model_config.model_impl_used``
and refuses what the fallback cannot run (several ranks, LoRA, an EAGLE head, pooling).
"""

from __future__ import annotations

import logging
from typing import Any

from host.core.config import MODEL_IMPLS
from host.core.models.registry import resolve_model_class, supported_architectures

logger = logging.getLogger("host.models")



def _transformers_has(architecture: str) -> bool:
    from host.core.models.transformers_fallback import transformers_causal_lm_class

    return transformers_causal_lm_class(architecture) is not None


def _fallback_class() -> type:
    from host.core.models.transformers_fallback import TransformersForCausalLM

    return TransformersForCausalLM


def choose_model_class(architecture: str, model_impl: str, hf_config: Any = None) -> tuple[type, str, str]:
    """``(model class, implementation name, reason)`` for ``architecture`` under
    ``--model-impl model_impl``: the name is ``"host"`` or ``"transformers"``; the reason says
    why, for the start-up log. ``hf_config`` is the model's config (unused by the choice itself;
    kept for implementations that decide by it)."""
    if model_impl not in MODEL_IMPLS:
        raise ValueError(f"model_impl={model_impl!r} is not supported; use one of {', '.join(MODEL_IMPLS)} (--model-impl)")
    native = architecture in supported_architectures()
    if model_impl == "transformers":
        if not _transformers_has(architecture):
            import transformers

            raise ValueError(
                f"--model-impl transformers: the installed transformers {transformers.__version__} has no causal LM "
                f"class {architecture!r}; use --model-impl host{' (it is natively supported)' if native else ''} "
                "or a transformers version that has it"
            )
        return _fallback_class(), "transformers", "asked for with --model-impl transformers"
    if native:
        return resolve_model_class([architecture]), "host", f"native implementation of {architecture}"
    if model_impl == "host":
        hint = (
            "; drop --model-impl host (or pass --model-impl transformers) to run it through transformers"
            if _transformers_has(architecture) else ""
        )
        try:
            resolve_model_class([architecture])
        except ValueError as exc:
            raise ValueError(f"--model-impl host: {exc}{hint}") from None
    if _transformers_has(architecture):
        return _fallback_class(), "transformers", f"no native implementation of {architecture}"
    try:
        resolve_model_class([architecture])
    except ValueError as exc:
        import transformers

        raise ValueError(
            f"{exc} The installed transformers {transformers.__version__} has no causal LM class {architecture!r} "
            "either, so --model-impl transformers cannot run it."
        ) from None
    raise AssertionError("unreachable: resolve_model_class found an architecture the registry lacks")


def check_model_impl(config: Any) -> str:
    """Choose the implementation for an engine config at start-up (before workers start): store
    it as ``config.model.model_impl_used``, log it, and refuse the transformers fallback with
    several ranks, LoRA, an EAGLE head or a pooling runner. Returns the implementation name."""
    model = config.model
    _, impl, reason = choose_model_class(model.architecture, model.model_impl, model.hf_config)
    model.model_impl_used = impl
    logger.info("model implementation: %s (%s)", impl, reason)
    if impl != "transformers":
        return impl
    parallel = getattr(config, "parallel", None)
    if parallel is not None and (parallel.tensor_parallel_size > 1 or parallel.pipeline_parallel_size > 1):
        raise ValueError(
            f"--model-impl transformers runs with -tp 1 -pp 1 (got -tp {parallel.tensor_parallel_size} "
            f"-pp {parallel.pipeline_parallel_size}); use one rank, or a natively supported architecture"
        )
    if getattr(config, "lora", None) is not None:
        raise ValueError("--model-impl transformers cannot serve LoRA adapters; drop --enable-lora or use a natively supported architecture")
    speculative = getattr(config, "speculative", None)
    if speculative is not None and speculative.method == "eagle":
        raise ValueError(
            "--model-impl transformers cannot drive an EAGLE head (it reads a native model's embedding and norm); "
            'use --speculative-config \'{"method": "ngram", ...}\' or a natively supported architecture'
        )
    if model.runner == "pooling":
        raise ValueError(
            f"--model-impl transformers generates text only; {model.architecture} cannot run with --runner pooling "
            "(or --convert embed) through it"
        )
    return impl
