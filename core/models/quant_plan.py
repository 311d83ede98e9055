"""Which quantization method each layer uses: resolved once in the engine process, applied by workers.

:func:`resolve_quant_plan` decides the method (seed §11.1, in our terms):

1. ``--quantization NAME`` / ``LLM(quantization=NAME)``: that registered method; ``none`` turns
   quantization off (a GGUF source is then dequantized at load);
2. else the checkpoint's ``quantization_config.quant_method`` (a method may claim another name
   through ``override_quantization_method``); a method no plugin registers that the model's
   loader dequantizes itself (:data:`DEQUANTIZED_AT_LOAD`: gpt-oss's MXFP4 experts) loads as an
   unquantized model, with one log line;
3. else a GGUF source (a ``.gguf`` file, or the default model's directory, which keeps its GGUF
   blocks next to the converted weights): ``gguf``, the blocks kept as stored;
4. else none.

``ignore`` (layers left in float) and ``targets`` (layer pattern -> method for those layers;
exclusive with ``--quantization``) refine it per layer. A pattern is an exact
layer name, ``re:<regex>`` (validated when the config is built) or an fnmatch pattern (``*``);
it matches our fused layer names (``model.layers.3.self_attn.qkv_proj``) and the Hugging Face
names they are built from (``...q_proj``). A pattern that matches no layer is logged as a warning:
that layer set stays unquantized, which is the production pitfall the seed warns about.

A method the platform cannot run is a ``ValueError`` at start-up naming the methods that can.
Workers turn the plan into method objects with :meth:`QuantPlan.bind` (their own registry).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

from host.core.config.quantization import compile_pattern

logger = logging.getLogger("host.quantization")

NONE = "none"
GGUF = "gguf"
# our fused layer suffix -> the Hugging Face layer suffixes it is built from
_FUSED_ALIASES = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
EMBEDDING = "model.embed_tokens"
DEQUANTIZED_AT_LOAD = {"mxfp4": ("GptOssForCausalLM",)}
"""Checkpoint ``quant_method`` -> the architectures whose weight loading dequantizes it to the
model dtype (so the plan needs no method for it): gpt-oss's MXFP4 experts
(:func:`host.core.models.gpt_oss.dequantize_mxfp4`; keeping them packed is issue 39)."""


HOST_FILES_DIR = ".host"
"""The subfolder of a converted model directory (the default model's, Gemma-3-270M's) holding host's
own files: the GGUF link ``model.gguf``, its block cache and ``host_conversion.json``. The folder
itself holds only Hugging Face files, so transformers or vLLM load it as it is."""


def gguf_source(path: str | None) -> str | None:
    """The GGUF file behind a model path: the path itself for a ``.gguf`` file, a converted
    directory's ``.host/model.gguf``, a directory's own ``model.gguf``, else ``None``."""
    if not path:
        return None
    if path.lower().endswith(".gguf") and os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        return None
    for candidate in (os.path.join(path, HOST_FILES_DIR, "model.gguf"), os.path.join(path, "model.gguf")):
        if os.path.isfile(candidate):
            return candidate
    return None


def layer_aliases(name: str) -> tuple[str, ...]:
    """``name`` and the Hugging Face names of the layers fused into it."""
    for fused, parts in _FUSED_ALIASES.items():
        if name.endswith(fused):
            base = name[: -len(fused)]
            return (name, *(base + part for part in parts))
    return (name,)


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether ``pattern`` (exact, ``re:`` regex matched from the start, or fnmatch) matches
    layer ``name`` or one of the Hugging Face names fused into it."""
    compiled = compile_pattern(pattern)
    for candidate in layer_aliases(name):
        if isinstance(compiled, re.Pattern):
            if compiled.match(candidate):
                return True
        elif compiled == candidate or fnmatch.fnmatchcase(candidate, compiled):
            return True
    return False


def model_layer_names(hf_config: Any) -> list[str]:
    """The linear and embedding layer names of a Llama-family model built from ``hf_config``
    (for the plan's summary and pattern checks; other architectures resolve per layer at build)."""
    names = [EMBEDDING]
    for i in range(int(getattr(hf_config, "num_hidden_layers", 0) or 0)):
        prefix = f"model.layers.{i}"
        names += [f"{prefix}.self_attn.qkv_proj", f"{prefix}.self_attn.o_proj", f"{prefix}.mlp.gate_up_proj", f"{prefix}.mlp.down_proj"]
    if not getattr(hf_config, "tie_word_embeddings", False):
        names.append("lm_head")
    return names


def _checkpoint_quant_config(hf_config: Any) -> dict[str, Any] | None:
    quant = getattr(hf_config, "quantization_config", None)
    if quant is None:
        return None
    if not isinstance(quant, dict):
        quant = quant.to_dict() if hasattr(quant, "to_dict") else dict(vars(quant))
    return dict(quant)


@dataclass
class QuantPlan:
    """The resolved plan: ``method`` for every layer except those ``ignore`` and ``targets`` decide.

    ``method_config`` is what ``QuantizationMethod.from_config`` receives (the checkpoint's
    ``quantization_config``, or ``{}``). Plain data, so it travels to worker processes.
    """

    method: str | None = None
    method_config: dict[str, Any] = field(default_factory=dict)
    ignore: list[str] = field(default_factory=list)
    targets: dict[str, str] = field(default_factory=dict)
    source: str = "none"
    gguf_path: str | None = None
    activations: str = "none"  # --quantized-activations: handed to each method as ``method.activations``

    @property
    def quantized(self) -> bool:
        return self.method is not None or any(m != NONE for m in self.targets.values())

    @property
    def keeps_gguf_blocks(self) -> bool:
        """Whether weights load from the GGUF source as stored (some layer uses ``gguf``)."""
        return self.gguf_path is not None and (self.method == GGUF or GGUF in self.targets.values())

    def method_name_for(self, layer: str) -> str | None:
        """The method that layer ``layer`` uses (``None``: unquantized): ``ignore`` first, then the
        first matching target, else the plan's method."""
        if any(pattern_matches(p, layer) for p in self.ignore):
            return None
        for pattern, method in self.targets.items():
            if pattern_matches(pattern, layer):
                return None if method == NONE else method
        return self.method

    def bind(self, registry: dict[str, Any]) -> "BoundQuantPlan":
        return BoundQuantPlan(self, registry)

    def describe(self) -> str:
        if not self.quantized:
            return f"none ({self.source})"
        extra = ""
        if self.ignore:
            extra += f", ignore {self.ignore}"
        if self.targets:
            extra += f", targets {self.targets}"
        return f"{self.method or 'per target'} ({self.source}{extra})"


class BoundQuantPlan:
    """A plan with its method objects, built from this process's ``quantization_methods`` registry:
    what the model asks for each layer (``linear_method(name)``, ``embedding_method(name)``,
    ``moe_method(name)``)."""

    def __init__(self, plan: QuantPlan, registry: dict[str, Any]) -> None:
        self.plan = plan
        self._methods: dict[str, Any] = {}
        for name in {plan.method, *plan.targets.values()} - {None, NONE}:
            cls = registry.get(name)
            if cls is None:
                raise ValueError(
                    f"quantization method {name!r} is not registered in this worker process; registered: "
                    f"{', '.join(sorted(registry)) or 'none'} (is its plugin allowed here?)"
                )
            self._methods[name] = cls.from_config(plan.method_config if name == plan.method else {})
            if plan.activations != "none":
                self._methods[name].activations = plan.activations

    def _method(self, layer: str) -> Any:
        name = self.plan.method_name_for(layer)
        return None if name is None else self._methods[name]

    def linear_method(self, layer: str) -> Any:
        method = self._method(layer)
        return None if method is None else method.get_linear_method(layer)

    def embedding_method(self, layer: str) -> Any:
        method = self._method(layer)
        return None if method is None else method.get_embedding_method(layer)

    def moe_method(self, layer: str) -> Any:
        """The MoE method owning the routed experts of ``layer`` (``model.layers.3.mlp.experts``),
        or ``None``: unquantized, or the layer's method keeps experts float."""
        method = self._method(layer)
        get = None if method is None else getattr(method, "get_moe_method", None)
        return None if get is None else get(layer)

    def kept_gguf_qtypes(self) -> tuple[int, ...]:
        """The GGUF block types the plan's methods keep as stored (the others are dequantized)."""
        kept: set[int] = set()
        for method in self._methods.values():
            kept.update(getattr(method, "kept_qtypes", ()))
        return tuple(sorted(kept))


def resolve_quant_plan(config: Any, registry: dict[str, Any], platform: Any) -> QuantPlan:
    """The plan for ``config`` (an ``EngineConfig``) on ``platform`` with the registered methods.

    Raises ``ValueError`` for an unknown method (listing the registered ones), a checkpoint
    quantized with a method nobody registered, or a method the platform cannot run (naming those
    that can)."""
    qc = config.quant
    model = config.model
    path = model.resolved_path or model.model
    gguf_path = gguf_source(path)
    hf_quant = _checkpoint_quant_config(model.hf_config)
    choice = qc.quantization
    method: str | None
    method_config: dict[str, Any] = {}
    if choice is not None and choice != NONE:
        if choice not in registry:
            raise ValueError(
                f"quantization={choice!r} is not a registered method; registered: {', '.join(sorted(registry)) or 'none'}, "
                "or 'none' (host plugins list shows the host.quantization plugins)"
            )
        method, source = choice, f"--quantization {choice}"
    elif choice == NONE:
        method, source = None, "--quantization none"
    elif hf_quant is not None:
        wanted = str(hf_quant.get("quant_method", "")).lower()
        claimed = [cls.name for cls in registry.values() if cls.override_quantization_method(hf_quant, choice)]
        method = claimed[0] if claimed else wanted
        architectures = set(getattr(model.hf_config, "architectures", None) or [])
        if method not in registry and architectures & set(DEQUANTIZED_AT_LOAD.get(wanted, ())):
            logger.info(
                "the checkpoint's %s weights are dequantized to the model dtype at load (no %s method is registered)",
                wanted, wanted,
            )
            method, source = None, f"the checkpoint's {wanted} weights, dequantized at load"
        elif method not in registry:
            raise ValueError(
                f"the checkpoint is quantized with quant_method={wanted!r}, which no registered method runs; "
                f"registered: {', '.join(sorted(registry)) or 'none'} (install a host.quantization plugin for it)"
            )
        else:
            method_config, source = hf_quant, "the checkpoint's quantization_config"
    elif gguf_path is not None and GGUF in registry:
        method, source = GGUF, "a GGUF source, blocks kept as stored"
    else:
        method, source = None, "an unquantized checkpoint"
    if qc.targets and choice is not None and choice != NONE:
        raise ValueError(
            "quantization targets and --quantization are exclusive (which wins for a layer would be "
            "ambiguous); give the method per target instead, e.g. {\"targets\": {\"re:.*mlp.*\": \"int8\"}}"
        )
    if qc.targets and hf_quant is not None:
        raise ValueError(
            "quantization targets pick online methods for float weights (or GGUF layers); this checkpoint is "
            f"already quantized with {method!r}: drop the targets"
        )
    for name in set(qc.targets.values()) - {NONE}:
        if name not in registry:
            raise ValueError(f"quantization target method {name!r} is not registered; registered: {', '.join(sorted(registry))}")
    plan = QuantPlan(
        method=method,
        method_config=method_config,
        ignore=list(qc.ignore),
        targets=dict(qc.targets),
        source=source,
        gguf_path=gguf_path,
        activations=getattr(qc, "activations", "none"),
    )
    if (plan.method == GGUF or GGUF in plan.targets.values()) and gguf_path is None:
        raise ValueError(
            f"quantization 'gguf' loads weights stored in GGUF blocks, but {path} is not a .gguf file; "
            "pass a .gguf model, or an online method such as --quantization int8"
        )
    _check_platform(plan, registry, platform, model.dtype)
    _check_activations(plan, registry)
    _warn_unmatched(plan, model.hf_config)
    logger.info("quantization: %s", plan.describe())
    return plan


def runnable_methods(registry: dict[str, Any], platform: Any, dtype: str) -> list[str]:
    """The registered methods that can run on ``platform`` in ``dtype``."""
    return sorted(name for name, cls in registry.items() if unsupported_reason(cls, platform, dtype) is None)


def unsupported_reason(cls: Any, platform: Any, dtype: str) -> str | None:
    """Why method class ``cls`` cannot run on ``platform`` in ``dtype`` (``None``: it can): the
    platform's ``supported_quantization`` allowlist when it has one, then the method's own rules."""
    allow = list(getattr(platform, "supported_quantization", []) or [])
    if allow and cls.name not in allow:
        return f"the {platform.name} platform runs only {', '.join(allow)}"
    return cls.unsupported_reason(platform, dtype)


def _check_platform(plan: QuantPlan, registry: dict[str, Any], platform: Any, dtype: str) -> None:
    for name in {plan.method, *plan.targets.values()} - {None, NONE}:
        reason = unsupported_reason(registry[name], platform, dtype)
        if reason is not None:
            can = runnable_methods(registry, platform, dtype)
            raise ValueError(
                f"quantization method {name!r} cannot run on the {platform.name} platform in {dtype}: {reason}; "
                f"methods that can: {', '.join(can) or 'none'} (or --quantization none)"
            )


def _check_activations(plan: QuantPlan, registry: dict[str, Any]) -> None:
    """``--quantized-activations`` other than none needs every method of the plan to support it
    (a method class lists what it supports in ``supported_activations``)."""
    if plan.activations == "none":
        return
    can = sorted(n for n, cls in registry.items() if plan.activations in getattr(cls, "supported_activations", ("none",)))
    used = sorted({plan.method, *plan.targets.values()} - {None, NONE})
    if not used:
        raise ValueError(
            f"--quantized-activations {plan.activations} needs quantized weights, but this model is not quantized "
            f"({plan.source}); use a method that supports it: {', '.join(can) or 'none'}"
        )
    for name in used:
        if plan.activations not in getattr(registry[name], "supported_activations", ("none",)):
            raise ValueError(
                f"quantization method {name!r} does not quantize activations ({plan.activations}); "
                f"methods that do: {', '.join(can) or 'none'} (or --quantized-activations none)"
            )


def _warn_unmatched(plan: QuantPlan, hf_config: Any) -> None:
    layers = model_layer_names(hf_config)
    for pattern in [*plan.ignore, *plan.targets]:
        if not any(pattern_matches(pattern, layer) for layer in layers):
            logger.warning(
                "quantization pattern %r matches no layer of this model (layers are named like %s); "
                "it has no effect", pattern, layers[1] if len(layers) > 1 else layers[0],
            )


def registered_methods() -> dict[str, Any]:
    """This process's ``quantization_methods`` registry (loads the ``host.quantization`` group first)."""
    from host.core.plugins.manager import get_plugin_host
    from host.hooks.quantization import GROUP

    host = get_plugin_host()
    host.load_groups([GROUP])
    return dict(host.registry("quantization_methods"))
