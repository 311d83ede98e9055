"""The stable surface for plugin authors: base classes, the ``hookimpl`` marker, the HTTP
error type, testing kit.

A plugin module implements hooks from :mod:`host.hooks` with ``@hookimpl`` and is listed under
one entry-point group in its package's ``pyproject.toml``. See ``docs/plugins.md``.

Plugins import the engine only through ``host.sdk``, never ``host.core`` (``tests/test_layering.py``
checks it). What they may use of the running engine is re-exported, unchanged, by submodules
that this package does not import itself (the core imports ``host.sdk``, and these modules import
the core): :mod:`host.sdk.models` (``DecoderModel``, ``set_layer_kernels``),
:mod:`host.sdk.forward_context` (``get_forward_context``), :mod:`host.sdk.sampling_params`
(``SamplingParams``, ``StructuredOutputsParams``), :mod:`host.sdk.runtime`
(``current_platform``, ``get_plugin_host``, ``resolve_qualname``), :mod:`host.sdk.moe` (the fused
experts op and its reference, the router) and :mod:`host.sdk.distributed` (what an executor plugin
builds on: the step broadcast queues, ``run_worker``, ``spawn_process``).
"""

from host.hooks.markers import hookimpl
from host.sdk.attention import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionRequirements,
    CommonAttentionMetadata,
    MultipleOf,
)
from host.sdk.endpoint import EndpointPlugin
from host.sdk.eplb_policy import EplbPolicy
from host.sdk.errors import APIError, error_body, error_response
from host.sdk.executor import Executor
from host.sdk.io_processor import IOProcessor
from host.sdk.kv_connector import (
    KVConnector,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from host.sdk.platform import Platform, PlatformEnum, UnspecifiedPlatform
from host.sdk.quantization import LinearMethod, QuantizationMethod
from host.sdk.reasoning_parser import ReasoningParser, ReasoningStream
from host.sdk.stat_logger import StatLogger
from host.sdk.tool_parser import ExtractedToolCalls, PartialToolCalls, ToolCall, ToolCallStream, ToolParser

__all__ = [
    "APIError",
    "AttentionBackend",
    "AttentionImpl",
    "AttentionMetadataBuilder",
    "AttentionRequirements",
    "CommonAttentionMetadata",
    "EndpointPlugin",
    "EplbPolicy",
    "Executor",
    "ExtractedToolCalls",
    "IOProcessor",
    "KVConnector",
    "KVConnectorMetadata",
    "KVConnectorRole",
    "KVConnectorTransferResults",
    "LinearMethod",
    "MultipleOf",
    "PartialToolCalls",
    "Platform",
    "PlatformEnum",
    "QuantizationMethod",
    "ReasoningParser",
    "ReasoningStream",
    "StatLogger",
    "ToolCall",
    "ToolCallStream",
    "ToolParser",
    "UnspecifiedPlatform",
    "error_body",
    "error_response",
    "hookimpl",
]
