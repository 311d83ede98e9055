"""Architecture name -> model class, through the plugin host's ``models`` registry.

The registry is fed by ``host_register_models`` implementations of ``host.models`` plugins
(the built-in ones live in ``host.plugins.builtin_models``); entries are classes or lazy
``"package.module:ClassName"`` strings imported only here, when a model is loaded.
"""

from __future__ import annotations

import importlib
from typing import Any

from host.core.plugins.manager import get_plugin_host
from host.hooks.groups import MODELS_GROUP


def supported_architectures() -> dict[str, Any]:
    """Every registered architecture and its class (or lazy ``"module:Class"`` string)."""
    host = get_plugin_host()
    host.load_groups([MODELS_GROUP])
    return dict(host.registry("models"))


def transformers_architectures() -> list[str]:
    """The causal LM architectures the installed transformers maps, sorted: what the transformers
    fallback (``--model-impl transformers``) can serve."""
    from host.core.models.transformers_fallback import transformers_causal_lm_names

    return sorted(transformers_causal_lm_names())


def architecture_rows(include_fallback: bool = True) -> list[dict[str, str]]:
    """One row per architecture host serves: the registered ones (``implementation`` native,
    with the plugin that registered it and its class), then, with ``include_fallback``, every
    other architecture of :func:`transformers_architectures` (``implementation`` transformers:
    the fallback; listing them imports transformers, seconds of a CLI call)."""
    host = get_plugin_host()
    host.load_groups([MODELS_GROUP])
    native = host.registry("models")
    rows = [
        {"architecture": arch, "implementation": "native", "plugin": host.registry_owner("models", arch),
         "target": entry if isinstance(entry, str) else f"{entry.__module__}:{entry.__qualname__}"}
        for arch, entry in sorted(native.items())
    ]
    if include_fallback:
        rows += [
            {"architecture": arch, "implementation": "transformers", "plugin": "", "target": f"transformers:{arch}"}
            for arch in transformers_architectures() if arch not in native
        ]
    return rows


def _import_target(target: str) -> type:
    module_name, sep, attr = target.partition(":")
    if not sep or not attr:
        raise ValueError(f"model class {target!r} must be a 'package.module:ClassName' string")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_model_class(architectures: list[str]) -> type:
    """The model class of the first name in ``architectures`` (a config.json's
    ``architectures`` list) that some plugin registered.

    An unknown architecture is a ``ValueError`` listing the supported ones and how to add one.
    """
    registry = supported_architectures()
    for arch in architectures or []:
        entry = registry.get(arch)
        if entry is None:
            continue
        return _import_target(entry) if isinstance(entry, str) else entry
    supported = ", ".join(sorted(registry)) or "(none: is the host.models group blocked?)"
    raise ValueError(
        f"model architecture(s) {list(architectures or [])} are not supported; supported: "
        f"{supported}. To add one, write a model class (built as Cls(hf_config, dtype, "
        "attn_backend), with forward(input_ids, positions), compute_logits and load_weights) "
        "and register it from a host.models plugin implementing host_register_models "
        "(register('MyArchForCausalLM', 'my_pkg.model:MyArchForCausalLM'))."
    )


def eplb_policy(name: str) -> Any:
    """A new instance of the load-balancing policy registered as ``name``
    (``host_register_eplb_policies``); an unknown name is a ``ValueError`` listing the registered ones."""
    host = get_plugin_host()
    host.load_groups([MODELS_GROUP])
    policies = host.registry("eplb_policies")
    entry = policies.get(name)
    if entry is None:
        raise ValueError(
            f"eplb_config policy={name!r} is not registered; registered: {', '.join(sorted(policies)) or 'none'} "
            "(a host.models plugin adds one through host_register_eplb_policies)"
        )
    return (_import_target(entry) if isinstance(entry, str) else entry)()
