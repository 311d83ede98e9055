"""The quantization-method suite: a layer built, loaded and applied by the method against ``x @ W^T + b``."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from host.sdk.conformance.base import RegistrationCheck
from host.sdk.quantization import LinearMethod, QuantizationMethod


class QuantizationMethodConformance(RegistrationCheck):
    """Set ``method`` (the :class:`QuantizationMethod` subclass). Optional: ``config`` (the
    ``quantization_config`` dict passed to ``from_config``, ``{}``), ``dtype`` ("float32"),
    ``rtol`` (the largest ``|y - y_ref| / |y_ref|`` in norm the method may lose, 0.05), and
    :meth:`source_tensor` to turn a float weight into what your checkpoints hold (a method that
    loads stored blocks, like GGUF, quantizes it there)."""

    method: ClassVar[type[QuantizationMethod] | None] = None
    config: ClassVar[dict[str, Any]] = {}
    dtype: ClassVar[str] = "float32"
    rtol: ClassVar[float] = 0.05
    layer_name: ClassVar[str] = "model.layers.0.mlp.gate_up_proj"
    registry_kind = "quantization_methods"
    group = "host.quantization"

    def registered_name(self) -> str:
        return self.method.name

    def source_tensor(self, weight: Any) -> Any:
        """What ``load_weight`` receives for a checkpoint holding ``weight``; default: ``weight``."""
        return weight

    def test_has_a_name_and_describes_itself(self) -> None:
        assert self.method is not None, "set `method` to your QuantizationMethod subclass"
        assert self.method.name, "set the class field `name` (what --quantization selects)"
        json.dumps(self.method.from_config(dict(self.config)).describe())

    def test_says_why_it_cannot_run_rather_than_raising(self) -> None:
        from host.sdk.platform import Platform

        class _Cpu(Platform):
            name, device_type = "conformance_cpu", "cpu"

        reason = self.method.unsupported_reason(_Cpu(), self.dtype)
        assert reason is None or isinstance(reason, str)

    def test_a_fused_layer_matches_the_float_matmul(self) -> None:
        import torch

        from host.sdk.models import QuantLinear

        instance = self.method.from_config(dict(self.config))
        linear = instance.get_linear_method(self.layer_name)
        if linear is None:
            return  # the method leaves this layer alone
        assert isinstance(linear, LinearMethod)
        gen = torch.Generator().manual_seed(0)
        dtype = getattr(torch, self.dtype)
        sizes, k = [96, 64], 256  # two shards (gate/up): rows land in the right place or fail
        layer = QuantLinear(self.layer_name, k, sizes, True, dtype, linear)
        weights = [torch.randn(n, k, generator=gen) * 0.05 for n in sizes]
        for shard, w in enumerate(weights):
            layer.load_shard(shard, self.source_tensor(w))
        with torch.no_grad():
            layer.bias.copy_(torch.randn(sum(sizes), generator=gen).to(dtype))
        linear.process_weights_after_loading(layer)
        x = torch.randn(5, k, generator=gen).to(dtype)
        y = layer(x).float()
        ref = x.float() @ torch.cat(weights).T + layer.bias.float()
        assert y.shape == ref.shape, f"apply returned {tuple(y.shape)}, expected {tuple(ref.shape)}"
        err = ((y - ref).norm() / ref.norm()).item()
        assert err <= self.rtol, f"{self.method.name}: relative error {err:.4f} > rtol {self.rtol}"
        one = layer(x[:1]).float()  # a single token (decode) takes the same weights
        assert ((one - y[:1]).norm() / y[:1].norm()).item() <= self.rtol
