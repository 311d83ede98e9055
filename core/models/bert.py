"""BERT-family encoders (``BertModel``: all-MiniLM, BGE, E5 ...): bidirectional attention,
learned absolute positions, token types, post-LayerNorm blocks, loaded from HF safetensors.

Tokens arrive flattened like the decoders' (``input_ids`` and ``positions`` are [num_tokens]).
An encoder sees its whole prompt in one step (the pooling runner schedules it so), and every
token attends to every token of its own prompt. The model therefore computes attention itself
with ``scaled_dot_product_attention`` over the step's prompts, padded by similar length (no KV
cache is read or written: the request finishes in this step and its blocks are freed). The
prompts' boundaries come from the forward context's ``extra["query_start_loc"]`` (host ints,
set by :mod:`host.core.pooling.worker`); without it the tokens are one prompt.

All token types are 0 (one segment), as sentence-transformers encodes a single text.
``forward`` returns the last hidden states [num_tokens, hidden_size]; there is no LM head
(``compute_logits`` raises) and no BERT pooler layer (the engine's pooler reduces the states).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from host.contracts.forward_context import get_forward_context

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


# a checkpoint's separate projection tensors, loaded into thirds of BertSelfAttention.qkv
_QKV = re.compile(r"^(.*attention\.self\.)(query|key|value)(\.(?:weight|bias))$")


class BertEmbeddings(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h, dtype=dtype)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h, dtype=dtype)
        self.token_type_embeddings = nn.Embedding(max(1, getattr(config, "type_vocab_size", 1)), h, dtype=dtype)
        self.LayerNorm = nn.LayerNorm(h, eps=config.layer_norm_eps, dtype=dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class PromptLayout:
    """The step's prompts for attention, grouped by similar length.

    ``slices`` are prompts attended alone: ``(start, end)`` token ranges, no padding and no
    mask. ``groups`` are prompts of nearly the same length padded to their longest (padding at
    most ``1 / PAD_SHARE`` of a group's real tokens): ``index`` [B, L] are the flat token rows
    (padding repeats the prompt's first token), ``valid`` [B, L] marks real tokens, ``mask`` the
    key mask [B, 1, 1, L] (None when all have the same length). Attention cost grows with the square of the padded length, so loose
    padding costs more than the extra calls of attending prompts one by one (about 2x at
    lengths 8-130, padded to the longest of 30)."""

    PAD_SHARE = 8

    def __init__(self, query_start_loc: np.ndarray, device: torch.device) -> None:
        starts = np.asarray(query_start_loc[:-1], dtype=np.int64)
        lens = np.diff(np.asarray(query_start_loc, dtype=np.int64))
        order = np.argsort(-lens, kind="stable")
        self.slices: list[tuple[int, int]] = []
        self.groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        i = 0
        while i < len(order):
            longest = int(lens[order[i]])
            j, total = i, 0
            while j < len(order) and self.PAD_SHARE * ((j - i + 1) * longest - total - int(lens[order[j]])) <= total + int(lens[order[j]]):
                total += int(lens[order[j]])
                j += 1
            members = order[i:j]
            if len(members) == 1:
                start = int(starts[members[0]])
                self.slices.append((start, start + longest))
            else:
                offs = np.arange(longest)
                valid = offs[None, :] < lens[members][:, None]
                index = starts[members][:, None] + np.where(valid, offs[None, :], 0)
                flat_valid = valid.reshape(-1)
                tensors = (index, np.flatnonzero(flat_valid), index.reshape(-1)[flat_valid])
                index_t, src, dst = (torch.from_numpy(np.ascontiguousarray(t)).to(device) for t in tensors)
                mask = None if valid.all() else torch.from_numpy(valid).to(device)[:, None, None, :]
                self.groups.append((index_t, src, dst, mask))
            i = j

    @classmethod
    def of_step(cls, num_tokens: int, device: torch.device) -> "PromptLayout":
        ctx = get_forward_context()
        qsl = ctx.extra.get("query_start_loc") if ctx is not None else None
        return cls(np.array([0, num_tokens]) if qsl is None else qsl, device)


class BertSelfAttention(nn.Module):
    """Self-attention with the query, key and value projections in one GEMM (``qkv``; the
    checkpoint's ``query``/``key``/``value`` tensors are loaded into its thirds)."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_size = h // self.num_heads
        self.qkv = nn.Linear(h, 3 * h, dtype=dtype)

    def forward(self, x: torch.Tensor, layout: PromptLayout) -> torch.Tensor:
        n, heads, size = x.shape[0], self.num_heads, self.head_size
        qkv = self.qkv(x)  # [n, 3 * hidden]: a token's q, k and v side by side
        by_head = qkv.view(n, 3, heads, size).permute(1, 2, 0, 3)  # [3, heads, n, head_size]
        out = torch.empty(n, heads * size, dtype=x.dtype, device=x.device)
        for start, end in layout.slices:
            q, k, v = by_head[:, None, :, start:end].unbind(0)  # [1, heads, L, head_size]
            out[start:end] = F.scaled_dot_product_attention(q, k, v)[0].transpose(0, 1).reshape(end - start, -1)
        for index, src, dst, mask in layout.groups:
            rows = qkv.index_select(0, index.view(-1))  # [B * L, 3 * hidden], one contiguous row per token
            q, k, v = rows.view(*index.shape, 3, heads, size).permute(2, 0, 3, 1, 4).unbind(0)  # [B, heads, L, head_size]
            ob = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(-1, heads * size)
            out.index_copy_(0, dst, ob.index_select(0, src))
        return out


class BertLayer(nn.Module):
    """One post-LayerNorm encoder block: LN(x + attn(x)), then LN(h + FFN(h))."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.layer_norm_eps
        act = getattr(config, "hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act={act!r} is not supported for BERT; supported: {', '.join(_ACTIVATIONS)}")
        self.act = _ACTIVATIONS[act]
        self.attention = nn.Module()
        self.attention.self = BertSelfAttention(config, dtype)
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(h, h, dtype=dtype)
        self.attention.output.LayerNorm = nn.LayerNorm(h, eps=eps, dtype=dtype)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(h, config.intermediate_size, dtype=dtype)
        self.output = nn.Module()
        self.output.dense = nn.Linear(config.intermediate_size, h, dtype=dtype)
        self.output.LayerNorm = nn.LayerNorm(h, eps=eps, dtype=dtype)

    def forward(self, x: torch.Tensor, layout: PromptLayout) -> torch.Tensor:
        a = self.attention
        x = a.output.LayerNorm(x + a.output.dense(a.self(x, layout)))
        return self.output.LayerNorm(x + self.output.dense(self.act(self.intermediate.dense(x))))


class BertModel(nn.Module):
    """``BertModel(hf_config, dtype, attn_backend)``; the attention backend is unused (see the
    module docstring). Checkpoint names are Hugging Face's, with or without the ``bert.``
    prefix; the ``pooler.*`` weights are skipped."""

    is_encoder = True

    def __init__(self, hf_config: Any, dtype: torch.dtype = torch.float32, attn_backend: type | None = None) -> None:
        super().__init__()
        if getattr(hf_config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                f"position_embedding_type={hf_config.position_embedding_type!r} is not supported; "
                "BertModel here has learned absolute positions only"
            )
        self.config = hf_config
        self.dtype = dtype
        self.embeddings = BertEmbeddings(hf_config, dtype)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(BertLayer(hf_config, dtype) for _ in range(hf_config.num_hidden_layers))
        # the model runner's pipeline interface: one stage holding every layer
        self.start_layer, self.end_layer = 0, hf_config.num_hidden_layers
        self.is_first_stage = self.is_last_stage = True

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Last hidden states [num_tokens, hidden_size] of the step's prompts."""
        layout = PromptLayout.of_step(input_ids.shape[0], input_ids.device)
        x = self.embeddings(input_ids, positions)
        for layer in self.encoder.layer:
            x = layer(x, layout)
        return x

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        raise ValueError("BertModel is an encoder with no language-model head: run it with --runner pooling")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face-named tensors in; a missing parameter is a ValueError naming it."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("bert.")
            if name.startswith(("pooler.", "cls.")) or name.endswith("position_ids"):
                continue
            name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
            target, part = _QKV.sub(r"\1qkv\3", name), None
            if target != name:  # attention.self.{query,key,value}.{weight,bias} -> a third of qkv
                part = ("query", "key", "value").index(_QKV.match(name).group(2))
                name = target
            param = params.get(name)
            if param is None:
                raise ValueError(f"checkpoint tensor {name!r} has no place in BertModel; is this a BERT checkpoint?")
            dest = param.data if part is None else param.data.chunk(3)[part]
            if tuple(dest.shape) != tuple(tensor.shape):
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, the model expects {tuple(dest.shape)}")
            dest.copy_(tensor.to(param.dtype))
            loaded.add(name if part is None else f"{name}#{part}")
        loaded |= {name for name in params if all(f"{name}#{p}" in loaded for p in range(3))}
        missing = sorted(set(params) - loaded)
        loaded = {name for name in loaded if "#" not in name}
        if missing:
            raise ValueError(f"the checkpoint lacks {len(missing)} BertModel weights, e.g. {missing[:3]}")
        return loaded
