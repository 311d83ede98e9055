"""Speculative decoding on the worker (docs/speculative.md): the proposers that draft tokens
(``ngram`` here, ``draft_model`` and ``eagle`` beside it), the rejection sampler that verifies
them against the target model, and the runner's verification path (``verify``)."""
