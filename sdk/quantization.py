"""Quantization method base classes: checkpoint config -> weight loader -> linear kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch


class LinearMethod:
    """Creates a linear layer's (quantized) weights and computes ``x @ W^T`` with them."""

    def create_weights(
        self, layer: Any, input_size: int, output_size: int, params_dtype: "torch.dtype"
    ) -> None:
        """Allocate the layer's parameters (and their loaders) on ``layer``."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: Any) -> None:
        """Repack or transpose loaded weights for the kernel; default: nothing."""

    def apply(self, layer: Any, x: "torch.Tensor", bias: "torch.Tensor | None" = None) -> "torch.Tensor":
        raise NotImplementedError


class QuantizationMethod:
    """One quantization scheme (``name`` matches the checkpoint's ``quantization_config``; the engine setting that picks one comes with a later issue).

    ``from_config`` parses the checkpoint's ``quantization_config``; ``get_linear_method``
    returns the kernel for one layer (or ``None`` to leave that layer unquantized).
    """

    name: ClassVar[str] = ""
    supported_act_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16")
    min_capability: ClassVar[int] = 0  # device compute capability, e.g. 80 for sm_80
    device_types: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "QuantizationMethod":
        """Build from a checkpoint's ``quantization_config`` dict."""
        return cls()

    @classmethod
    def override_quantization_method(cls, hf_quant_config: dict[str, Any], user_choice: str | None) -> str | None:
        """Claim a checkpoint written for another method (return our ``name``) or ``None``."""
        return None

    def get_linear_method(self, layer: Any, prefix: str) -> LinearMethod | None:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "act_dtypes": list(self.supported_act_dtypes)}
