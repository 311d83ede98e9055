"""The CUDA platform's configuration and wiring, with torch's CUDA checks monkeypatched (CI has
no GPU). Detection and device-id namespaces are covered in test_platforms.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from host.core.config import CompilationConfig
from host.plugins.builtin_cuda.platform import CudaPlatform
from host.sdk.attention import AttentionRequirements


def _config(dtype: str = "auto", level: int = 2) -> SimpleNamespace:
    compilation = CompilationConfig(level=level)
    compilation.resolve(max_num_seqs=8, platform_can_capture=True)
    return SimpleNamespace(dtype=dtype, compilation=compilation, optimization_level=level)


def test_dtype_checks(monkeypatch):
    p = CudaPlatform()
    with pytest.raises(ValueError, match="float64.*not supported on CUDA"):
        p.check_and_update_config(_config("float64"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(ValueError, match="--dtype float16"):
        p.check_and_update_config(_config("bfloat16"))
    p.check_and_update_config(_config("float16"))


def test_backend_capabilities(monkeypatch):
    from host.plugins.torch_paged.attention import TorchPagedAttentionBackend
    from host.plugins.triton_ops.attention import TritonPagedAttentionBackend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    req = AttentionRequirements("cuda", "bfloat16", 128, 16, sliding_window=4096)
    assert TritonPagedAttentionBackend.supports_combination(req) is None
    assert TorchPagedAttentionBackend.supports_combination(req) is None
    cpu = AttentionRequirements("cpu", "float32", 64, 16)
    assert "device type" in TritonPagedAttentionBackend.supports_combination(cpu)
    e5m2 = AttentionRequirements("cuda", "bfloat16", 64, 16, kv_cache_dtype="fp8_e5m2")
    assert "kv cache dtype" in TritonPagedAttentionBackend.supports_combination(e5m2)  # fp8 (e4m3): tests/plugins/triton_ops/test_fp8_kv.py
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter runs it on CPU tensors
    assert TritonPagedAttentionBackend.supports_combination(cpu) is None
    assert CudaPlatform.attention_backend_priority == ["triton_paged", "torch_paged"]


def test_prepare_model_attaches_triton_ops_above_O0():
    import transformers

    from host.core.models.llama import LlamaForCausalLM

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, vocab_size=50, max_position_embeddings=32)
    eager, fast = LlamaForCausalLM(config), LlamaForCausalLM(config)
    CudaPlatform().prepare_model(eager, _config(level=0))
    CudaPlatform().prepare_model(fast, _config(level=1))
    assert eager.model.norm.kernel is None
    assert fast.model.norm.kernel is not None and fast.model.rotary_emb.kernel is not None
    assert torch.bfloat16 in fast.model.norm.kernel_dtypes


def test_graph_capture_wiring(monkeypatch):
    """Decode graphs need a capturing platform: CUDA says yes exactly when a device is there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not CudaPlatform().can_capture_graphs()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert CudaPlatform().can_capture_graphs()
    from host.plugins.torch_paged.attention import TorchPagedAttentionBackend
    from host.plugins.triton_ops.attention import TritonPagedAttentionBackend

    assert TritonPagedAttentionBackend.supports_cuda_graphs and not TorchPagedAttentionBackend.supports_cuda_graphs


def test_detection_reason(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CPU-only build" in CudaPlatform.detection_reason()
    monkeypatch.setattr(torch.version, "cuda", "13.0", raising=False)
    assert "sees no GPU" in CudaPlatform.detection_reason()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    assert CudaPlatform.detect() and "1 CUDA device(s): NVIDIA H200" in CudaPlatform.detection_reason()
    monkeypatch.setattr(torch.version, "hip", "6.4", raising=False)
    assert not CudaPlatform.detect() and "ROCm" in CudaPlatform.detection_reason()
