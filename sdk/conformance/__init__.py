"""Conformance suites: one test class per plugin family, for a plugin author to subclass.

Each suite checks the contract its family's plugins must keep, against a reference (for an
attention backend, plain paged attention written out in torch; for a quantization method, the
unquantized matmul), never against the plugin's own output alone. Subclass one in a test module
under a name starting with ``Test`` and set the class attributes the suite names::

    from host.sdk.testing import EndpointConformance

    class TestMyEndpoint(EndpointConformance):
        endpoint = MyEndpoint()

pytest then runs every ``test_*`` method of the suite against the plugin. The suites use only the
public SDK plus the engine pieces a test needs (requests, scheduler outputs); each is cheap
(seconds on a CPU), so they run in every plugin's CI.
"""

from host.sdk.conformance.attention import AttentionBackendConformance, reference_paged_attention
from host.sdk.conformance.endpoint import EndpointConformance
from host.sdk.conformance.executor import ExecutorConformance
from host.sdk.conformance.io_processor import IOProcessorConformance
from host.sdk.conformance.kv_connector import KVConnectorConformance
from host.sdk.conformance.models import ModelConformance
from host.sdk.conformance.parsers import ReasoningParserConformance, ToolParserConformance
from host.sdk.conformance.platform import PlatformConformance
from host.sdk.conformance.quantization import QuantizationMethodConformance
from host.sdk.conformance.stat_logger import StatLoggerConformance

__all__ = [
    "AttentionBackendConformance",
    "EndpointConformance",
    "ExecutorConformance",
    "IOProcessorConformance",
    "KVConnectorConformance",
    "ModelConformance",
    "PlatformConformance",
    "QuantizationMethodConformance",
    "ReasoningParserConformance",
    "StatLoggerConformance",
    "ToolParserConformance",
    "reference_paged_attention",
]
