"""Every built-in plugin passes its family's conformance suite (host.sdk.testing), as a third-party
one would in its own CI."""

from __future__ import annotations

import functools

import pytest

import host.plugins.builtin_cpu.attention_plugin as cpu_attention_plugin
import host.plugins.builtin_cpu.platform_plugin as cpu_platform_plugin
import host.plugins.builtin_cuda.platform_plugin as cuda_platform_plugin
import host.plugins.builtin_rocm.platform_plugin as rocm_platform_plugin
import host.plugins.endpoints as endpoints_plugin
import host.plugins.executors.mp as mp_plugin
import host.plugins.executors.uniproc as uniproc_plugin
import host.plugins.kv_connectors as kv_plugin
import host.plugins.quantization as quant_plugin
import host.plugins.reasoning_parsers as reasoning_plugin
import host.plugins.stat_loggers as stat_plugin
import host.plugins.tool_parsers as tool_plugin
import host.plugins.torch_paged.attention_plugin as torch_paged_plugin
from host.plugins.builtin_cpu.attention import CpuPagedAttentionBackend
from host.plugins.builtin_cpu.platform import CpuPlatform
from host.plugins.builtin_cuda.platform import CudaPlatform
from host.plugins.builtin_rocm.platform import RocmPlatform
from host.plugins.executors.mp import MultiprocExecutor
from host.plugins.executors.uniproc import UniprocExecutor
from host.plugins.kv_connectors.p2p.connector import P2PConnector
from host.plugins.kv_connectors.shared_storage import SharedStorageConnector
from host.plugins.quantization.fp8 import Fp8Method
from host.plugins.quantization.gguf import GGUFMethod
from host.plugins.quantization.int8 import Int8Method
from host.plugins.reasoning_parsers.think_tags import DeepSeekR1ReasoningParser, Qwen3ReasoningParser
from host.plugins.stat_loggers.jsonl import JsonlStatLogger
from host.plugins.stat_loggers.logging_logger import LoggingStatLogger
from host.plugins.stat_loggers.prometheus import PrometheusStatLogger
from host.plugins.tool_parsers.hermes import HermesToolParser
from host.plugins.tool_parsers.llama3_json import Llama3JsonToolParser
from host.plugins.tool_parsers.pythonic import PythonicToolParser
from host.plugins.torch_paged.attention import TorchPagedAttentionBackend
from host.sdk.testing import (
    AttentionBackendConformance,
    EndpointConformance,
    ExecutorConformance,
    KVConnectorConformance,
    PlatformConformance,
    QuantizationMethodConformance,
    ReasoningParserConformance,
    StatLoggerConformance,
    ToolParserConformance,
)

# -- attention backends -------------------------------------------------------------------------


class TestTorchPaged(AttentionBackendConformance):
    backend = TorchPagedAttentionBackend
    plugin_module = torch_paged_plugin


class TestCpuPaged(AttentionBackendConformance):
    backend = CpuPagedAttentionBackend
    plugin_module = cpu_attention_plugin


class TestCpuPagedBf16(AttentionBackendConformance):
    backend = CpuPagedAttentionBackend
    dtype = "bfloat16"
    atol = 3e-2


# -- platforms ----------------------------------------------------------------------------------


class TestCpuPlatform(PlatformConformance):
    platform = CpuPlatform
    plugin_module = cpu_platform_plugin


class TestCudaPlatform(PlatformConformance):
    platform = CudaPlatform
    plugin_module = cuda_platform_plugin


class TestRocmPlatform(PlatformConformance):
    platform = RocmPlatform
    plugin_module = rocm_platform_plugin


# -- quantization methods -----------------------------------------------------------------------


class TestInt8(QuantizationMethodConformance):
    method = Int8Method
    plugin_module = quant_plugin
    rtol = 0.02


class TestFp8(QuantizationMethodConformance):
    method = Fp8Method
    rtol = 0.08


class TestGGUF(QuantizationMethodConformance):
    method = GGUFMethod
    rtol = 0.05

    def source_tensor(self, weight):
        """A GGUF checkpoint holds Q8_0 blocks (quantized here with the gguf package)."""
        import numpy as np
        import torch
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        from host.sdk.models import GGUFTensor

        blocks = quantize(weight.numpy().astype(np.float32), GGMLQuantizationType.Q8_0)
        return GGUFTensor(torch.from_numpy(np.ascontiguousarray(blocks)), int(GGMLQuantizationType.Q8_0), tuple(weight.shape))


# -- KV connectors ------------------------------------------------------------------------------


class TestSharedStorage(KVConnectorConformance):
    connector = SharedStorageConnector
    plugin_module = kv_plugin

    def extra_config(self, tmp_path):
        return {"path": str(tmp_path / "kv")}


class TestP2P(KVConnectorConformance):
    connector = P2PConnector


# -- executors ----------------------------------------------------------------------------------


class TestUniproc(ExecutorConformance):
    executor = UniprocExecutor
    plugin_module = uniproc_plugin


@pytest.mark.slow
class TestMultiproc(ExecutorConformance):
    executor = MultiprocExecutor
    plugin_module = mp_plugin


# -- endpoints: every built-in route plugin declares what it attaches -----------------------------


def _builtin_endpoints():
    found = []
    endpoints_plugin.host_register_endpoints(found.append)
    return found


# each route behind its flag, with the flag on
ALL_ON = dict(enable_tokenizer_info_endpoint=True, enable_server_load_tracking=True, enable_lora_runtime_updates=True)


@functools.lru_cache(maxsize=1)
def _lora_engine_config():
    from host.sdk.conformance.engine_objects import engine_config
    from host.sdk.conformance.tiny_model import tiny_llama

    return engine_config(tiny_llama(), enable_lora=True)


class _WithEngineConfig(EndpointConformance):
    settings = ALL_ON

    def prepare_app(self, app):
        super().prepare_app(app)
        app.state.config = _lora_engine_config()


@pytest.mark.parametrize("endpoint", _builtin_endpoints(), ids=lambda e: e.name)
def test_builtin_endpoints_pass_the_suite(endpoint):
    suite = type("Suite", (_WithEngineConfig,), {"endpoint": endpoint})()
    suite.test_declares_exactly_the_routes_it_attaches()


class TestEndpointsRegistration(EndpointConformance):
    endpoint = _builtin_endpoints()[0]
    plugin_module = endpoints_plugin


# -- stat loggers -------------------------------------------------------------------------------


class TestPrometheus(StatLoggerConformance):
    logger = PrometheusStatLogger
    plugin_module = stat_plugin


class TestLogging(StatLoggerConformance):
    logger = LoggingStatLogger


class TestJsonl(StatLoggerConformance):
    logger = JsonlStatLogger

    def make_arg(self, tmp_path):
        return str(tmp_path / "stats.jsonl")


# -- parsers ------------------------------------------------------------------------------------


class TestHermes(ToolParserConformance):
    parser = HermesToolParser
    plugin_module = tool_plugin
    samples = [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', [("get_weather", {"city": "Paris"})], None),
        ("No call here.", [], "No call here."),
    ]


class TestLlama3Json(ToolParserConformance):
    parser = Llama3JsonToolParser
    samples = [
        ('{"name": "add", "parameters": {"a": 1, "b": 2}}', [("add", {"a": 1, "b": 2})], None),
        ("Plain text.", [], "Plain text."),
    ]


class TestPythonic(ToolParserConformance):
    parser = PythonicToolParser
    samples = [('[get_weather(city="Paris"), add(a=1, b=2)]', [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})], None)]


class TestDeepSeekR1(ReasoningParserConformance):
    parser = DeepSeekR1ReasoningParser
    plugin_module = reasoning_plugin
    samples = [("I think.</think>The answer.", "I think.", "The answer."), ("<think>Hmm</think>Yes", "Hmm", "Yes")]


class TestQwen3(ReasoningParserConformance):
    parser = Qwen3ReasoningParser
    samples = [("<think>Hmm</think>Yes", "Hmm", "Yes"), ("Just content.", None, "Just content.")]
