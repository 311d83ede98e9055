"""Engine configuration: one frozen-after-start-up dataclass per concern, composed in
:class:`EngineConfig`. Every user-settable value is validated here with a ``ValueError`` that
names the flag and the fix.

One module per concern: :mod:`.model`, :mod:`.load`, :mod:`.cache`, :mod:`.quantization`,
:mod:`.scheduler`, :mod:`.parallel`, :mod:`.compilation`, :mod:`.kv_transfer`,
:mod:`.speculative`, :mod:`.lora`, and :mod:`.engine` composing them; :mod:`.common` holds the
flags' choice tuples and the JSON-object flag parsing. Every public name is importable from
``host.core.config``. The package imports nothing else of ``host``.
"""

from host.core.config.cache import CacheConfig
from host.core.config.common import (
    DTYPE_ALIASES,
    DTYPES,
    KV_CACHE_DTYPES,
    KV_LOAD_FAILURE_POLICIES,
    KV_ROLES,
    LOAD_FORMATS,
    MODEL_IMPLS,
    QUANTIZED_ACTIVATIONS,
    SCHEDULING_POLICIES,
    SPEC_METHODS,
    config_from_flag,
    json_flag_object,
)
from host.core.config.compilation import CompilationConfig, default_graph_sizes
from host.core.config.engine import EngineConfig
from host.core.config.kv_transfer import KVTransferConfig
from host.core.config.load import LoadConfig
from host.core.config.lora import LoRAConfig
from host.core.config.model import ModelConfig
from host.core.config.parallel import EPLBConfig, ParallelConfig
from host.core.config.quantization import QuantizationConfig, compile_pattern
from host.core.config.scheduler import SchedulerConfig
from host.core.config.speculative import SpeculativeConfig

__all__ = [
    "DTYPES",
    "DTYPE_ALIASES",
    "KV_CACHE_DTYPES",
    "KV_LOAD_FAILURE_POLICIES",
    "KV_ROLES",
    "LOAD_FORMATS",
    "MODEL_IMPLS",
    "QUANTIZED_ACTIVATIONS",
    "SCHEDULING_POLICIES",
    "SPEC_METHODS",
    "CacheConfig",
    "CompilationConfig",
    "EngineConfig",
    "KVTransferConfig",
    "LoRAConfig",
    "LoadConfig",
    "ModelConfig",
    "EPLBConfig",
    "ParallelConfig",
    "QuantizationConfig",
    "SchedulerConfig",
    "SpeculativeConfig",
    "compile_pattern",
    "config_from_flag",
    "default_graph_sizes",
    "json_flag_object",
]
