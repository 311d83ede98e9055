"""tests/perplexity.py against the reference: host's float32 perplexity of the fixture text's
first 512 tokens (two windows of 256) equals transformers' on the same weights within 0.1%."""

from __future__ import annotations

import pytest
from perplexity import TEXT_PATH, hf_perplexity, load_text_ids, perplexity

from host import LLM
from host.core.models.default_model import resolve_model_path


def test_fixture_text_length():
    from transformers import AutoTokenizer

    ids = load_text_ids(AutoTokenizer.from_pretrained(resolve_model_path(None)))
    assert 2500 <= len(ids) <= 3500, f"{TEXT_PATH.name} has {len(ids)} tokens; the quantization accuracy checks expect 2500-3500"


def test_fp32_perplexity_matches_transformers():
    path = resolve_model_path(None)
    llm = LLM(quantization="none", dtype="float32", max_model_len=512, max_num_seqs=4)
    try:
        ids = load_text_ids(llm.get_tokenizer(), limit=512)
        ours = perplexity(llm, ids, window=256)
    finally:
        llm.shutdown()
    ref = hf_perplexity(path, ids, window=256)
    assert 1.5 < ref < 200, f"reference perplexity {ref} is implausible for English text"
    assert ours == pytest.approx(ref, rel=1e-3), f"host fp32 perplexity {ours} vs transformers {ref}"
