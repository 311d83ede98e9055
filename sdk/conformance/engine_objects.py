"""Real engine objects the suites hand to a plugin (configs, requests, scheduler outputs)."""

from __future__ import annotations

from typing import Any


def engine_config(model: str, kv_connector: str | None = None, kv_role: str = "kv_both", extra: dict | None = None, **engine_args: Any) -> Any:
    """The :class:`EngineConfig` ``LLM(model, ...)`` would build (with a KV connector when named)."""
    from host.core.engine_args import EngineArgs

    args = dict(skip_tokenizer_init=True, max_model_len=96, block_size=8, **engine_args)
    if kv_connector:
        args["kv_transfer_config"] = {"kv_connector": kv_connector, "kv_role": kv_role, "kv_connector_extra_config": extra or {}}
    return EngineArgs(model=model, **args).create_engine_config()


def request(request_id: str, prompt_token_ids: list[int], block_size: int = 8) -> Any:
    """A scheduler :class:`Request` with its block hashes (as the engine builds it)."""
    from host.contracts.request import Request
    from host.core.kv_cache.hashing import make_block_hasher

    return Request(request_id, prompt_token_ids, block_hasher=make_block_hasher(block_size))


def scheduler_output() -> Any:
    """An empty step plan."""
    from host.contracts.scheduler_output import CachedRequestData, SchedulerOutput

    return SchedulerOutput([], CachedRequestData(), {}, 0)
