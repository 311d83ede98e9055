"""Structured outputs with xgrammar on the real SmolLM2-135M: every constrained generation
parses and validates; the grammar compiles off the scheduling thread; bad constraints fail
cleanly."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest
import torch

from host import LLM, SamplingParams
from host.contracts.request import RequestStatus
from host.core.structured_output.engine import choice_grammar
from host.core.structured_output.worker import bitmask_to_bool

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo", "Lima"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm():
    return LLM(None, max_model_len=512)


def blocks_free(llm):
    m = llm.engine.kv_cache_manager
    return m.block_pool.get_num_free_blocks() == m.num_blocks - 1 and not m.req_to_blocks


def test_ten_json_schema_generations_parse_and_validate(llm):
    conversations = [
        [{"role": "user", "content": f"Invent person #{i}: give name, age, city and a few tags as JSON."}]
        for i in range(10)
    ]
    params = [
        SamplingParams(max_tokens=120, temperature=0.8, top_p=0.95, seed=i, structured_outputs={"json": SCHEMA})
        for i in range(10)
    ]
    outs = llm.chat(conversations, params)
    texts = [o.outputs[0].text for o in outs]
    for text, out in zip(texts, outs):
        assert out.outputs[0].finish_reason == "stop", f"did not finish: {text!r}"
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts)) > 5, "different seeds give different objects"
    assert blocks_free(llm)


def test_choice_regex_grammar_and_json_object(llm):
    out = llm.generate(["My favourite colour is"] * 3, [
        SamplingParams(max_tokens=8, temperature=1.0, seed=s, structured_outputs={"choice": ["red", "green", "blue \"sky\""]})
        for s in range(3)
    ])
    assert all(o.outputs[0].text in ("red", "green", 'blue "sky"') for o in out)
    phone = llm.generate("Call me at", SamplingParams(max_tokens=20, structured_outputs={"regex": r"\(\d{3}\) \d{3}-\d{4}"}))
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", phone[0].outputs[0].text)
    grammar = 'root ::= "yes" | "no" | "maybe, " [0-9] " percent"'
    ans = llm.generate("Will it rain?", SamplingParams(max_tokens=10, temperature=1.0, seed=1, structured_outputs={"grammar": grammar}))
    assert re.fullmatch(r"yes|no|maybe, [0-9] percent", ans[0].outputs[0].text)
    obj = llm.generate("A JSON object:", SamplingParams(max_tokens=60, structured_outputs={"json_object": True}))
    if obj[0].outputs[0].finish_reason == "stop":
        assert isinstance(json.loads(obj[0].outputs[0].text), dict)
    else:  # ran out of tokens: still a prefix of an object
        assert obj[0].outputs[0].text.lstrip().startswith("{")
    assert blocks_free(llm)


def test_bad_constraint_is_a_clear_error_and_frees_everything(llm):
    with pytest.raises(ValueError, match="structured_outputs.regex could not be compiled"):
        llm.generate(["a", "b"], [SamplingParams(max_tokens=4), SamplingParams(max_tokens=4, structured_outputs={"regex": "(open"})])
    with pytest.raises(ValueError, match="structured_outputs must set exactly one"):
        SamplingParams(structured_outputs={})
    assert blocks_free(llm) and not llm.engine.scheduler.requests


def test_grammar_compiles_off_the_scheduling_thread(llm):
    manager = llm.engine.structured_output_manager
    gate = threading.Event()
    compile_threads = []
    original = manager._compile

    def gated(params):
        compile_threads.append(threading.current_thread().name)
        gate.wait(30)
        return original(params)

    manager._compile = gated
    try:
        from host.contracts.request import Request

        constrained = Request("so", [1, 2, 3], SamplingParams(max_tokens=3, structured_outputs={"choice": ["ab", "cd"]}))
        plain = Request("plain", [4, 5, 6], SamplingParams(max_tokens=3, ignore_eos=True))
        llm.engine.add_request(constrained)
        llm.engine.add_request(plain)
        for _ in range(4):  # the plain request runs to the end while the grammar compiles
            llm.engine.step()
        assert constrained.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
        assert "plain" not in llm.engine.scheduler.requests
        gate.set()
        text = []
        while llm.engine.has_unfinished_requests():
            for out in llm.engine.step().outputs:
                text += out.new_token_ids
        assert llm.get_tokenizer().decode(text, skip_special_tokens=True) in ("ab", "cd")
        assert compile_threads and compile_threads[0].startswith("host-grammar")
    finally:
        manager._compile = original
        gate.set()
    assert blocks_free(llm)


def test_bitmask_unpacking_and_choice_grammar():
    bitmask = torch.tensor([[-1, 0], [0b101, (1 << 3) - (1 << 31)]], dtype=torch.int32)
    mask = bitmask_to_bool(bitmask, 40)
    assert mask[0, :32].all() and not mask[0, 32:].any()
    assert mask[1].nonzero().squeeze(1).tolist() == [0, 2, 35]  # bit 63 is past the vocab
    assert choice_grammar(['a"b', "c"]) == 'root ::= "a\\"b" | "c"'


def test_grammar_applies_only_after_the_reasoning_end_tokens(llm):
    """``reasoning_end_token_ids``: the tokens up to and including the end tag are the model's
    free (greedy) choice, as transformers generates them; the ones after it are schema-valid JSON."""
    from transformers import AutoTokenizer

    from helpers import hf_greedy, hf_model
    from host.core.models.default_model import default_model_path

    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["age"], "additionalProperties": False}
    conv = [{"role": "user", "content": "Describe a person, then give their age as JSON."}]
    plain = llm.chat([conv], SamplingParams(max_tokens=1, temperature=0))[0]
    prompt = list(plain.prompt_token_ids)
    ref = hf_greedy(hf_model(default_model_path()), prompt, 6)
    k = next(i for i in range(1, 6) if ref[i] not in ref[:i] and ref[i] not in prompt)  # the "end tag": ref[k]
    bound = llm.chat([conv], SamplingParams(max_tokens=1, temperature=0, structured_outputs={"json": schema}))[0]
    assert bound.outputs[0].token_ids[0] != ref[0]  # without an end tag the grammar binds from the first token

    out = llm.chat([conv], SamplingParams(
        max_tokens=40, temperature=0, structured_outputs={"json": schema, "reasoning_end_token_ids": [ref[k]]},
    ))[0].outputs[0]
    ids = list(out.token_ids)
    assert ids[: k + 1] == ref[: k + 1]  # unconstrained up to and including the end token
    assert out.finish_reason == "stop", out.text
    after = AutoTokenizer.from_pretrained(default_model_path()).decode(ids[k + 1:], skip_special_tokens=True)
    jsonschema.validate(json.loads(after), schema)
    assert blocks_free(llm)


def test_reasoning_end_is_a_token_sequence_and_may_be_in_the_prompt():
    from concurrent.futures import Future

    from host.contracts.sampling_params import StructuredOutputsParams
    from host.core.structured_output.engine import StructuredOutputRequest, contains

    so = StructuredOutputRequest(StructuredOutputsParams(json_object=True, reasoning_end_token_ids=[5, 6]), Future())
    for tok, active in ((5, False), (7, False), (6, False), (5, False), (6, True)):
        so.see_reasoning_token(tok)
        assert so.active is active
    assert contains([1, 5, 6, 2], [5, 6]) and not contains([5, 1, 6], [5, 6]) and not contains([5], [5, 6])
    with pytest.raises(ValueError, match="reasoning_end_token_ids"):
        StructuredOutputsParams(json_object=True, reasoning_end_token_ids=[])
    with pytest.raises(ValueError, match="out of vocabulary"):
        SamplingParams(structured_outputs={"json_object": True, "reasoning_end_token_ids": [10**9]}).verify(1000)
