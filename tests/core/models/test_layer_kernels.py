"""The layers' kernels come from the kernel table (one way to extend kernels): the best entry
offered for the device serves, with its dtypes; without one a layer keeps its torch path."""

from __future__ import annotations

import torch
import transformers

from host.core.models.layers import RMSNorm, attach_layer_kernels
from host.core.models.llama import LlamaForCausalLM
from host.interfaces.kernels import register_kernel, unregister_kernel


def _tiny() -> LlamaForCausalLM:
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, vocab_size=50, max_position_embeddings=32)
    return LlamaForCausalLM(config)


def test_the_best_offered_layer_kernel_serves_with_its_dtypes():
    calls = []

    def my_norm(x, residual, weight, eps):
        calls.append(x.dtype)
        return torch.nn.functional.rms_norm(x if residual is None else x + residual, weight.shape, weight, eps)

    my_norm.dtypes = (torch.float32, torch.bfloat16)
    register_kernel("rms_norm", "testdev", my_norm, name="mine", priority=50, reason="a test kernel", source="test")
    try:
        model = _tiny()
        assert attach_layer_kernels(model, "testdev") == sum(isinstance(m, RMSNorm) for m in model.modules())
        assert model.model.norm.kernel is my_norm and model.model.norm.kernel_dtypes == (torch.float32, torch.bfloat16)
        assert model.model.rotary_emb.kernel is None  # nothing offered for it on this device: torch
        model.model.norm(torch.randn(3, 32))
        assert calls == [torch.float32]
        plain = _tiny()
        assert attach_layer_kernels(plain, "otherdev") == 0 and plain.model.norm.kernel is None
    finally:
        unregister_kernel("rms_norm", "testdev", "mine")
