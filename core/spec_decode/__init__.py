"""Speculative decoding (docs/speculative.md), by process:

- ``scheduler.py`` (engine core): the feature's seam into the scheduler — drafts contributed to
  running decodes, KV lookahead, the rollback of rejected drafts, the auto-off, the totals; and
  the start-up checks (``check_speculative_support``);
- ``worker/`` (workers): the proposers (``ngram``, ``draft_model``, ``eagle`` with its
  ``eagle_head``), the rejection sampler, and the verify step kind (``verify.py``).
"""
