"""Structured outputs under speculative decoding, on the real SmolLM2-135M and its tokenizer:

- the grammar masks every drafted position: the bitmask rows of a request verifying drafts equal
  those of a separate xgrammar matcher stepped through the drafts one token at a time, and the
  request's own matcher is where it was afterwards;
- drafts are cut to the prefix the grammar accepts (inside a reasoning block nothing is cut,
  and a draft that closes the block starts the grammar for the ones after it);
- end to end with ngram: greedy JSON-schema, regex and choice generations equal the engine's
  without speculation, drafts were verified for them and accepted, and seeded sampled
  generations all parse and validate; the pool is all free afterwards.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
import xgrammar as xgr

from host import LLM, SamplingParams
from host.contracts.request import Request
from host.contracts.sampling_params import StructuredOutputsParams
from host.core.structured_output.engine import StructuredOutputManager

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
         "auto_off_threshold": 0}  # drafting never switches off: every step verifies what ngram finds
PEOPLE = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "minItems": 3,
    "maxItems": 4,
}
# the prompt quotes JSON with spaces after ':' and ',', which the grammar (no free whitespace)
# forbids: ngram drafts copied from it are cut where the grammar refuses them
QUOTE = ('Here is a list: [{"name": "Ann", "age": 31}, {"name": "Bob", "age": 42}, {"name": "Cid", "age": 27}].\n'
         "Write the same list again as JSON: ")


@pytest.fixture(scope="module")
def engines():
    base = LLM(None, max_model_len=512)
    spec = LLM(None, max_model_len=512, speculative_config=NGRAM)
    return base, spec


@pytest.fixture(scope="module")
def manager(engines):
    base, _ = engines
    return StructuredOutputManager(base.config.model.tokenizer, base.config.model.hf_config.vocab_size)


def _constrained(manager, tokenizer, params: StructuredOutputsParams, prompt: str = "x") -> Request:
    request = Request("r", tokenizer.encode(prompt), SamplingParams(max_tokens=64, structured_outputs=params), eos_token_id=0)
    manager.grammar_init(request)
    request.structured_output.future.result(timeout=120)
    assert request.structured_output.ready() and request.structured_output.error is None
    return request


def _reference_rows(manager, params, tokens: list[int]) -> torch.Tensor:
    """One bitmask row per position, from a fresh matcher that accepts the tokens one by one."""
    matcher = manager._compile(params)
    rows = torch.full((len(tokens) + 1, manager.words), -1, dtype=torch.int32)
    for j in range(len(tokens) + 1):
        matcher.fill_next_token_bitmask(rows, j)
        if j < len(tokens):
            assert matcher.accept_token(tokens[j])
    return rows


def test_each_drafted_position_gets_its_own_mask_and_the_matcher_stays_put(engines, manager):
    tokenizer = engines[0].get_tokenizer()
    params = StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2,4}")
    request = _constrained(manager, tokenizer, params)
    drafts = tokenizer.encode("123-abc", add_special_tokens=False)
    before = manager.grammar_bitmask([request])
    rows = manager.grammar_bitmask([request, request], [drafts, []])
    assert rows.shape == (len(drafts) + 2, manager.words)
    expected = _reference_rows(manager, params, drafts)
    assert torch.equal(rows[: len(drafts) + 1], expected)
    assert not torch.equal(expected[0], expected[-1])  # the positions really differ
    assert torch.equal(rows[-1], before[0])  # the second request's one row: the state before
    assert torch.equal(manager.grammar_bitmask([request]), before)  # rolled back


def test_drafts_are_cut_to_what_the_grammar_accepts(engines, manager):
    tokenizer = engines[0].get_tokenizer()
    request = _constrained(manager, tokenizer, StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2,4}"))
    good = tokenizer.encode("123-ab", add_special_tokens=False)
    bad = tokenizer.encode(" hello", add_special_tokens=False)
    assert StructuredOutputManager.valid_drafts(request, good + bad) == good
    assert StructuredOutputManager.valid_drafts(request, bad + good) == []
    assert StructuredOutputManager.valid_drafts(request, good) == good
    # an unconstrained request keeps every draft
    plain = Request("p", [1, 2], SamplingParams(max_tokens=8), eos_token_id=0)
    assert StructuredOutputManager.valid_drafts(plain, bad) == bad


def test_a_draft_that_closes_the_reasoning_starts_the_grammar(engines, manager):
    tokenizer = engines[0].get_tokenizer()
    end = tokenizer.encode("</think>", add_special_tokens=False)
    params = StructuredOutputsParams(choice=["yes", "no"], reasoning_end_token_ids=end)
    request = _constrained(manager, tokenizer, params)
    thinking = tokenizer.encode(" let me see", add_special_tokens=False)
    yes = tokenizer.encode("yes", add_special_tokens=False)
    # inside the reasoning anything goes; after the end tag only the grammar's tokens
    assert StructuredOutputManager.valid_drafts(request, thinking + end + yes) == thinking + end + yes
    assert StructuredOutputManager.valid_drafts(request, thinking + end + thinking) == thinking + end
    drafts = thinking + end + yes
    rows = manager.grammar_bitmask([request], [drafts])
    n = len(thinking) + len(end)
    assert (rows[:n] == -1).all(), "positions inside the reasoning are unconstrained"
    assert torch.equal(rows[n:], _reference_rows(manager, StructuredOutputsParams(choice=["yes", "no"]), yes))
    assert not request.structured_output.active  # the request itself has not seen the tag


def _pool_free(llm: LLM) -> bool:
    m = llm.engine.kv_cache_manager
    return m.block_pool.get_num_free_blocks() == m.num_blocks - 1 and not m.req_to_blocks


def test_greedy_structured_generations_equal_the_plain_engine_with_drafts_accepted(engines):
    base, spec = engines
    prompts = [QUOTE, QUOTE.replace("Ann", "Dora").replace("31", "55"), "Call 555-123-4567 or 555-123-", "Answer yes or no: is water wet? "]
    params = [
        SamplingParams(max_tokens=80, temperature=0, structured_outputs={"json": PEOPLE}),
        SamplingParams(max_tokens=80, temperature=0, structured_outputs={"json": PEOPLE}),
        SamplingParams(max_tokens=16, temperature=0, structured_outputs={"regex": r"[0-9]{3}-[0-9]{3}-[0-9]{4}"}),
        SamplingParams(max_tokens=8, temperature=0, structured_outputs={"choice": ["yes", "no"]}),
    ]
    before = spec.engine.scheduler.feature("spec_decode").totals()
    want = [o.outputs[0] for o in base.generate(prompts, params)]
    got = [o.outputs[0] for o in spec.generate(prompts, params)]
    after = spec.engine.scheduler.feature("spec_decode").totals()
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for out in got[:2]:
        jsonschema.validate(json.loads(out.text), PEOPLE)
    assert got[3].text in ("yes", "no")
    assert after.num_draft_tokens > before.num_draft_tokens, "no drafts were verified"
    assert after.num_accepted_tokens > before.num_accepted_tokens, "no draft was accepted"
    assert _pool_free(spec)


def test_seeded_sampled_json_under_speculation_parses_and_validates(engines):
    _, spec = engines
    params = [SamplingParams(max_tokens=80, temperature=0.8, seed=s, structured_outputs={"json": PEOPLE}) for s in range(2)]
    outs = spec.generate([QUOTE] * 2, params)
    for out in outs:
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        jsonschema.validate(json.loads(out.outputs[0].text), PEOPLE)
    again = spec.generate([QUOTE], params[:1])
    assert again[0].outputs[0].token_ids == outs[0].outputs[0].token_ids  # seeded: reproducible
    assert _pool_free(spec)


def test_xgrammar_rolls_back_a_terminated_matcher():
    # walk_drafts relies on it: a draft run may end with the grammar's stop token
    info = xgr.TokenizerInfo(["a", "b", "<eos>"], stop_token_ids=[2])
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar('root ::= "a"'))
    assert matcher.accept_token(0) and matcher.accept_token(2) and matcher.is_terminated()
    matcher.rollback(2)
    assert not matcher.is_terminated() and matcher.accept_token(0)
