"""Perplexity of a fixed text, under host and under Hugging Face transformers (the reference).

The text (``tests/fixtures/perplexity_text.txt``: narrative, technical prose, dialogue, a recipe
and a letter, ~3500 tokens with SmolLM2's tokenizer) is tokenized once and the same ids are
scored by both: the ids are cut into non-overlapping windows of ``window`` tokens, each window
is scored as its own prompt (its first token has no context and is not scored), and the
perplexity is ``exp(mean negative log-probability)`` over every scored token. Both functions
use the same windows, so their results are comparable number for number; the windowing is
meant for comparing implementations and quantizations, not for an absolute figure.

    from perplexity import load_text_ids  # tests/ is on sys.path (tests/conftest.py), perplexity, hf_perplexity
    ids = load_text_ids(tokenizer)
    ppl = perplexity(llm, ids, window=512)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

TEXT_PATH = Path(__file__).parent / "fixtures" / "perplexity_text.txt"


def load_text_ids(tokenizer: Any, limit: int | None = None) -> list[int]:
    """The fixture text's token ids (no special tokens added), the first ``limit`` of them."""
    ids = list(tokenizer(TEXT_PATH.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"])
    return ids[:limit] if limit is not None else ids


def windows(token_ids: Sequence[int], window: int) -> list[list[int]]:
    """``token_ids`` cut into consecutive windows of ``window`` tokens (the last may be
    shorter); a trailing window of one token is dropped (it has nothing to score)."""
    if window < 2:
        raise ValueError(f"window={window} is too small: a window scores tokens 2..window, use window >= 2")
    chunks = [list(token_ids[i : i + window]) for i in range(0, len(token_ids), window)]
    return [c for c in chunks if len(c) >= 2]


def _from_nll(total_nll: float, count: int) -> float:
    if count == 0:
        raise ValueError("no token was scored: give at least 2 token ids")
    return math.exp(total_nll / count)


def perplexity(llm: Any, token_ids: Sequence[int], window: int = 512) -> float:
    """Perplexity of ``token_ids`` under a ``host.LLM``, from its prompt logprobs
    (``SamplingParams(prompt_logprobs=0, max_tokens=1)``: the logprob of each prompt token
    given the ones before it). ``window`` must fit the engine's max_model_len with one output
    token (window + 1 <= max_model_len). All windows go in one ``generate`` call."""
    from host import SamplingParams

    max_len = llm.config.scheduler.max_model_len
    if window + 1 > max_len:
        raise ValueError(f"window={window} does not fit max_model_len={max_len} with one output token; use window <= {max_len - 1}")
    chunks = windows(token_ids, window)
    params = SamplingParams(prompt_logprobs=0, max_tokens=1, temperature=0.0)
    outs = llm.generate([{"prompt_token_ids": c} for c in chunks], params)
    total, count = 0.0, 0
    for chunk, out in zip(chunks, outs):
        lps = out.prompt_logprobs
        if lps is None or len(lps) != len(chunk):
            raise RuntimeError(f"expected {len(chunk)} prompt logprob positions, got {None if lps is None else len(lps)}")
        for tok, pos in zip(chunk[1:], lps[1:]):
            total -= pos[tok].logprob
            count += 1
    return _from_nll(total, count)


def hf_perplexity(model_dir: str, token_ids: Sequence[int], window: int = 512, dtype: str = "float32") -> float:
    """The same perplexity under Hugging Face transformers on the weights in ``model_dir``
    (for the default model: ``host.core.models.default_model.resolve_model_path(None)``):
    one forward pass per window, log-softmax in float32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for chunk in windows(token_ids, window):
            ids = torch.tensor([chunk])
            logits = model(input_ids=ids).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            target = ids[0, 1:]
            total -= logp.gather(1, target[:, None]).sum().item()
            count += target.numel()
    return _from_nll(total, count)
