"""Quantization method base classes: a method resolves per layer to a linear (and embedding) method
that owns that layer's weights and computes with them; a method may also own the routed experts
of mixture-of-experts layers (:class:`MoEMethod`, ``get_moe_method``).

The engine process resolves one method per layer into a plan (``--quantization``, the
checkpoint's ``quantization_config``, a GGUF file's tensor types, ``ignore`` and ``targets``);
each worker builds the model with it: every linear layer the plan quantizes is a
:class:`host.sdk.models.QuantLinear` whose weights and forward belong to a :class:`LinearMethod`.
Method objects are built per worker from ``QuantizationMethod.from_config(config)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch


class LinearMethod:
    """Creates one linear layer's weights, loads checkpoint tensors into them, computes ``x @ W^T + b``.

    A layer may be fused: ``output_sizes`` lists the rows of each checkpoint tensor it is built
    from (q/k/v: three, gate/up: two, otherwise one); ``load_weight`` receives shard ``i``'s tensor
    [output_sizes[i], input_size] (a float ``torch.Tensor``, or for GGUF sources a
    :class:`host.sdk.models.GGUFTensor` still in its blocks). The layer's bias, when it has one,
    is a plain float parameter ``layer.bias`` the engine loads; ``apply`` receives it.
    """

    scheme: ClassVar[str] = ""
    """What kernels that read a layer directly dispatch on ("gguf", "int8", "fp8", ...)."""

    def create_weights(
        self, layer: Any, input_size: int, output_sizes: list[int], params_dtype: "torch.dtype"
    ) -> None:
        """Allocate the layer's weight tensors on it (``register_buffer`` on the current device)."""
        raise NotImplementedError

    def load_weight(self, layer: Any, shard: int, tensor: Any) -> None:
        """Fill shard ``shard``'s rows from a checkpoint tensor (quantizing it when the method is online)."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: Any) -> None:
        """Repack loaded weights for the kernel once every shard is in; default: nothing."""

    def apply(self, layer: Any, x: "torch.Tensor", bias: "torch.Tensor | None" = None) -> "torch.Tensor":
        """``x @ W^T + bias`` for ``x`` [..., input_size]."""
        raise NotImplementedError


class EmbeddingMethod(LinearMethod):
    """A quantized token embedding (``[vocab, hidden]``, one shard), which is also the LM head
    when embeddings are tied: ``embed`` looks rows up, ``apply`` is the output projection."""

    def embed(self, layer: Any, ids: "torch.Tensor", dtype: "torch.dtype") -> "torch.Tensor":
        raise NotImplementedError


class MoEMethod:
    """Owns the routed experts of one mixture-of-experts layer (:class:`host.core.moe.layer.FusedMoE`)
    instead of the layer's float ``w13``/``w2``: creates the expert weights, loads each expert's
    checkpoint tensors, and computes the experts' weighted sum.

    ``load_expert`` receives one logical expert's FULL checkpoint tensor for ``part`` (``gate`` /
    ``up`` ``[I, H]``, ``down`` ``[H, I]``; a float ``torch.Tensor`` or, from a GGUF source, a
    :class:`host.sdk.models.GGUFTensor` still in its blocks) for local slot ``slot``; the method keeps
    this rank's split (``layer.split``/``layer.split_rank``: the intermediate dimension is cut in
    ``layer.split`` parts of ``layer.intermediate_size``). Expert biases stay the layer's float
    ``w13_bias``/``w2_bias``. ``apply`` gets the routing ``weights`` (float32 ``[T, k]``) and
    ``local_ids`` (int32 ``[T, k]``, ``-1``: the expert lives on another rank)."""

    def create_weights(self, layer: Any, num_local: int, hidden: int, inter: int, dtype: "torch.dtype") -> None:
        """Allocate (or prepare to receive) ``num_local`` experts of ``[2 * inter, hidden]`` and ``[hidden, inter]``."""
        raise NotImplementedError

    def load_expert(self, layer: Any, slot: int, part: str, tensor: Any) -> None:
        """Fill local slot ``slot``'s ``part`` (``gate``, ``up`` or ``down``) from a full checkpoint tensor."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: Any) -> None:
        """Repack once every expert is in; default: nothing."""

    def apply(self, layer: Any, x: "torch.Tensor", weights: "torch.Tensor", local_ids: "torch.Tensor") -> "torch.Tensor":
        """``sum_j weights[t, j] * expert_{local_ids[t, j]}(x[t])`` for ``x [T, H]`` -> ``[T, H]`` (this rank's part)."""
        raise NotImplementedError


class QuantizationMethod:
    """One quantization scheme, registered by name through ``host_register_quantization_methods``.

    ``name`` is what ``--quantization`` and a checkpoint's ``quantization_config.quant_method``
    select. The class fields say where it runs; a platform outside them makes the engine refuse
    to start with an error naming the methods that can run there:

    - ``device_types``: platform device types it runs on (empty: all);
    - ``min_capability``: least device compute capability on CUDA-like devices (89 = sm_89);
    - ``supported_act_dtypes``: model dtypes (activations) it computes in;
    - ``online``: quantizes a float checkpoint's weights at load time (int8, fp8), as opposed to
      loading weights stored quantized (gguf);
    - ``quantizes_embeddings``: also owns ``model.embed_tokens`` (and a tied LM head).
    """

    name: ClassVar[str] = ""
    supported_act_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    min_capability: ClassVar[int] = 0
    device_types: ClassVar[tuple[str, ...]] = ()
    online: ClassVar[bool] = True
    quantizes_embeddings: ClassVar[bool] = False
    summary: ClassVar[str] = ""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "QuantizationMethod":
        """Build from a checkpoint's ``quantization_config`` (``{}`` for ``--quantization NAME``)."""
        return cls()

    @classmethod
    def override_quantization_method(cls, hf_quant_config: dict[str, Any], user_choice: str | None) -> str | None:
        """Claim a checkpoint whose ``quant_method`` names another method (return our ``name``), or ``None``."""
        return None

    @classmethod
    def unsupported_reason(cls, platform: Any, dtype: str) -> str | None:
        """Why this method cannot run on ``platform`` computing in ``dtype`` (``None``: it can).
        The default reads the class fields and ``platform.get_device_capability()``."""
        device_type = platform.device_type
        if cls.device_types and device_type not in cls.device_types:
            return f"runs on {', '.join(cls.device_types)}, not {device_type}"
        if cls.min_capability and device_type != "cpu":
            capability = platform.get_device_capability()
            if (capability or 0) < cls.min_capability:
                have = "unknown" if capability is None else f"{capability // 10}.{capability % 10}"
                need = f"{cls.min_capability // 10}.{cls.min_capability % 10}"
                return f"needs compute capability >= {need}, this device has {have}"
        if dtype not in cls.supported_act_dtypes:
            return f"computes in {', '.join(cls.supported_act_dtypes)}, not {dtype}"
        return None

    def get_linear_method(self, layer_name: str) -> LinearMethod | None:
        """The method for linear layer ``layer_name`` (e.g. ``model.layers.0.self_attn.qkv_proj``),
        or ``None`` to leave it unquantized."""
        raise NotImplementedError

    def get_embedding_method(self, layer_name: str) -> EmbeddingMethod | None:
        """The method for an embedding layer; default: not quantized."""
        return None

    def get_moe_method(self, layer_name: str) -> MoEMethod | None:
        """The method owning the routed experts of MoE layer ``layer_name``
        (``model.layers.3.mlp.experts``); default ``None``: the experts stay float (a GGUF
        source's expert blocks are dequantized as they load)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "summary": self.summary,
            "online": self.online,
            "act_dtypes": list(self.supported_act_dtypes),
            "device_types": list(self.device_types) or ["any"],
            "min_capability": self.min_capability,
        }
