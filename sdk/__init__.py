"""The stable surface for plugin authors: base classes, the ``hookimpl`` marker, testing kit.

A plugin module implements hooks from :mod:`host.hooks` with ``@hookimpl`` and is listed under
one entry-point group in its package's ``pyproject.toml``. See ``docs/plugins.md``.
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
from host.sdk.stat_logger import StatLogger

__all__ = [
    "AttentionBackend",
    "AttentionImpl",
    "AttentionMetadataBuilder",
    "AttentionRequirements",
    "CommonAttentionMetadata",
    "EndpointPlugin",
    "Executor",
    "IOProcessor",
    "KVConnector",
    "KVConnectorMetadata",
    "KVConnectorRole",
    "KVConnectorTransferResults",
    "LinearMethod",
    "MultipleOf",
    "Platform",
    "PlatformEnum",
    "QuantizationMethod",
    "StatLogger",
    "UnspecifiedPlatform",
    "hookimpl",
]
