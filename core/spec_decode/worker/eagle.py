"""``eagle``: an EAGLE-style head (:mod:`host.core.spec_decode.worker.eagle_head`) drafts from the target's
hidden states.

The head's KV layer at position ``q`` holds (the token at ``q + 1``, the target's hidden state at
``q``), so its inputs lag the draft model's by one token (``SHIFT = 1``). After each step:

1. **Catch up.** One head forward over every request of the step: for a request that emitted
   tokens, the step's inputs up to its last accepted one, each with the next token (the last
   one with the token just emitted) and the target's hidden state there; for a prefill chunk
   short of its prompt's end, the chunk with the prompt's next tokens.
2. **Draft.** The argmax at the last accepted position is the first draft; then ``k - 1``
   one-token forwards, each feeding the previous draft and the head's own hidden state at the
   previous position.

Block sharing, the writable-position limit and the scratch KV past the known tokens are the
draft model's (:mod:`.draft_model`), from which this proposer inherits its step.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from host.contracts.forward_context import ForwardContext, set_forward_context
from host.core.spec_decode.worker.draft_model import DraftModelProposer, _Pass

logger = logging.getLogger("host.spec_decode")


class EagleProposer(DraftModelProposer):
    """Drafts with an EAGLE head loaded from ``speculative_config.model``, sharing the target's
    embedding, final norm and LM head."""

    SHIFT = 1

    def load(self) -> None:
        from host.core.spec_decode.worker.eagle_head import load_eagle_head, read_head_config

        runner = self.runner
        target_config = self.config.model.hf_config
        head_config = read_head_config(self.spec.model, target_config)
        self._check_compatible(head_config)
        backend = self._select_backend(head_config)
        self.model = load_eagle_head(self.spec.model, runner.model, target_config, runner.dtype, backend, device=runner.device)
        self.hf_config = head_config
        self._attach(backend)
        logger.info("EAGLE head %s (%d layers) drafts %d tokens per step", self.spec.model, self.num_layers, self.k)

    @property
    def num_kv_heads(self) -> int:
        return self.model.num_kv_heads

    @property
    def head_size(self) -> int:
        return self.model.head_size

    def _run(self, step: _Pass, hidden_in: torch.Tensor | None, device_ids: torch.Tensor | None = None) -> torch.Tensor:
        """One head forward over ``step``: its hidden states (after the final norm), which both
        score the next token and feed the next draft position."""
        if hidden_in is None:
            raise RuntimeError("the EAGLE head needs the hidden states of the positions it runs at")
        device = self.runner.device
        ids = device_ids if device_ids is not None else torch.from_numpy(step.input_ids).to(device)
        positions = torch.from_numpy(step.positions).to(device)
        ctx: Any = ForwardContext(self._metadata(step), self.kv_caches, {"attention_layers": self._attention_layers})
        with set_forward_context(ctx):
            return self.model(ids, positions, hidden_in)
