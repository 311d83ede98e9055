"""A PEFT LoRA adapter directory: validation (front end and worker) and loading (worker).

A directory holds ``adapter_config.json`` (PEFT's ``LoraConfig``: ``r``, ``lora_alpha``,
``target_modules``, ``use_rslora``) and ``adapter_model.safetensors`` with one
``lora_A`` ([r, in]) and one ``lora_B`` ([out, r]) weight per targeted linear, named
``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`` and so on.
:func:`read_adapter` checks everything the engine relies on (files, rank, target modules, every
tensor's shape against the model) from the safetensors header alone, without reading the
weights, so the front end can validate each request cheaply; a failure is a ``ValueError`` that
names the file or value and the fix. :meth:`AdapterFiles.load` reads the tensors (the worker).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# the linears an adapter may target, in layer order
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_KEY_RE = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")
# PEFT features whose weights this engine would silently ignore: refused instead
_UNSUPPORTED = {
    "use_dora": "DoRA adapters (use_dora) are not supported; merge the adapter or train a plain LoRA",
    "rank_pattern": "per-module ranks (rank_pattern) are not supported; use one r for every module",
    "alpha_pattern": "per-module alphas (alpha_pattern) are not supported; use one lora_alpha",
    "modules_to_save": "modules_to_save (fully trained extra modules) are not supported; only LoRA weights are served",
    "lora_bias": "LoRA bias terms (lora_bias) are not supported",
    "fan_in_fan_out": "fan_in_fan_out=true (Conv1D-style weights) is not supported; Llama-family linears store [out, in]",
}


def module_shapes(hf_config: Any) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of each targetable linear of one decoder layer."""
    hidden = hf_config.hidden_size
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
    inter = hf_config.intermediate_size
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


@dataclass
class AdapterFiles:
    """A validated adapter directory: its rank, scale, what it targets and its content digest.

    ``modules`` maps ``(layer index, module name)`` (``(3, "q_proj")``) to the safetensors keys of
    its A and B weights. ``scale`` is ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with
    ``use_rslora``)."""

    path: str
    rank: int
    alpha: float
    scale: float
    target_modules: tuple[str, ...]
    modules: dict[tuple[int, str], tuple[str, str]]
    digest: str
    config: dict[str, Any] = field(repr=False, default_factory=dict)

    def load(self, dtype: torch.dtype = torch.float32) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
        """Read every ``(A [r, in], B [out, r])`` pair, on the CPU in ``dtype``. The file is
        checked against the digest it was validated with: a file changed since is an error
        (validate it again)."""
        from safetensors import safe_open

        weights = os.path.join(self.path, WEIGHTS_FILE)
        if adapter_digest(self.path) != self.digest:
            raise ValueError(
                f"LoRA adapter {self.path!r} changed after it was validated; send the request again "
                "(a new digest is computed then)"
            )
        out = {}
        with safe_open(weights, framework="pt") as f:
            for key, (a_key, b_key) in self.modules.items():
                out[key] = (f.get_tensor(a_key).to(dtype), f.get_tensor(b_key).to(dtype))
        return out


def _file_hash(path: str) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


_digest_cache: dict[tuple, str] = {}
_digest_lock = threading.Lock()


def adapter_digest(path: str) -> str:
    """sha256 hex over ``adapter_config.json`` then ``adapter_model.safetensors`` (each file's
    own sha256, so the two cannot run into each other). Memoized by the files' size and
    modification time, so validating each request does not reread an unchanged adapter."""
    files = [os.path.join(path, CONFIG_FILE), os.path.join(path, WEIGHTS_FILE)]
    for f in files:
        if not os.path.isfile(f):
            raise ValueError(f"LoRA adapter {path!r} has no {os.path.basename(f)}; a PEFT adapter directory "
                             f"holds {CONFIG_FILE} and {WEIGHTS_FILE} (model.save_pretrained(dir))")
    stats = tuple((f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files)
    with _digest_lock:
        cached = _digest_cache.get(stats)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    for f in files:
        h.update(_file_hash(f))
    digest = h.hexdigest()
    with _digest_lock:
        _digest_cache[stats] = digest
    return digest


def _target_list(value: Any, path: str) -> list[str] | None:
    """The config's target_modules as names, or None when it is a pattern (the weights decide)."""
    if value is None or isinstance(value, str):
        return None  # "all-linear" or a regex: the tensors present are checked instead
    if isinstance(value, (list, tuple)) and all(isinstance(m, str) for m in value):
        return [m.rsplit(".", 1)[-1] for m in value]
    raise ValueError(f"{os.path.join(path, CONFIG_FILE)}: target_modules={value!r} must be a list of module names")


def read_adapter(path: str, lora_config: Any, model_hf_config: Any) -> AdapterFiles:
    """Validate the PEFT adapter at ``path`` for this model and engine; see the module docstring.

    :param lora_config: the engine's :class:`~host.core.config.LoRAConfig` (``max_lora_rank``).
    :param model_hf_config: the base model's ``transformers`` config (layer count and shapes).
    :raises ValueError: naming the missing file, the bad value or the mismatched tensor, and the fix.
    """
    if not isinstance(path, str) or not path:
        raise ValueError(f"lora_path={path!r} must be a PEFT adapter directory")
    path = os.path.expanduser(path)
    if not os.path.isdir(path):
        raise ValueError(f"LoRA adapter directory {path!r} does not exist; pass the directory "
                         "adapter.save_pretrained(...) wrote")
    digest = adapter_digest(path)
    config_path = os.path.join(path, CONFIG_FILE)
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{config_path} is not valid JSON ({e}); write it with PEFT's save_pretrained") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object (PEFT's LoraConfig)")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise ValueError(f"{config_path}: peft_type={config.get('peft_type')!r} is not a LoRA adapter; only LORA is served")
    for name, why in _UNSUPPORTED.items():
        if config.get(name):
            raise ValueError(f"{config_path}: {why} ({name}={config[name]!r})")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"{config_path}: r={rank!r} must be a positive integer (the LoRA rank)")
    max_rank = lora_config.max_lora_rank
    if rank > max_rank:
        raise ValueError(f"LoRA adapter {path!r} has rank r={rank}, larger than max_lora_rank={max_rank}; "
                         f"start the engine with --max-lora-rank {rank} (or more) or use a smaller adapter")
    alpha = config.get("lora_alpha", rank)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise ValueError(f"{config_path}: lora_alpha={alpha!r} must be a number")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    targets = _target_list(config.get("target_modules"), path)
    if targets is not None:
        unknown = sorted(set(targets) - set(TARGET_MODULES))
        if unknown:
            raise ValueError(f"LoRA adapter {path!r} targets unknown module(s) {', '.join(unknown)}; "
                             f"supported target modules: {', '.join(TARGET_MODULES)}")

    from safetensors import safe_open

    weights_path = os.path.join(path, WEIGHTS_FILE)
    shapes = module_shapes(model_hf_config)
    num_layers = model_hf_config.num_hidden_layers
    halves: dict[tuple[int, str], dict[str, str]] = {}
    try:
        with safe_open(weights_path, framework="pt") as f:
            for key in f.keys():
                m = _KEY_RE.match(key)
                if m is None:
                    raise ValueError(f"{weights_path}: tensor {key!r} is not a LoRA weight of a supported module "
                                     f"(expected base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight "
                                     f"with module one of {', '.join(TARGET_MODULES)})")
                layer, parent, module, half = int(m.group(1)), m.group(2), m.group(3), m.group(4)
                if module not in TARGET_MODULES or _PARENT[module] != parent:
                    raise ValueError(f"LoRA adapter {path!r} targets unknown module {parent}.{module} ({key}); "
                                     f"supported target modules: {', '.join(TARGET_MODULES)}")
                if layer >= num_layers:
                    raise ValueError(f"{weights_path}: {key} is for layer {layer}, but the model has {num_layers} "
                                     "layers; this adapter was trained for another base model")
                fan_in, fan_out = shapes[module]
                want = [rank, fan_in] if half == "A" else [fan_out, rank]
                got = list(f.get_slice(key).get_shape())
                if got != want:
                    raise ValueError(f"{weights_path}: {key} has shape {got}, expected {want} for this model "
                                     f"(r={rank}, {module}: in={fan_in}, out={fan_out}); this adapter was trained "
                                     "for another base model or its adapter_config.json r is wrong")
                halves.setdefault((layer, module), {})[half] = key
    except ValueError:
        raise
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"{weights_path} is not a readable safetensors file ({e}); write it with PEFT's "
                         "save_pretrained") from None
    modules: dict[tuple[int, str], tuple[str, str]] = {}
    for key, pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise ValueError(f"{weights_path}: layer {key[0]} {key[1]} has no {missing} weight; the file is incomplete")
        modules[key] = (pair["A"], pair["B"])
    if not modules:
        raise ValueError(f"{weights_path} holds no LoRA weights; the adapter must target at least one of "
                         f"{', '.join(TARGET_MODULES)}")
    present = tuple(m for m in TARGET_MODULES if any(k[1] == m for k in modules))
    return AdapterFiles(path, rank, float(alpha), float(scale), present, modules, digest, config)
