"""Structured outputs (JSON schema, regex, choice, EBNF grammar) as token bitmasks, with xgrammar.

``engine.py`` runs in the engine core (grammar compiles, the step's bitmask, feeding sampled
tokens back); ``worker.py`` in the workers (the bitmask as a mask on the logits).
"""
