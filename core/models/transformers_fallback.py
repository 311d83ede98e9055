"""The transformers fallback (``--model-impl transformers``): any decoder-only causal LM class of the
installed transformers, run inside host's engine.

:class:`TransformersForCausalLM` builds the transformers model from the config (no weights
initialised: the checkpoint fills them) with ``attn_implementation="host_paged"``
(:mod:`host.core.models.transformers_attention`), so every attention call lands in host's paged
KV cache through an :class:`~host.core.models.attention_layer.Attention` layer per decoder layer;
the rest (embeddings, norms, rotary or partial rotary, MLPs, biases, scalings) is the transformers
model's own code. Scheduling, the KV cache, chunked prefill, prefix caching, sampling and
structured outputs are the engine's, exactly as for a native model: nothing calls ``generate``.

The flattened step (``input_ids`` and ``positions`` [num_tokens]) is fed as batch 1
([1, num_tokens], ``position_ids`` [1, num_tokens]); rotary embeddings follow each token's own
position, and attention follows each sequence's extent from the forward context. Logits are the
transformers model's head applied only to the rows asked for (:meth:`TransformersForCausalLM.
compute_logits`), with whatever it does after the LM head (Cohere's ``logit_scale``, Granite's
``logits_scaling``, final soft-capping).

Limits, each a ``ValueError`` at start-up: one rank (``-tp 1 -pp 1``), unquantized weights, no
LoRA, generation only (no ``--runner pooling``), every layer attention with one KV head count and
head size, no attention sinks, and checkpoints whose tensor names are the
transformers class's own (no weight conversion is applied).
"""

from __future__ import annotations

import copy
import inspect
import re
from typing import Any, Callable, Iterable

import torch
from torch import nn

from host.core.models.attention_layer import Attention
from host.core.models.transformers_attention import probe_attention_calls, register_host_attention
from host.core.models.weight_fill import copy_into

# checkpoint tensors no transformers model holds as state (old checkpoints carry them)
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$|(^|\.)attn\.masked_bias$|(^|\.)attn\.bias$")


def transformers_causal_lm_names() -> set[str]:
    """The text causal LM class names the installed transformers maps
    (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``; multimodal ``*ForConditionalGeneration`` entries
    aside): what the fallback can be asked for. Names only: nothing is imported."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update((value,) if isinstance(value, str) else value)
    return {n for n in names if not n.endswith("ForConditionalGeneration")}


def transformers_causal_lm_class(architecture: str) -> type | None:
    """The installed transformers' class named ``architecture`` when it is one of
    :func:`transformers_causal_lm_names`, else ``None``."""
    import transformers

    if architecture not in transformers_causal_lm_names():
        return None
    return getattr(transformers, architecture, None)


def _architecture_of(hf_config: Any) -> str | None:
    """The first of the config's ``architectures``, else the causal LM class transformers maps
    its ``model_type`` to."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    architectures = getattr(hf_config, "architectures", None) or []
    return architectures[0] if architectures else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(hf_config, "model_type", None))


class _HiddenAsBaseOutput(nn.Module):
    """Stands in for the base model while :meth:`TransformersForCausalLM.compute_logits` runs the
    transformers head: returns the given ``inputs_embeds`` as the last hidden state."""

    def forward(self, *args: Any, inputs_embeds: torch.Tensor | None = None, **kwargs: Any) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPast

        return BaseModelOutputWithPast(last_hidden_state=inputs_embeds)


class TransformersForCausalLM(nn.Module):
    """A transformers ``*ForCausalLM`` as a host model class.

    Built as ``TransformersForCausalLM(hf_config, dtype, attn_backend)`` (the class is the one
    ``hf_config.architectures[0]`` names, else the one its ``model_type`` maps to); ``forward(input_ids, positions)`` over flattened
    tokens returns the final hidden states [num_tokens, hidden]; ``compute_logits(hidden)``
    float32 logits of those rows; ``load_weights`` takes the checkpoint's (name, tensor) pairs
    under the transformers class's own names. ``kv_heads_per_rank`` is the KV heads each layer
    caches. ``quant_plan`` is refused (a ``ValueError``): the fallback runs unquantized weights.
    """

    def __init__(
        self,
        hf_config: Any,
        dtype: torch.dtype = torch.float32,
        attn_backend: type | None = None,
        quant_plan: Any = None,
    ) -> None:
        super().__init__()
        architecture = _architecture_of(hf_config)
        if quant_plan is not None:
            raise ValueError(
                f"--model-impl transformers runs unquantized weights, but {architecture} was asked to be quantized "
                "(a quantized checkpoint, a GGUF's blocks or --quantization); pass --quantization none "
                "(a GGUF is then dequantized), or use --model-impl host for a natively supported architecture"
            )
        cls = transformers_causal_lm_class(architecture) if architecture else None
        if cls is None:
            raise ValueError(
                f"the installed transformers has no causal LM class {architecture!r}; "
                "--model-impl transformers runs the *ForCausalLM classes transformers maps"
            )
        from transformers.initialization import no_init_weights

        self.config = hf_config
        self.dtype = dtype
        self.architecture = architecture
        name = register_host_attention()
        # from_config writes the dtype and attention implementation into the config: a copy
        config = copy.deepcopy(hf_config)
        with no_init_weights():
            model = cls._from_config(config, attn_implementation=name, dtype=dtype)
        if getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
        self.hf_model = model.eval()
        self._hidden_stand_in = _HiddenAsBaseOutput()
        self._keeps_logits_arg = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._attach_attention(attn_backend)

    # -- attention layers ------------------------------------------------------------------------

    def _attach_attention(self, attn_backend: type | None) -> None:
        """Run one token through the model (weights zeroed: they are not loaded yet) to see every
        attention call, then give each calling module an :class:`Attention` layer for it."""
        with torch.no_grad():
            for tensor in self.hf_model.parameters():
                tensor.zero_()
            ids = torch.zeros(1, 1, dtype=torch.long, device=next(self.hf_model.parameters()).device)
            with probe_attention_calls() as calls:
                self.hf_model.base_model(input_ids=ids, position_ids=ids, use_cache=False)
        num_layers = int(self.config.num_hidden_layers)
        modules = {id(c.module) for c in calls}
        if len(calls) != num_layers or len(modules) != num_layers:
            raise ValueError(
                f"{self.architecture} made {len(calls)} attention call(s) from {len(modules)} module(s) for "
                f"num_hidden_layers={num_layers}; --model-impl transformers needs one attention per layer "
                "(hybrid, recurrent and cross-attention models cannot run with it)"
            )
        shapes = {(c.num_kv_heads, c.head_size) for c in calls}
        if len(shapes) != 1:
            raise ValueError(
                f"{self.architecture}'s layers differ in (KV heads, head size): {sorted(shapes)}; "
                "host's KV cache needs them equal in every layer"
            )
        (kv_heads, head_size), = shapes
        expected = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        if head_size != expected:
            raise ValueError(
                f"{self.architecture} attends with head size {head_size} but its config implies {expected} "
                "(head_dim, else hidden_size / num_attention_heads), which sizes host's KV cache"
            )
        indices = [getattr(c.module, "layer_idx", None) for c in calls]
        if sorted(i for i in indices if isinstance(i, int)) != list(range(num_layers)):
            indices = list(range(num_layers))  # no usable layer_idx: the call order
        for call, index in zip(calls, indices):
            call.module.host_attention = Attention(
                call.num_heads, call.head_size, call.num_kv_heads, call.scaling, index, attn_backend, call.sliding_window,
                logits_soft_cap=call.logits_soft_cap,
            )
        self.kv_heads_per_rank = kv_heads
        self.sliding_windows = {index: call.sliding_window for call, index in zip(calls, indices)}

    # -- the model runner's calls ----------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate: Any = None) -> torch.Tensor:
        """Final hidden states [num_tokens, hidden_size] of the flattened step."""
        if intermediate is not None:
            raise ValueError("--model-impl transformers runs with -tp 1 -pp 1 (no pipeline stages)")
        out = self.hf_model.base_model(
            input_ids=input_ids.unsqueeze(0), position_ids=positions.unsqueeze(0), use_cache=False
        )
        return out.last_hidden_state[0]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """float32 logits [num_tokens, vocab_size]: the transformers model's own head (LM head and
        whatever it applies after it) on these rows only, the base model stood in for by them."""
        model = self.hf_model
        prefix = model.base_model_prefix
        base = getattr(model, prefix)
        setattr(model, prefix, self._hidden_stand_in)
        try:
            kwargs = {"logits_to_keep": 0} if self._keeps_logits_arg else {}
            out = model(inputs_embeds=hidden_states.unsqueeze(0), use_cache=False, **kwargs)
        finally:
            setattr(model, prefix, base)
        return out.logits[0].float()

    # -- weights ---------------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy the checkpoint's tensors into the model; returns the parameter names filled.

        Names are matched as transformers' own loading renames them (its checkpoint conversion
        mapping's renamings, e.g. GPT-NeoX's ``embed_out`` -> ``lm_head``, and the base model's
        prefix added or dropped); a tensor that needs a converting transform (experts fused into
        one tensor, say) is refused. GGUF block tensors are dequantized. Unknown names, shape
        mismatches and parameters left unfilled are ``ValueError`` s (tied weights are filled by
        either name)."""
        model = self.hf_model
        params = dict(model.named_parameters(remove_duplicate=False))
        state = set(model.state_dict())
        targets: dict[str, torch.Tensor] = dict(params)
        targets.update({n: b for n, b in model.named_buffers(remove_duplicate=False) if n in state})
        rename = _checkpoint_renamer(model, targets)
        ignore = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])]
        filled: set[int] = set()
        unknown: list[str] = []
        converted: list[str] = []
        for name, tensor in weights:
            target, needs_converter = rename(name)
            if needs_converter:
                converted.append(name)
                continue
            if target not in targets:
                if not (_IGNORED.search(name) or any(p.search(name) for p in ignore)):
                    unknown.append(name)
                continue
            if hasattr(tensor, "dequantize") and not isinstance(tensor, torch.Tensor):
                tensor = tensor.dequantize(self.dtype)  # a GGUF block tensor
            dest = targets[target]
            copy_into(dest, None, tensor, label=f"checkpoint tensor {name!r}", target=f"{self.architecture}'s {target}",
                      fix="the weights do not match config.json")
            filled.add(id(dest))
        if converted:
            raise ValueError(
                f"checkpoint tensor(s) {', '.join(converted[:6])} ({len(converted)} in all) need a weight conversion "
                f"(transformers' conversion mapping for {self.architecture}) that --model-impl transformers does not apply"
            )
        if unknown:
            raise ValueError(
                f"checkpoint tensor(s) {', '.join(unknown[:6])} ({len(unknown)} in all) have no parameter in transformers' "
                f"{self.architecture}; does config.json name the right architecture for these weights?"
            )
        missing = sorted(n for n, p in params.items() if id(p) not in filled)
        if missing:
            raise ValueError(
                f"the checkpoint has no weights for {len(missing)} parameter(s) of transformers' {self.architecture}, "
                f"e.g. {', '.join(missing[:6])}; is the checkpoint complete and does it match config.json?"
            )
        return {n for n, p in params.items() if id(p) in filled}


def _checkpoint_renamer(model: nn.Module, targets: dict[str, torch.Tensor]) -> Callable[[str], tuple[str, bool]]:
    """``name -> (the model's name for it, whether it needs a converting transform)``, following
    transformers' conversion mapping for ``model`` (renamings only) and its base-model prefix."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    prefix = model.base_model_prefix

    def rename(name: str) -> tuple[str, bool]:
        if name in targets:
            return name, False
        target, pattern = rename_source_key(name, renamings, converters, prefix, targets)
        return target, pattern is not None and target not in targets

    return rename
