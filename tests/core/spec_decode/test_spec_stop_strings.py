"""Stop strings inside an accepted run, on the default model (its tokenizer): a step that emits
several tokens ends at the token that completes the stop string, exactly as the engine without
speculation does (the same token ids, text, finish and stop reasons; logprobs cut alike)."""

from __future__ import annotations

import pytest

from host import LLM, SamplingParams
from host.core.frontend.detokenizer import IncrementalDetokenizer

SPEC = {"method": "ngram", "num_speculative_tokens": 4}
TEXT = "Repeat this list exactly:\n\n" + "\n".join(f"{i}. item number {i} of the list" for i in range(1, 13))


def test_detokenizer_checks_several_tokens_one_by_one():
    from host.core.models.default_model import resolve_model_path
    from host.core.models.tokenizer import get_tokenizer

    tok = get_tokenizer(resolve_model_path(None))
    ids = tok.encode("The quick brown fox jumps over the lazy dog again", add_special_tokens=False)
    one = IncrementalDetokenizer(tok, SamplingParams(stop=["ps ov"]))
    hit_at = next(i for i, t in enumerate(ids) if one.update([t], False) is not None)
    for chunk in (2, 3, 4, len(ids)):
        many = IncrementalDetokenizer(tok, SamplingParams(stop=["ps ov"]))
        for start in range(0, len(ids), chunk):
            new = ids[start:start + chunk]
            hit = many.update(new, False)
            if hit is not None:
                break
        assert hit == "ps ov" and many.output_text == one.output_text == "The quick brown fox jum"
        assert many.token_ids == one.token_ids == ids[: hit_at + 1]
        assert many.num_dropped == start + len(new) - (hit_at + 1)
    # a stop string before the step's last token, which is EOS: the string still wins
    eos = IncrementalDetokenizer(tok, SamplingParams(stop=["ps ov"]))
    assert eos.update(ids[: hit_at + 3], True) == "ps ov" and eos.num_dropped == 2


@pytest.fixture(scope="module")
def engines():
    base = LLM(max_model_len=512, max_num_seqs=4)
    spec = LLM(max_model_len=512, max_num_seqs=4, speculative_config=SPEC)
    return base, spec


def test_stop_strings_end_at_the_right_token(engines):
    base, spec = engines
    conversation = [{"role": "user", "content": TEXT}]
    # the model copies the list, so ngram's drafts are accepted; the earliest-completing stop wins
    params = SamplingParams(max_tokens=40, temperature=0.0, stop=["4. item", "3 of"], logprobs=1)
    want = base.chat(conversation, params)[0].outputs[0]
    got = spec.chat(conversation, params)[0].outputs[0]
    assert want.finish_reason == "stop" and want.stop_reason == "3 of" and "number 2 of" in want.text
    assert (got.text, got.token_ids, got.finish_reason, got.stop_reason) == (
        want.text, want.token_ids, want.finish_reason, want.stop_reason)
    assert len(got.logprobs) == len(got.token_ids)
    assert got.cumulative_logprob == pytest.approx(want.cumulative_logprob, abs=1e-3)
    totals = spec.engine.scheduler.feature("spec_decode").totals()
    assert totals.num_accepted_tokens >= 8
    for llm in engines:
        manager = llm.engine.kv_cache_manager
        assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1
