"""Read a llama.cpp GGUF file as a Hugging Face config plus HF-named tensors.

One ``gguf.GGUFReader`` pass serves both the config and the tensors (opening a GGUF parses
every metadata field, the whole tokenizer vocabulary included, which is the slow part).
Tensors come either dequantized to float32 (``gguf.quants.dequantize``) or, for the block
formats a quantization method keeps, as :class:`GGUFTensor` (the file's bytes, one row per
output feature). The q/k row permutation llama.cpp applies to Llama checkpoints is undone in
both cases (it permutes whole rows, so the blocks are untouched), and the tensors load into the
same models as a Hugging Face checkpoint. Supported GGUF architectures: llama (a llama file
with ``llama.attention.sliding_window`` is a Mistral), qwen2, qwen3, phi3 (fused ``attn_qkv``
and gate+up ``ffn_up`` tensors; LongRoPE factors stored as the ``rope_factors_long`` /
``rope_factors_short`` tensors become ``rope_scaling``; ``rope.dimension_count`` below the head
size is a partial rotary factor), gemma2 and gemma3 (text), and the mixture-of-experts
architectures qwen2moe, qwen3moe, olmoe, llama with ``llama.expert_count`` > 0 (a Mixtral) and
gpt-oss.

Mixture of experts: llama.cpp stacks each layer's experts into one 3-D tensor per projection
(``blk.N.ffn_gate_exps`` / ``ffn_up_exps`` ``[E, I, H]``, ``ffn_down_exps`` ``[E, H, I]`` as numpy
arrays; quantized, each expert's rows are block rows), which are given back one expert at a time
under the Hugging Face per-expert names (``model.layers.N.mlp.experts.<e>.gate_proj.weight``), as
float or as :class:`GGUFTensor` rows. The router is ``ffn_gate_inp`` (``mlp.gate``), Qwen2-MoE's
shared expert ``ffn_{gate,up,down}_shexp`` with its gate ``ffn_gate_inp_shexp``. The metadata
gives ``expert_count``, ``expert_used_count``, ``expert_feed_forward_length`` and
``expert_shared_feed_forward_length``; what llama.cpp hard-codes per architecture becomes config:
whether the top-k weights are renormalised (qwen3moe and Mixtral yes, qwen2moe and olmoe no,
unless ``expert_weights_norm`` says), every layer sparse except those the file stores with a
dense ``ffn_gate`` (``mlp_only_layers``), OLMoE's ``attention.clamp_kqv`` as ``clip_qkv``.

gpt-oss (llama.cpp's ``GptOssModel`` converter): q/k rows are not permuted; the attention has biases
and ``blk.N.attn_sinks.weight`` (our ``self_attn.sinks``); the norm before the MoE block is
``post_attention_norm``; the router ``ffn_gate_inp`` has a bias; the experts' gate/up, split out of
the checkpoint's interleaved ``gate_up_proj``, are ``ffn_gate_exps`` / ``ffn_up_exps`` with stacked
biases ``[E, I]`` (``ffn_*_exps.bias``, given back per expert like the weights), ``ffn_down_exps``
with ``[E, H]``. The expert weights are float or MXFP4 (GGUF type 39), which is dequantized at load
whatever the plan keeps (no method lists it in ``kept_qtypes``: no kernel reads it yet). What
llama.cpp hard-codes becomes config: layers alternate sliding (even) and full (odd), i.e. a
``sliding_window_pattern`` of 2 unless the file gives one; the SwiGLU clamp ``swiglu_limit`` is
7.0 (or ``swiglu_clamp_exp`` when the file has it); YaRN (``rope.scaling.type`` yarn, ``factor``,
``original_context_length``, ``yarn_beta_fast`` / ``yarn_beta_slow``, ``yarn_attn_factor``) becomes
``rope_parameters`` with ``truncate: False``, the published models' setting (the file cannot say
it; llama.cpp itself rounds the YaRN ramp's ends to whole dimensions).

Gemma: llama.cpp's converter stores each RMSNorm weight as ``1 + w`` (its norm multiplies by the
weight), so the norms are given back as ``w`` (stored - 1, in float32), the Hugging Face
convention, as transformers' GGUF loader does. Gemma's four norms per block have their own
llama.cpp names (``attn_norm``, ``post_attention_norm``, ``ffn_norm`` = the pre-feed-forward
norm, ``post_ffw_norm``). The file holds no ``query_pre_attn_scalar``: it follows llama.cpp's
attention scale (see :meth:`GGUFCheckpoint._gemma_config`; for the released sizes but 27B it is
the head size, 256, which is also transformers' default); the local RoPE base is
``rope.freq_base_swa`` when the file has it (llama.cpp's default, 10 000, otherwise) and the
layer pattern ``attention.sliding_window_pattern`` when given, else the config's default
(Gemma 2: every other layer local; Gemma 3: five local to one global), as llama.cpp hard-codes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np
import torch

_FLOAT_QTYPES = (0, 1, 30)  # F32, F16, BF16: dequantized (converted) as they load
# GGUF general.architecture -> (transformers model_type, our architecture name)
GGUF_ARCHITECTURES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
    "qwen2moe": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "olmoe": ("olmoe", "OlmoeForCausalLM"),
    "gpt-oss": ("gpt_oss", "GptOssForCausalLM"),
}
# a llama file naming a sliding window is a Mistral (llama.cpp writes Mistral as arch "llama")
_MISTRAL = ("mistral", "MistralForCausalLM")
# a llama file with experts is a Mixtral (llama.cpp converts Mixtral as arch "llama")
_MIXTRAL = ("mixtral", "MixtralForCausalLM")
# whether llama.cpp renormalises the chosen experts' weights (build_moe_ffn's norm_w), per architecture
_MOE_NORM_TOPK = {"qwen2moe": False, "qwen3moe": True, "olmoe": False, "llama": True}
_GPT_OSS_SWIGLU_LIMIT = 7.0  # llama.cpp hard-codes gpt-oss's clamp (its converter stores no swiglu_limit)
_GPT_OSS_SWA_PERIOD = 2  # llama.cpp hard-codes gpt-oss's layers: even ones sliding, odd ones full
_GEMMA = ("gemma2", "gemma3")
_GEMMA_27B_BLOCKS = {"gemma2": 46, "gemma3": 62}  # llama.cpp's test for its 27B attention scale

# "{arch}.<key>" -> config attribute
_CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.key_length": "head_dim",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}
# the extra "{arch}.<key>" -> config attribute of some architectures
_ARCH_CONFIG_KEYS = {
    "gemma2": {
        "attention.sliding_window": "sliding_window",
        "attn_logit_softcapping": "attn_logit_softcapping",
        "final_logit_softcapping": "final_logit_softcapping",
    },
    "gemma3": {
        "attention.sliding_window": "sliding_window",
        "rope.freq_base_swa": "rope_local_base_freq",
        "final_logit_softcapping": "final_logit_softcapping",
    },
    "olmoe": {"attention.clamp_kqv": "clip_qkv"},
    "gpt-oss": {"attention.sliding_window": "sliding_window"},
}
_TOKEN_ID_KEYS = {
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
}

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# the experts of a layer stacked into one tensor -> the Hugging Face per-expert projection
_STACKED_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
# Gemma's sandwich norms: llama.cpp's ffn_norm is the norm before the feed-forward block
_GEMMA_NORMS = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# per-architecture names that differ from _BLOCK_TENSORS (phi3 keeps q/k/v and gate/up fused)
_ARCH_BLOCK_TENSORS = {
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    "gemma2": _GEMMA_NORMS,
    "gemma3": _GEMMA_NORMS,
    # gpt-oss: the norm before the MoE block is post_attention_norm; the sinks are blk.N.attn_sinks.weight
    "gpt-oss": {"post_attention_norm": "post_attention_layernorm", "attn_sinks": "self_attn.sinks"},
}
# Hugging Face parameters named without a .weight/.bias suffix (their GGUF tensor has one)
_BARE_PARAMETERS = ("self_attn.sinks",)
# tensors that are configuration, not weights (read into the config, never loaded)
_CONFIG_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_tensor_name(gguf_name: str, arch: str = "llama", expert: int | None = None) -> str:
    """The Hugging Face parameter name of a GGUF tensor of architecture ``arch``
    (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``); for a tensor of
    stacked experts, that of expert ``expert``'s slice (``blk.3.ffn_up_exps.weight``, 5 ->
    ``model.layers.3.mlp.experts.5.up_proj.weight``)."""
    match = _BLOCK_RE.match(gguf_name)
    if match is not None:
        idx, part, kind = match.groups()
        if part in _STACKED_EXPERTS:
            if expert is None:
                raise ValueError(f"GGUF tensor {gguf_name!r} stacks every expert; name one expert's slice (expert=...)")
            return f"model.layers.{idx}.mlp.experts.{expert}.{_STACKED_EXPERTS[part]}.{kind}"
        block = {**_BLOCK_TENSORS, **_ARCH_BLOCK_TENSORS.get(arch, {})}
        if part in block:
            if block[part] in _BARE_PARAMETERS:
                return f"model.layers.{idx}.{block[part]}"
            return f"model.layers.{idx}.{block[part]}.{kind}"
    else:
        base, _, kind = gguf_name.rpartition(".")
        if base in _GLOBAL_TENSORS:
            return f"{_GLOBAL_TENSORS[base]}.{kind}"
    raise ValueError(
        f"GGUF tensor {gguf_name!r} has no Hugging Face equivalent in the supported architectures"
    )


@dataclass
class GGUFTensor:
    """A weight still in GGUF blocks: ``data`` is ``uint8 [rows, row_bytes]`` exactly as the file
    stores the rows, ``qtype`` its ``gguf.GGMLQuantizationType`` value, ``shape`` the logical
    ``(rows, cols)`` of the float matrix it encodes."""

    data: torch.Tensor
    qtype: int
    shape: tuple[int, int]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float matrix, for layers the plan leaves unquantized."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        array = dequantize(self.data.numpy(), GGMLQuantizationType(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).reshape(self.shape).to(dtype)

    def index_rows(self, rows: Any) -> "GGUFTensor":
        data = self.data[rows]
        return GGUFTensor(data, self.qtype, (data.shape[0], self.shape[1]))


def _unpermute_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's per-head interleaving of the RoPE halves in q/k projection rows."""
    half = weight.shape[0] // n_head // 2
    w = weight.reshape(n_head, half, 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


class GGUFCheckpoint:
    """An opened GGUF file: :meth:`hf_config` and :meth:`tensors` with Hugging Face names."""

    def __init__(self, path: str) -> None:
        try:
            from gguf import GGUFReader
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "reading a .gguf model needs the 'gguf' package: pip install gguf"
            ) from exc
        self.path = path
        self.reader = GGUFReader(path)
        self.arch = str(self._field("general.architecture"))
        if self.arch not in GGUF_ARCHITECTURES:
            raise ValueError(
                f"GGUF architecture {self.arch!r} in {path} is not supported; supported: "
                f"{', '.join(GGUF_ARCHITECTURES)} (or convert the model to a Hugging Face directory)"
            )
        names = {t.name for t in self.reader.tensors}
        if "rope_freqs.weight" in names:
            raise ValueError(
                f"{path} stores Llama-3 RoPE scaling as a rope_freqs tensor, which cannot be mapped "
                "back to rope_scaling parameters; use the Hugging Face checkpoint directory instead"
            )
        self.tied = "output.weight" not in names

    def _field(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def hf_config(self) -> Any:
        """A ``transformers`` config equivalent to the model's ``config.json``."""
        from transformers import AutoConfig

        model_type, architecture = GGUF_ARCHITECTURES[self.arch]
        window = self._field(f"{self.arch}.attention.sliding_window")
        if self.arch == "llama" and window:
            model_type, architecture = _MISTRAL
        experts = int(self._field(f"{self.arch}.expert_count", 0) or 0)
        if self.arch == "llama" and experts:
            model_type, architecture = _MIXTRAL
        kwargs: dict[str, Any] = {}
        for key, attr in {**_CONFIG_KEYS, **_ARCH_CONFIG_KEYS.get(self.arch, {})}.items():
            value = self._field(f"{self.arch}.{key}")
            if value is not None:
                kwargs[attr] = value
        if self.arch in _GEMMA:
            self._gemma_config(kwargs)
        for key, attr in _TOKEN_ID_KEYS.items():
            value = self._field(key)
            if value is not None:
                kwargs[attr] = value
        if "vocab_size" not in kwargs:
            tokens = self.reader.fields.get("tokenizer.ggml.tokens")
            if tokens is not None:
                kwargs["vocab_size"] = len(tokens.data)
        scaling_type = self._field(f"{self.arch}.rope.scaling.type")
        if self.arch == "gpt-oss":
            self._gpt_oss_config(kwargs)
        elif scaling_type and scaling_type != "none":
            scaling: dict[str, Any] = {"rope_type": scaling_type}
            factor = self._field(f"{self.arch}.rope.scaling.factor")
            if factor is not None:
                scaling["factor"] = float(factor)
            original = self._field(f"{self.arch}.rope.scaling.original_context_length")
            if original is not None:
                scaling["original_max_position_embeddings"] = int(original)
            kwargs["rope_scaling"] = scaling
        if experts:
            self._moe_config(kwargs, model_type, experts)
        if model_type in ("mistral", "phi3", "mixtral"):
            kwargs["sliding_window"] = int(window) if window else None  # llama.cpp writes 0 for none
        if self.arch == "phi3":
            kwargs.update(self._phi3_rope(kwargs))
        kwargs["tie_word_embeddings"] = self.tied
        kwargs["architectures"] = [architecture]
        return AutoConfig.for_model(model_type, **kwargs)

    def _moe_config(self, kwargs: dict[str, Any], model_type: str, experts: int) -> None:
        """The mixture-of-experts fields (see the module docstring)."""
        arch = self.arch
        expert_ff = self._field(f"{arch}.expert_feed_forward_length")
        used = self._field(f"{arch}.expert_used_count")
        if used is None:
            raise ValueError(f"{self.path} has {arch}.expert_count = {experts} but no {arch}.expert_used_count; the file is incomplete")
        kwargs["num_experts_per_tok"] = int(used)
        norm = self._field(f"{arch}.expert_weights_norm")
        norm_topk = _MOE_NORM_TOPK.get(arch, False) if norm is None else bool(norm)
        if model_type in ("mixtral", "gpt_oss"):
            kwargs["num_local_experts"] = experts
            if expert_ff:
                kwargs["intermediate_size"] = int(expert_ff)
            return
        kwargs["num_experts"] = experts
        kwargs["norm_topk_prob"] = norm_topk
        if model_type == "olmoe":
            if expert_ff:
                kwargs["intermediate_size"] = int(expert_ff)
            return
        kwargs["moe_intermediate_size"] = int(expert_ff or kwargs.get("intermediate_size", 0))
        kwargs["decoder_sparse_step"] = 1
        names = {t.name for t in self.reader.tensors}
        kwargs["mlp_only_layers"] = [
            i for i in range(int(kwargs.get("num_hidden_layers", 0))) if f"blk.{i}.ffn_gate_inp.weight" not in names
        ]
        if model_type == "qwen2_moe":
            shared = self._field(f"{arch}.expert_shared_feed_forward_length")
            if shared is None:  # older files: the shared expert's gate rows say it
                gates = [t for t in self.reader.tensors if t.name.endswith(".ffn_gate_shexp.weight")]
                shared = int(gates[0].shape[1]) if gates else 0
            kwargs["shared_expert_intermediate_size"] = int(shared)

    def _phi3_rope(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Phi-3's RoPE fields: ``partial_rotary_factor`` from ``rope.dimension_count``, the
        pretraining length, and LongRoPE's factors from their tensors (as llama.cpp's converter
        stores them: float32, rotary_dim/2 each)."""
        out: dict[str, Any] = {}
        head_dim = kwargs["hidden_size"] // kwargs["num_attention_heads"]
        rope_dims = self._field("phi3.rope.dimension_count")
        if rope_dims and int(rope_dims) != head_dim:
            out["partial_rotary_factor"] = int(rope_dims) / head_dim
        original = self._field("phi3.rope.scaling.original_context_length")
        if original:
            out["original_max_position_embeddings"] = int(original)
        factors = {t.name: np.asarray(t.data, dtype=np.float32).reshape(-1).tolist()
                   for t in self.reader.tensors if t.name in _CONFIG_TENSORS}
        if factors:
            if len(factors) != 2 or not original:
                raise ValueError(
                    f"{self.path} has {sorted(factors)} but LongRoPE needs both rope_factors_long and "
                    "rope_factors_short and phi3.rope.scaling.original_context_length; the file is incomplete"
                )
            out["rope_scaling"] = {
                "rope_type": "longrope",
                "long_factor": factors["rope_factors_long.weight"],
                "short_factor": factors["rope_factors_short.weight"],
                "original_max_position_embeddings": int(original),
            }
        return out

    def _gemma_config(self, kwargs: dict[str, Any]) -> None:
        """What a Gemma GGUF leaves implicit: the attention scale (``attention.scale`` when
        given; else llama.cpp's rule, ``1 / sqrt(hidden / heads)`` for the 27B models (46 and 62
        blocks), ``1 / sqrt(head size)`` for the others) as ``query_pre_attn_scalar``, and the
        local / global layout from ``attention.sliding_window_pattern`` when the file has one
        (a period N: every N-th layer global; or one flag per layer, true = local)."""
        scale = self._field(f"{self.arch}.attention.scale")
        if scale:
            kwargs["query_pre_attn_scalar"] = 1.0 / float(scale) ** 2
        elif kwargs.get("num_hidden_layers") == _GEMMA_27B_BLOCKS[self.arch] and kwargs.get("num_attention_heads"):
            kwargs["query_pre_attn_scalar"] = kwargs["hidden_size"] // kwargs["num_attention_heads"]
        elif "head_dim" in kwargs:
            kwargs["query_pre_attn_scalar"] = kwargs["head_dim"]
        self._layer_types(kwargs)

    def _layer_types(self, kwargs: dict[str, Any], default_period: int | None = None) -> None:
        """``layer_types`` from ``attention.sliding_window_pattern`` (a period N: every N-th layer
        full, the others sliding; or one flag per layer, true = sliding), else from
        ``default_period`` (what llama.cpp hard-codes for the architecture) when given."""
        pattern = self._field(f"{self.arch}.attention.sliding_window_pattern", default_period)
        layers = kwargs.get("num_hidden_layers")
        if pattern is not None and layers:
            if isinstance(pattern, (list, tuple)):
                kwargs["layer_types"] = ["sliding_attention" if flag else "full_attention" for flag in pattern]
            elif int(pattern) > 0:
                kwargs["layer_types"] = [
                    "sliding_attention" if (i + 1) % int(pattern) else "full_attention" for i in range(layers)
                ]

    def _gpt_oss_config(self, kwargs: dict[str, Any]) -> None:
        """gpt-oss's fields (see the module docstring): the sliding/full layers, YaRN as
        ``rope_parameters``, the SwiGLU clamp, biased attention."""
        arch = self.arch
        self._layer_types(kwargs, default_period=_GPT_OSS_SWA_PERIOD)
        rope: dict[str, Any] = {"rope_type": "default"}
        scaling_type = self._field(f"{arch}.rope.scaling.type")
        if scaling_type == "yarn":
            # truncate=False: the published models' YaRN ramp is not rounded to whole dimensions
            rope = {"rope_type": "yarn", "truncate": False}
            for key, attr in (("factor", "factor"), ("original_context_length", "original_max_position_embeddings"),
                              ("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                              ("yarn_attn_factor", "attention_factor")):
                value = self._field(f"{arch}.rope.scaling.{key}")
                if value is not None:
                    rope[attr] = int(value) if key == "original_context_length" else float(value)
        elif scaling_type not in (None, "none"):
            raise ValueError(
                f"{self.path} sets {arch}.rope.scaling.type = {scaling_type!r}; gpt-oss uses 'yarn' (or none)"
            )
        theta = kwargs.pop("rope_theta", None)
        if theta is not None:
            rope["rope_theta"] = float(theta)
        kwargs["rope_parameters"] = rope
        clamp = self._field(f"{arch}.swiglu_clamp_exp")
        if clamp is None:
            kwargs["swiglu_limit"] = _GPT_OSS_SWIGLU_LIMIT
        else:
            limits = {float(v) for v in (clamp if isinstance(clamp, (list, tuple)) else [clamp])}
            if len(limits) != 1:
                raise ValueError(
                    f"{self.path} has per-layer {arch}.swiglu_clamp_exp {sorted(limits)}; GptOssForCausalLM "
                    "takes one swiglu_limit for every layer"
                )
            kwargs["swiglu_limit"] = limits.pop()
        kwargs["attention_bias"] = True

    def tensor_types(self) -> dict[str, int]:
        """Hugging Face tensor name -> its GGUF quantization type (no data is read)."""
        types: dict[str, int] = {}
        for t in self.reader.tensors:
            if t.name in _CONFIG_TENSORS:
                continue
            experts = [None] if _stacked_experts(t.name) is None else range(int(t.shape[-1]))  # GGUF dims: E last
            for expert in experts:
                types[hf_tensor_name(t.name, self.arch, expert)] = int(t.tensor_type)
        return types

    def tensors(
        self, dtype: torch.dtype = torch.float32, keep_qtypes: Iterable[int] = ()
    ) -> Iterator[tuple[str, "torch.Tensor | GGUFTensor"]]:
        """Every tensor with its Hugging Face name, one at a time: dequantized to ``dtype``, except
        the quantized ones whose type is in ``keep_qtypes``, which come as :class:`GGUFTensor`."""
        from gguf.quants import dequantize

        keep = set(keep_qtypes)
        n_head = int(self._field(f"{self.arch}.attention.head_count"))
        n_kv_head = int(self._field(f"{self.arch}.attention.head_count_kv", n_head))
        minus_one = self.arch in _GEMMA  # llama.cpp stores Gemma's norms as 1 + w
        for tensor in self.reader.tensors:
            if tensor.name in _CONFIG_TENSORS:
                continue  # read into the config by hf_config()
            if _stacked_experts(tensor.name) is not None:
                yield from self._expert_tensors(tensor, dtype, keep)
                continue
            name = hf_tensor_name(tensor.name, self.arch)
            permute = self.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight"))
            heads = n_head if "q_proj" in name else n_kv_head
            qtype = int(tensor.tensor_type)
            if qtype in keep:
                blocks = np.asarray(tensor.data, dtype=np.uint8)
                rows = blocks.shape[0]
                if permute:
                    blocks = _unpermute_rows(blocks, heads)
                cols = int(tensor.shape[0])  # GGUF lists dims innermost first
                yield name, GGUFTensor(torch.from_numpy(np.array(blocks, order="C")), qtype, (rows, cols))
                continue
            array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
            if permute:
                array = _unpermute_rows(array, heads)
            if minus_one and name.endswith("norm.weight"):
                array = array - np.float32(1.0)
            if name.endswith("shared_expert_gate.weight"):
                array = array.reshape(1, -1)  # Hugging Face's [1, hidden] linear; llama.cpp may store [hidden]
            yield name, torch.from_numpy(np.array(array, dtype=np.float32, order="C")).to(dtype)

    def _expert_tensors(
        self, tensor: Any, dtype: torch.dtype, keep: set[int]
    ) -> Iterator[tuple[str, "torch.Tensor | GGUFTensor"]]:
        """A stacked experts tensor one expert at a time: its block rows (``keep``) or floats."""
        from gguf.quants import dequantize

        qtype = int(tensor.tensor_type)
        cols = int(tensor.shape[0])  # GGUF lists dims innermost first
        data = tensor.data  # numpy [E, rows, cols] (float) or [E, rows, row_bytes] (blocks)
        if tensor.name.endswith(".bias"):  # gpt-oss: [E, rows], float
            if data.ndim != 2 or qtype not in _FLOAT_QTYPES:
                raise ValueError(f"GGUF tensor {tensor.name!r} should stack the experts' float biases in 2 dimensions, not {data.shape}")
            for expert in range(data.shape[0]):
                array = np.asarray(dequantize(data[expert], tensor.tensor_type), dtype=np.float32)
                yield hf_tensor_name(tensor.name, self.arch, expert), torch.from_numpy(np.array(array, order="C")).to(dtype)
            return
        if data.ndim != 3:
            raise ValueError(f"GGUF tensor {tensor.name!r} should stack the experts in 3 dimensions, not {data.shape}")
        for expert in range(data.shape[0]):
            name = hf_tensor_name(tensor.name, self.arch, expert)
            if qtype in keep:
                blocks = np.array(data[expert], dtype=np.uint8, order="C")
                yield name, GGUFTensor(torch.from_numpy(blocks), qtype, (blocks.shape[0], cols))
            else:
                array = np.asarray(dequantize(data[expert], tensor.tensor_type), dtype=np.float32)
                yield name, torch.from_numpy(np.array(array, order="C")).to(dtype)


def _stacked_experts(gguf_name: str) -> str | None:
    """The Hugging Face projection a tensor of stacked experts holds (``gate_proj``...), else ``None``."""
    match = _BLOCK_RE.match(gguf_name)
    return None if match is None else _STACKED_EXPERTS.get(match.group(2))


# -- the block cache: a GGUF's tensors, blocks as stored, in a safetensors file -------------------

BLOCK_CACHE = "gguf_blocks.safetensors"
"""Written next to a converted directory's ``.host/model.gguf`` link (the default model's): opening a GGUF parses
its whole metadata (seconds: the tokenizer vocabulary), a safetensors file maps in milliseconds."""


def block_cache_for(gguf_path: str | None) -> str | None:
    """The block cache beside a ``model.gguf`` (a converted directory's ``.host/model.gguf``) when
    it has been written, else ``None``."""
    if not gguf_path or os.path.basename(gguf_path) != "model.gguf":
        return None
    cache = os.path.join(os.path.dirname(gguf_path), BLOCK_CACHE)
    return cache if os.path.isfile(cache) else None


def write_block_cache(gguf_path: str, out_path: str) -> None:
    """Every tensor of ``gguf_path`` with its Hugging Face name: quantized ones as their uint8 rows
    (rows already un-permuted, the type and logical shape in the metadata), float ones as float32.
    Written to a temporary name and renamed, so a reader never sees half a file."""
    from safetensors.torch import save_file

    checkpoint = GGUFCheckpoint(gguf_path)
    quantized = {t for t in checkpoint.tensor_types().values() if t not in _FLOAT_QTYPES}
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, str] = {}
    for name, tensor in checkpoint.tensors(torch.float32, keep_qtypes=quantized):
        if isinstance(tensor, GGUFTensor):
            tensors[name] = tensor.data
            meta[name] = f"{tensor.qtype}:{tensor.shape[0]}:{tensor.shape[1]}"
        else:
            tensors[name] = tensor.contiguous()
    tmp = f"{out_path}.{os.getpid()}.tmp"
    save_file(tensors, tmp, metadata=meta)
    os.replace(tmp, out_path)


def iter_block_cache(
    path: str, dtype: torch.dtype, keep_qtypes: Iterable[int] = ()
) -> Iterator[tuple[str, "torch.Tensor | GGUFTensor"]]:
    """The tensors of a block cache as :meth:`GGUFCheckpoint.tensors` yields them."""
    from safetensors import safe_open

    keep = set(keep_qtypes)
    with safe_open(path, framework="pt", device="cpu") as f:
        meta = f.metadata() or {}
        for name in f.keys():
            tensor = f.get_tensor(name)
            if name not in meta:
                yield name, tensor.to(dtype)
                continue
            qtype, rows, cols = (int(x) for x in meta[name].split(":"))
            blocks = GGUFTensor(tensor, qtype, (rows, cols))
            yield name, blocks if qtype in keep else blocks.dequantize(dtype)
