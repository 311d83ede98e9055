"""Token budget and batching policy of one engine step."""

from __future__ import annotations

from dataclasses import dataclass

from host.core.config.common import SCHEDULING_POLICIES


@dataclass
class SchedulerConfig:
    """Token budget and batching policy of one engine step."""

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048  # copied from the model at start-up
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0: no cap per request per step
    policy: str = "fcfs"
    # plan step N+1 while step N runs on the device (EngineArgs: on for accelerators by default)
    async_scheduling: bool = False
    # a pooling model: each prompt runs whole in one step (chunked prefill off) and the front end
    # refuses prompts over max_num_batched_tokens, so the budget may be below max_model_len
    whole_prompts: bool = False

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs} must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} must be >= 1")
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"policy={self.policy!r} is not supported; use one of {', '.join(SCHEDULING_POLICIES)}")
