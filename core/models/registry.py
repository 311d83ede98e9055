"""Architecture name -> model class, through the plugin host's ``models`` registry.

The registry is fed by ``host_register_models`` implementations of ``host.general`` plugins
(the built-in ones live in ``host.plugins.builtin_models``); entries are classes or lazy
``"package.module:ClassName"`` strings imported only here, when a model is loaded.
"""

from __future__ import annotations

import importlib
from typing import Any

from host.core.plugins.manager import get_plugin_host
from host.hooks.groups import GENERAL_GROUP


def supported_architectures() -> dict[str, Any]:
    """Every registered architecture and its class (or lazy ``"module:Class"`` string)."""
    host = get_plugin_host()
    host.load_groups([GENERAL_GROUP])
    return dict(host.registry("models"))


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
    supported = ", ".join(sorted(registry)) or "(none: is the host.general group blocked?)"
    raise ValueError(
        f"model architecture(s) {list(architectures or [])} are not supported; supported: "
        f"{supported}. To add one, write a model class (built as Cls(hf_config, dtype, "
        "attn_backend), with forward(input_ids, positions), compute_logits and load_weights) "
        "and register it from a host.general plugin implementing host_register_models "
        "(register('MyArchForCausalLM', 'my_pkg.model:MyArchForCausalLM'))."
    )
