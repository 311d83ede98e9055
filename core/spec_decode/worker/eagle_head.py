"""An EAGLE-style draft head: a small decoder on the target model's hidden states.

For position ``q`` the head takes the target's last hidden state at ``q`` (after the target's
final norm) and the embedding of the token at ``q + 1``, and predicts the token at ``q + 2``::

    x = fc(concat(embed(token[q + 1]), hidden[q]))       # [n, 2 * hidden] -> [n, hidden]
    x = decoder_layers(x, positions=q)                    # the target architecture's layer(s)
    h = norm(x)                                           # the target's final norm (or the head's)
    logits = lm_head(h)                                   # the target's LM head, shared

``h`` is in the same space as the target's hidden states, so a chain of drafts feeds each step's
``h`` back as the next step's hidden state. The decoder layers are the target architecture's
:class:`~host.core.models.llama.DecoderLayer` (its q/k/v bias and q/k norm switches), each with
its own attention and paged KV layer (indexed ``0..num_layers-1`` in the head's own forward
context). The embedding, the final norm and the LM head are the target's own modules (shared,
not copied) unless the head's checkpoint brings ``embed_tokens.weight`` / ``norm.weight``.

The checkpoint is a directory (docs/speculative.md, "eagle"):

- ``config.json``: fields laid over a copy of the target's config: ``num_hidden_layers``
  (default 1), ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``,
  ``head_dim``, ``rms_norm_eps``, ... ``hidden_size`` and ``vocab_size``, when given, must equal
  the target's; ``fc_bias`` (default false) says whether ``fc`` has a bias;
- ``*.safetensors``: ``fc.weight`` [hidden, 2 * hidden] (``fc.bias``), ``layers.{i}.*`` with
  Hugging Face Llama names (``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
  ``input_layernorm``, ``post_attention_layernorm``, Qwen3's ``self_attn.{q,k}_norm``), and
  optionally ``embed_tokens.weight`` and ``norm.weight``. A ``model.`` prefix is accepted.
  ``layers.0.input_layernorm.weight`` may be absent (EAGLE-1 checkpoints): the first layer then
  takes ``fc``'s output unnormalized.

Tensor parallelism is not supported (the head is built for one rank).
"""

from __future__ import annotations

import copy
import glob
import json
import os
import re
from typing import Any, Iterable

import torch
from torch import nn

from host.core.models.layers import RMSNorm, RotaryEmbedding, rope_parameters_from_config
from host.core.models.llama import DecoderLayer, _head_dim
from host.core.models.parallel_layers import ModelShard
from host.core.models.weight_fill import check_complete, copy_into

CONFIG_FILE = "config.json"
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")
# Hugging Face sub-projection -> (our fused module, shard id)
_STACKED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def read_head_config(path: str, target_config: Any) -> Any:
    """The head's config: ``path/config.json`` laid over a copy of the target's config.

    A missing directory or file, invalid JSON, or a ``hidden_size`` / ``vocab_size`` that differs
    from the target's is a ``ValueError`` naming the value and the fix."""
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise ValueError(f"EAGLE head directory {path!r} does not exist; set speculative_config model to the head's directory")
    if not os.path.isfile(file):
        raise ValueError(f"EAGLE head directory {path!r} has no {CONFIG_FILE}; the head needs one (docs/speculative.md, eagle)")
    try:
        with open(file) as f:
            fields = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON ({e})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{file} must hold a JSON object, got {type(fields).__name__}")
    for key in ("hidden_size", "vocab_size"):
        if key in fields and int(fields[key]) != int(getattr(target_config, key)):
            raise ValueError(
                f"EAGLE head {key}={fields[key]} (in {file}) differs from the target model's {key}="
                f"{getattr(target_config, key)}; the head must be trained for this target"
            )
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = 1
    for key, value in fields.items():
        if key in ("architectures", "model_type", "transformers_version", "torch_dtype", "dtype"):
            continue
        setattr(config, key, value)
    layers = config.num_hidden_layers
    if not isinstance(layers, int) or layers < 1:
        raise ValueError(f"EAGLE head num_hidden_layers={layers!r} (in {file}) must be an integer >= 1")
    return config


class EagleHead(nn.Module):
    """The head's own modules (``fc``, ``layers``, optional ``embed_tokens`` / ``norm``) and
    the target's shared embedding, final norm and LM head.

    ``forward(input_ids, positions, hidden_states)`` returns the head's hidden states
    [num_tokens, hidden_size] after the final norm; ``compute_logits(h)`` the float32 logits.
    Built by :func:`load_eagle_head`; ``target`` is the loaded target model (a
    :class:`~host.core.models.llama.LlamaForCausalLM` or subclass), kept as a plain attribute
    so its parameters are not the head's."""

    def __init__(self, config: Any, target: nn.Module, dtype: torch.dtype, attn_backend: type | None,
                 own_embedding: bool = False, own_norm: bool = False, fc_bias: bool = False) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        hidden = int(config.hidden_size)
        self._target = (target,)  # a tuple: not registered as a submodule
        self.fc = nn.Linear(2 * hidden, hidden, bias=fc_bias, dtype=dtype)
        switches = dict(qkv_bias=type(target).qkv_bias(config), o_bias=type(target).o_bias(config), qk_norm=type(target).qk_norm)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, dtype, attn_backend, shard=ModelShard(), **switches) for i in range(config.num_hidden_layers)
        )
        self.rotary_emb = RotaryEmbedding(
            _head_dim(config), rope_parameters_from_config(config), config.max_position_embeddings, dtype
        )
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden, dtype=dtype) if own_embedding else None
        self.norm = RMSNorm(hidden, config.rms_norm_eps, dtype=dtype) if own_norm else None

    @property
    def target(self) -> nn.Module:
        return self._target[0]

    @property
    def num_kv_heads(self) -> int:
        return int(self.layers[0].self_attn.num_kv_heads)

    @property
    def head_size(self) -> int:
        return int(self.layers[0].self_attn.head_dim)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        embedding = self.embed_tokens if self.embed_tokens is not None else self.target.model.embed_tokens
        return embedding(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """``input_ids``/``positions`` [n]: the token at ``q + 1`` and the position ``q`` of each
        row; ``hidden_states`` [n, hidden]: the target's (or the head's previous) hidden state at
        ``q``. Attention runs over the head's paged KV through the forward context (outside one:
        dense causal attention over the rows as one sequence)."""
        x = self.fc(torch.cat([self.embed(input_ids), hidden_states.to(self.dtype)], dim=-1))
        rope = self.rotary_emb.prepare(positions)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, rope)
        norm = self.norm if self.norm is not None else self.target.model.norm
        return norm(x, residual)[0]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """float32 logits [n, vocab_size] through the target's LM head."""
        return self.target.compute_logits(hidden_states)

    # -- weights -------------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the checkpoint's tensors in (names as in the module docstring). An unknown name,
        a shape mismatch or a parameter left unfilled is a ``ValueError`` naming it."""
        params = dict(self.named_parameters())
        filled: dict[str, set[Any]] = {}
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if "rotary_emb.inv_freq" in name:
                continue
            target, shard, rows = self._target_param(name)
            param = params.get(target)
            if param is None:
                raise ValueError(
                    f"EAGLE head tensor {name!r} has no matching parameter (expected fc.weight, layers.<i>.<Llama "
                    f"layer name>, embed_tokens.weight or norm.weight with num_hidden_layers={len(self.layers)})"
                )
            copy_into(param, rows, tensor, label=f"EAGLE head tensor {name!r}", target=target,
                      fix="does the head's config.json match its weights?")
            filled.setdefault(target, set()).add(shard)
        check_complete(params, filled, source="the EAGLE head checkpoint",
                       fix="is it complete and does it match its config.json?")

    def _target_param(self, name: str) -> tuple[str, Any, slice | None]:
        """Our parameter for a checkpoint name: (name, shard id, rows it fills)."""
        match = _LAYER_RE.match(name)
        if match is None:
            return name, None, None
        idx, rest = int(match.group(1)), match.group(2)
        module, _, suffix = rest.rpartition(".")
        if module not in _STACKED or idx >= len(self.layers):
            return name, None, None
        fused, shard = _STACKED[module]
        layer = self.layers[idx]
        if fused == "self_attn.qkv_proj":
            rows = layer.self_attn.shard_slice(shard)
        else:
            size = layer.mlp.intermediate_size
            rows = slice(shard * size, (shard + 1) * size)
        return f"layers.{idx}.{fused}.{suffix}", shard, rows




def _iter_safetensors(path: str) -> Iterable[tuple[str, torch.Tensor]]:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"EAGLE head directory {path!r} holds no *.safetensors file (fc.weight, layers.0.* ...)")
    from safetensors import safe_open

    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_eagle_head(path: str, target: nn.Module, target_config: Any, dtype: torch.dtype,
                    attn_backend: type | None, device: torch.device | str = "cpu") -> EagleHead:
    """Build the head of directory ``path`` for the loaded ``target`` on ``device`` and fill its
    weights; eval mode, gradients off."""
    config = read_head_config(path, target_config)
    weights = dict(_iter_safetensors(path))
    if "model.fc.weight" in weights or any(n.startswith("model.") for n in weights):
        weights = {n.removeprefix("model."): t for n, t in weights.items()}
    if "fc.weight" not in weights:
        raise ValueError(f"EAGLE head checkpoint in {path!r} has no fc.weight (the [hidden, 2 * hidden] input projection)")
    with torch.device(device):
        head = EagleHead(
            config, target, dtype, attn_backend,
            own_embedding="embed_tokens.weight" in weights,
            own_norm="norm.weight" in weights,
            fc_bias=bool(getattr(config, "fc_bias", False)) or "fc.bias" in weights,
        )
    if "layers.0.input_layernorm.weight" not in weights:
        head.layers[0].input_layernorm = nn.Identity()  # EAGLE-1: fc's output enters unnormalized
    with torch.no_grad():
        head.load_weights((n, t.to(dtype)) for n, t in weights.items())
    return head.eval().requires_grad_(False)
