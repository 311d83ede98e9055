"""The ``ngram`` proposer (prompt lookup decoding): drafts are the tokens that followed an
earlier occurrence of the sequence's last n tokens.

For ``n`` from ``prompt_lookup_max`` down to ``prompt_lookup_min``, the last ``n`` tokens are
looked for earlier in the request's tokens (prompt and outputs); the first ``n`` that matches
wins. Of its matches, the latest one followed by ``k`` tokens is taken (recent context repeats
best), else the earliest (the longest continuation); the drafts are the up to ``k`` tokens
after it. Host numpy over each request's token row, no device work and no synchronisation.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from host.core.spec_decode.worker.proposer import DraftBatch, Proposer


def propose_ngram(tokens: np.ndarray, k: int, n_min: int, n_max: int) -> list[int]:
    """Up to ``k`` drafts for the sequence ``tokens`` (int64, 1-D), or ``[]`` without a match."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n:]
        # windows starting at 0 .. length - n - 1 (the suffix itself excluded)
        windows = sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size == 0:
            continue
        full = hits[hits + n + k <= length]
        start = int(full[-1] if full.size else hits[0]) + n
        return tokens[start: start + k].tolist()
    return []


class NgramProposer(Proposer):
    """Prompt-lookup drafts (see the module docstring); no model and no KV cache."""

    def __init__(self, config, runner) -> None:  # noqa: ANN001 (the Proposer signature)
        super().__init__(config, runner)
        self.n_min = int(self.spec.prompt_lookup_min)
        self.n_max = int(self.spec.prompt_lookup_max)

    def propose(self, batch: DraftBatch) -> list[list[int]]:
        return [propose_ngram(tokens, batch.k, self.n_min, self.n_max) for tokens in batch.token_ids]
