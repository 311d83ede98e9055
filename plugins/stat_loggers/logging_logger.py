"""The periodic log line (``logging``): throughput, running and waiting requests, KV-cache
usage and the prefix-cache hit rate, every ``--log-stats-interval`` seconds. It runs in the API
process.

The line goes to the ``host.stats`` logger, at INFO while there is traffic and at DEBUG when the
engine was idle over the interval and the one before (so an idle server stays quiet). The
throughputs are averages over the interval, and the hit rate is over the tokens looked up in
the interval (or since start-up if none were). ``--disable-log-stats`` turns it off.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from host.contracts.messages import SpecDecodingStats
from host.sdk import StatLogger

logger = logging.getLogger("host.stats")


class LoggingStatLogger(StatLogger):
    name = "logging"

    def __init__(self, context: Any = None, arg: str | None = None) -> None:
        super().__init__(context, arg)
        self.last_log = time.monotonic()
        self.prompt_tokens = self.generation_tokens = self.preemptions = 0
        self.queries = self.hits = 0
        self.last_scheduler_stats: Any = None
        self._was_busy = False
        self._spec_at_last_line = SpecDecodingStats()  # speculative decoding's totals at the last line

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.last_scheduler_stats = scheduler_stats
        if iteration_stats is not None:
            self.prompt_tokens += iteration_stats.num_prompt_tokens
            self.generation_tokens += iteration_stats.num_generation_tokens
            self.preemptions += iteration_stats.num_preemptions
            self.queries += iteration_stats.prefix_cache_queries
            self.hits += iteration_stats.prefix_cache_hits

    def line(self, now: float | None = None) -> tuple[str, bool]:
        """The line for the interval that ends ``now`` (and resets it), and whether it is busy."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self.last_log, 1e-9)
        s = self.last_scheduler_stats
        running = s.num_running_reqs if s is not None else 0
        waiting = s.num_waiting_reqs if s is not None else 0
        usage = s.kv_cache_usage if s is not None else 0.0
        if self.queries:
            hit_rate = self.hits / self.queries
        else:
            hit_rate = s.prefix_cache_hits / s.prefix_cache_queries if s is not None and s.prefix_cache_queries else 0.0
        text = (
            f"Engine {self.engine_index:03d}: Avg prompt throughput: {self.prompt_tokens / elapsed:.1f} tokens/s, "
            f"Avg generation throughput: {self.generation_tokens / elapsed:.1f} tokens/s, "
            f"Running: {running} reqs, Waiting: {waiting} reqs, "
            + (f"Preemptions: {self.preemptions}, " if self.preemptions else "")
            + f"KV cache usage: {usage * 100:.1f}%, Prefix cache hit rate: {hit_rate * 100:.1f}%"
            + self._spec_text(s)
        )
        busy = bool(self.prompt_tokens or self.generation_tokens or running or waiting)
        self.last_log = now
        self.prompt_tokens = self.generation_tokens = self.preemptions = 0
        self.queries = self.hits = 0
        return text, busy

    def _spec_text(self, s: Any) -> str:
        """``, Spec decode: ...`` for the interval (acceptance rate = accepted / drafted tokens,
        mean accepted length = 1 + accepted / drafts, as vLLM's); "" without speculation or drafts."""
        totals = getattr(s, "spec_decoding", None) if s is not None else None
        if not totals:
            return ""
        last, self._spec_at_last_line = self._spec_at_last_line, totals
        drafts = totals.num_drafts - last.num_drafts
        drafted = totals.num_draft_tokens - last.num_draft_tokens
        accepted = totals.num_accepted_tokens - last.num_accepted_tokens
        if drafts <= 0:
            return ""
        return (f", Spec decode: acceptance rate {accepted / max(drafted, 1) * 100:.1f}%, "
                f"mean accepted length {1 + accepted / drafts:.2f}, drafts {drafts}")

    def log(self) -> None:
        text, busy = self.line()
        level = logging.INFO if busy or self._was_busy else logging.DEBUG
        self._was_busy = busy
        logger.log(level, "%s", text)

    def log_engine_initialized(self) -> None:
        blocks = self.context.engine_info.get("num_gpu_blocks")
        if blocks:
            logger.debug("Engine %03d: KV cache of %d blocks", self.engine_index, blocks)
