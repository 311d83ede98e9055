"""What the scheduler refuses up front, with the fix in the error: a configuration under which a
long prompt could never be scheduled, and a prompt that can never fit."""

from __future__ import annotations

from typing import Any

from host.contracts.request import Request


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_scheduler_config(scheduler_config: Any, cache_config: Any, kv: Any) -> None:
    """The cache's block size matches the KV cache manager's; without chunked prefill, a whole
    ``max_model_len`` prompt fits one step's token budget (a pooling model's front end checks that itself)."""
    if cache_config.block_size != kv.block_size:
        raise ValueError(
            f"cache_config.block_size={cache_config.block_size} differs from the KV cache "
            f"manager's block_size={kv.block_size}"
        )
    if (
        not scheduler_config.enable_chunked_prefill
        and scheduler_config.max_num_batched_tokens < scheduler_config.max_model_len
        and not getattr(scheduler_config, "whole_prompts", False)  # a pooling model's front end checks it
    ):
        raise ValueError(
            f"max_num_batched_tokens={scheduler_config.max_num_batched_tokens} is smaller than "
            f"max_model_len={scheduler_config.max_model_len}, so a long prompt could never be "
            "scheduled without chunked prefill; enable chunked prefill or raise "
            "--max-num-batched-tokens to at least max_model_len"
        )


def check_prompt_fits(request: Request, max_model_len: int, kv: Any) -> None:
    """A ``ValueError`` for an empty prompt, or one longer than ``max_model_len`` or than the whole KV cache."""
    req_id = request.request_id
    n = request.num_prompt_tokens
    if n == 0:
        raise ValueError(f"request {req_id!r} has an empty prompt; send at least one token")
    if n > max_model_len:
        raise ValueError(
            f"request {req_id!r} has {n} prompt tokens, more than max_model_len="
            f"{max_model_len}; shorten the prompt or raise --max-model-len"
        )
    usable = kv.num_blocks - 1
    needed = kv.blocks_to_hold(n) if hasattr(kv, "blocks_to_hold") else _cdiv(n, kv.block_size)
    if needed > usable:
        raise ValueError(
            f"request {req_id!r} has {n} prompt tokens (at least {needed} blocks of {kv.block_size} "
            f"tokens) but the KV cache holds only {usable} blocks; raise --kv-cache-memory or shorten the prompt"
        )
