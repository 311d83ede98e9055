"""The contract of a model architecture host serves natively (the ``host.models`` family).

A plugin registers its class with ``register("MyArchForCausalLM", "my_pkg.model:MyArch")``
(:mod:`host.hooks.models`); the worker builds it as ``Cls(hf_config, dtype, attn_backend)`` on the
target device (inside ``torch.device(...)``), fills it with :meth:`ModelForCausalLM.load_weights`
and calls it once per engine step:

- ``forward(input_ids, positions)``: the step's tokens flattened, ``[num_tokens]`` each, every
  request's tokens one after another (prefill chunks and decodes mixed); returns the final hidden
  states ``[num_tokens, hidden_size]``. Attention goes through host's ``Attention`` layer
  (:mod:`host.sdk.models`), which reads the paged KV cache of its ``layer_idx`` from the forward
  context, so the model never sees batches or masks; outside the engine (no context) the same
  layer computes plain causal attention over the tokens as one sequence.
- ``compute_logits(hidden)``: float32 logits ``[rows, vocab_size]`` for the rows the sampler
  needs (soft-capping and scaling included).
- ``load_weights(weights)``: fill the parameters from ``(checkpoint name, tensor)`` pairs (Hugging
  Face names; a GGUF is renamed to them first); returns the names filled; an unknown name, a
  shape mismatch or a parameter left empty is a ``ValueError``.

Class attributes declare what the class supports; the engine refuses the rest with an error
naming the flag: ``supports_tensor_parallel`` / ``supports_pipeline_parallel`` (the class then
takes a ``shard`` keyword, :class:`host.sdk.models.ModelShard`), ``supports_quantization`` (it
takes ``quant_plan`` and builds its layers with ``make_linear``). The conformance suite
(:class:`host.sdk.testing.ModelConformance`) checks a class against transformers.
"""

from __future__ import annotations

from typing import ClassVar, Iterable

import torch
from torch import nn


class ModelForCausalLM(nn.Module):
    """Base of a natively served decoder: the contract above, plus two defaults a simple
    architecture can keep: :meth:`compute_logits` (``lm_head``, or the embedding when tied) and
    :meth:`load_weights` (each checkpoint tensor into the parameter of the same name, after
    :meth:`checkpoint_name`)."""

    supports_tensor_parallel: ClassVar[bool] = False
    supports_pipeline_parallel: ClassVar[bool] = False
    supports_quantization: ClassVar[bool] = False

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError(f"{type(self).__name__} must implement forward(input_ids, positions)")

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """float32 logits of ``hidden_states`` through ``self.lm_head``: a linear module (a
        platform may have swapped an ``nn.Linear`` for its own, so it is called, not read), or an
        ``nn.Embedding`` (tied) whose weight is the output projection."""
        head = getattr(self, "lm_head", None)
        if head is None:
            raise NotImplementedError(f"{type(self).__name__} has no lm_head; implement compute_logits")
        if isinstance(head, nn.Embedding):
            return nn.functional.linear(hidden_states, head.weight).float()
        return head(hidden_states).float()

    def checkpoint_name(self, name: str) -> str | None:
        """The parameter a checkpoint tensor fills (default: its own name), or ``None`` to skip it
        (default: rotary ``inv_freq`` buffers, and ``lm_head.weight`` when the embeddings are tied)."""
        if name.endswith("rotary_emb.inv_freq"):
            return None
        if name == "lm_head.weight" and getattr(getattr(self, "config", None), "tie_word_embeddings", False):
            return None
        return name

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters(remove_duplicate=True))
        filled: set[str] = set()
        for name, tensor in weights:
            target = self.checkpoint_name(name)
            if target is None:
                continue
            param = params.get(target)
            if param is None:
                raise ValueError(
                    f"checkpoint tensor {name!r} has no parameter {target!r} in {type(self).__name__}; "
                    "does config.json's architecture match these weights (or override checkpoint_name)?"
                )
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)} but {target} expects "
                    f"{tuple(param.shape)}; the weights do not match config.json"
                )
            with torch.no_grad():
                param.copy_(tensor)
            filled.add(target)
        missing = sorted(set(params) - filled)
        if missing:
            raise ValueError(
                f"the checkpoint has no weights for {len(missing)} parameter(s) of {type(self).__name__}, "
                f"e.g. {', '.join(missing[:6])}; is the checkpoint complete and does it match config.json?"
            )
        return filled

