"""The suites fail a plugin that breaks its contract (each a small, deliberate breakage)."""

from __future__ import annotations

import pytest

from host.plugins.torch_paged.attention import TorchPagedAttentionBackend, TorchPagedAttentionImpl
from host.sdk import EndpointPlugin, LinearMethod, QuantizationMethod
from host.sdk.testing import AttentionBackendConformance, EndpointConformance, QuantizationMethodConformance


class _OffByAPercent(TorchPagedAttentionImpl):
    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs) * 1.01


class _SlightlyWrongBackend(TorchPagedAttentionBackend):
    name = "slightly_wrong"

    @classmethod
    def get_impl_cls(cls):
        return _OffByAPercent


def test_an_attention_backend_off_by_a_percent_fails():
    suite = type("S", (AttentionBackendConformance,), {"backend": _SlightlyWrongBackend})()
    with pytest.raises(AssertionError, match="max error"):
        suite.test_matches_the_reference_on_every_layout()


class _UndeclaredRoute(EndpointPlugin):
    name = "undeclared"

    def attach_router(self, app):
        app.add_api_route("/secret", lambda: {}, methods=["GET"])

    def routes(self):
        return []


def test_an_endpoint_hiding_a_route_fails():
    suite = type("S", (EndpointConformance,), {"endpoint": _UndeclaredRoute()})()
    with pytest.raises(AssertionError, match="/secret"):
        suite.test_declares_exactly_the_routes_it_attaches()


class _ShardsSwapped(LinearMethod):
    """Loads every shard at row 0: a fused layer's second projection overwrites the first."""

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        import torch

        layer.register_buffer("w", torch.zeros(sum(output_sizes), input_size, dtype=params_dtype), persistent=False)

    def load_weight(self, layer, shard, tensor):
        layer.w[: tensor.shape[0]] = tensor

    def apply(self, layer, x, bias=None):
        import torch.nn.functional as F

        return F.linear(x, layer.w, bias)


class _SwappedMethod(QuantizationMethod):
    name = "swapped"

    def get_linear_method(self, layer_name):
        return _ShardsSwapped()


def test_a_method_misplacing_shards_fails():
    suite = type("S", (QuantizationMethodConformance,), {"method": _SwappedMethod})()
    with pytest.raises(AssertionError, match="relative error"):
        suite.test_a_fused_layer_matches_the_float_matmul()
