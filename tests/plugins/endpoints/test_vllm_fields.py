"""vLLM's response fields on both OpenAI routes, through the official ``openai`` client on one
``host serve`` (``--enable-prompt-tokens-details``; the session's ``flags_server``): ``echo`` (its
prompt logprobs checked against transformers on the same weights), ``return_token_ids``, ``return_tokens_as_token_ids``,
``prompt_logprobs`` (null when not asked), ``stream_options`` (``continuous_usage_stats``, refused
without ``stream``), ``prompt_tokens_details.cached_tokens``, ``truncate_prompt_tokens`` /
``truncation_side``, the logprob caps and the errors naming bad token ids."""

from __future__ import annotations

import openai
import pytest

from helpers import Server, hf_beams, hf_model

BLOCK = 16
PROMPT = "The quick brown fox jumps over the lazy dog because"


@pytest.fixture(scope="module")
def server(flags_server) -> Server:
    """The session's ``flags_server`` (tests/conftest.py), started with these flags among others."""
    args = flags_server.proc.args
    assert "--enable-prompt-tokens-details" in args and args[args.index("--block-size") + 1] == str(BLOCK)
    return flags_server


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    from host.core.models.default_model import default_model_path

    return transformers.AutoTokenizer.from_pretrained(default_model_path())


@pytest.fixture(scope="module")
def reference():
    """``ids -> [log p(ids[i] | ids[:i]) for i >= 1]`` by transformers on the served weights."""
    import torch

    from host.core.models.default_model import default_model_path

    hf = hf_model(default_model_path())

    def logprobs(ids: list[int]) -> list[float]:
        with torch.inference_mode():
            logits = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        return [logits[i - 1, ids[i]].item() for i in range(1, len(ids))]

    return logprobs


def _offsets_continuous(lp) -> None:
    assert lp.text_offset[0] == 0
    for i in range(1, len(lp.tokens)):
        assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1])


def test_echo_with_logprobs_matches_transformers(client, model, tokenizer, reference):
    ids = tokenizer.encode(PROMPT)
    only = client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0, temperature=0)
    choice = only.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert only.usage.prompt_tokens == len(ids) and only.usage.completion_tokens == 0
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(reference(ids), abs=1e-3)
    assert "".join(lp.tokens) == PROMPT
    _offsets_continuous(lp)
    for tok, value, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert top[tok] == value and 1 <= len(top) <= 2  # the token itself and the top-1

    # with generation: the prompt's entries, then the completion's (as a request without echo gives them)
    plain = client.completions.create(model=model, prompt=PROMPT, logprobs=2, max_tokens=3, temperature=0).choices[0]
    both = client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=2, max_tokens=3, temperature=0).choices[0]
    assert both.text == PROMPT + plain.text
    assert both.logprobs.tokens == lp.tokens + plain.logprobs.tokens
    assert both.logprobs.token_logprobs[len(ids):] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-4)
    assert both.logprobs.token_logprobs[1:len(ids)] == pytest.approx(lp.token_logprobs[1:], abs=1e-4)
    _offsets_continuous(both.logprobs)

    # echo without logprobs, and a prompt of token ids (its text is decoded)
    bare = client.completions.create(model=model, prompt=[ids, ids[:4]], echo=True, max_tokens=2, temperature=0)
    assert bare.choices[0].text == PROMPT + plain.text[: len(bare.choices[0].text) - len(PROMPT)]
    assert bare.choices[1].text.startswith(tokenizer.decode(ids[:4])) and bare.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="max_tokens=0"):
        client.completions.create(model=model, prompt=PROMPT, max_tokens=0)


def test_streaming_echo_sends_the_prompt_first(client, model):
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0).choices[0].text
    chunks = list(client.completions.create(model=model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=4, temperature=0, stream=True))
    assert chunks[0].choices[0].text.startswith(PROMPT)
    assert "".join(c.choices[0].text for c in chunks) == PROMPT + plain
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    assert "".join(tokens) == PROMPT + plain and chunks[0].choices[0].logprobs.token_logprobs[0] is None
    only = list(client.completions.create(model=model, prompt=PROMPT, echo=True, max_tokens=0, stream=True))
    assert [c.choices[0].text for c in only] == [PROMPT] and only[0].choices[0].finish_reason == "length"


def test_return_token_ids_and_tokens_as_ids(client, model, tokenizer):
    ids = tokenizer.encode(PROMPT)
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=1,
                                  extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True})
    c = r.choices[0]
    assert c.prompt_token_ids == ids and len(c.token_ids) == r.usage.completion_tokens == 5
    assert tokenizer.decode(c.token_ids) == c.text
    assert c.logprobs.tokens == [f"token_id:{t}" for t in c.token_ids]
    assert all(f"token_id:{t}" in top for t, top in zip(c.token_ids, c.logprobs.top_logprobs))
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
                                            extra_body={"return_token_ids": True}))
    assert chunks[0].choices[0].prompt_token_ids == ids
    assert [t for ch in chunks for t in ch.choices[0].token_ids] == c.token_ids

    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
                                          logprobs=True, extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True})
    assert len(chat.prompt_token_ids) == chat.usage.prompt_tokens
    assert tokenizer.decode(chat.choices[0].token_ids) == chat.choices[0].message.content
    assert [e.token for e in chat.choices[0].logprobs.content] == [f"token_id:{t}" for t in chat.choices[0].token_ids]
    stream = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                                 temperature=0, stream=True, extra_body={"return_token_ids": True}))
    assert stream[0].prompt_token_ids == chat.prompt_token_ids
    assert [t for ch in stream for t in (ch.choices[0].token_ids or [])] == chat.choices[0].token_ids


def test_prompt_logprobs_null_unless_asked_and_on_chat(client, model, reference):
    assert client.completions.create(model=model, prompt="Hi", max_tokens=1).choices[0].prompt_logprobs is None
    messages = [{"role": "user", "content": "Name a colour."}]
    assert client.chat.completions.create(model=model, messages=messages, max_tokens=1).prompt_logprobs is None
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=1,
                                       extra_body={"prompt_logprobs": 1, "return_token_ids": True})
    ids, plp = r.prompt_token_ids, r.prompt_logprobs
    assert len(plp) == len(ids) == r.usage.prompt_tokens and plp[0] is None
    got = [plp[i][str(ids[i])]["logprob"] for i in range(1, len(ids))]
    assert got == pytest.approx(reference(ids), abs=1e-3)
    assert all(1 <= len(pos) <= 2 for pos in plp[1:])
    with pytest.raises(openai.BadRequestError, match="stream=True"):
        client.completions.create(model=model, prompt="Hi", max_tokens=1, stream=True, extra_body={"prompt_logprobs": 1})


def test_stream_options_and_cached_tokens(client, model):
    with pytest.raises(openai.BadRequestError, match="Stream options can only be defined when `stream=True`"):
        client.completions.create(model=model, prompt="Hi", max_tokens=1, stream_options={"include_usage": True})
    with pytest.raises(openai.BadRequestError, match="Stream options"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
                                       stream_options={"include_usage": True})
    opts = {"include_usage": True, "continuous_usage_stats": True}
    for chunks in (
        list(client.completions.create(model=model, prompt="Once upon a time", max_tokens=5, temperature=0,
                                       stream=True, stream_options=opts, extra_body={"ignore_eos": True})),
        list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to ten."}], max_tokens=5,
                                            temperature=0, stream=True, stream_options=opts, extra_body={"ignore_eos": True})),
    ):
        assert all(c.usage is not None for c in chunks)
        counts = [c.usage.completion_tokens for c in chunks]
        assert counts == sorted(counts) and counts[-1] == 5 and chunks[-1].choices == []
        assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)

    long_prompt = " ".join(f"word{i}" for i in range(60)) + " unique-cached-prefix-test"
    first = client.completions.create(model=model, prompt=long_prompt, max_tokens=1)
    second = client.completions.create(model=model, prompt=long_prompt, max_tokens=1)
    assert first.usage.prompt_tokens > 3 * BLOCK and first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % BLOCK == 0 and cached < second.usage.prompt_tokens


def _usage_on_the_last_chunk_only(stream):
    """vLLM's include_usage check: no usage on any choice chunk, the usage alone in the chunk after
    the finishing one (``choices == []``); returns that chunk."""
    for chunk in stream:
        assert chunk.usage is None
        if chunk.choices[0].finish_reason is not None:
            final_chunk = next(stream)
            assert final_chunk.usage is not None and final_chunk.usage.completion_tokens > 0
            assert final_chunk.choices == []
            return final_chunk
    raise AssertionError("the stream ended without a finishing chunk")


def test_vllms_stream_options_assertions_and_string_deltas(client, model):
    """vLLM's test_chat_completion_stream_options and test_completion_stream_options, as written:
    usage only on the last chunk (``choices == []``) with ``include_usage``; on every chunk with
    ``continuous_usage_stats``, the chat count rising chunk by chunk up to max_tokens; and
    ``delta.content`` of every chat chunk concatenated as a string. A long stop string makes the
    server hold text back, so steps that add no text send ``content: ""``, never null (vLLM's)."""
    chat = dict(model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
                max_completion_tokens=10, temperature=0.0, stream=True)
    for chunk in client.chat.completions.create(**chat, stream_options={"include_usage": False}):
        assert chunk.usage is None
    final_chunk = _usage_on_the_last_chunk_only(
        client.chat.completions.create(**chat, stream_options={"include_usage": True, "continuous_usage_stats": False}))
    assert final_chunk.usage.prompt_tokens > 0
    assert final_chunk.usage.total_tokens == final_chunk.usage.prompt_tokens + final_chunk.usage.completion_tokens
    last_completion_tokens = 0
    for chunk in client.chat.completions.create(**chat, extra_body={"min_tokens": 10},
                                                stream_options={"include_usage": True, "continuous_usage_stats": True}):
        assert chunk.usage.prompt_tokens >= 0
        assert (last_completion_tokens == 0 or chunk.usage.completion_tokens > last_completion_tokens
                or (not chunk.choices and chunk.usage.completion_tokens == last_completion_tokens))
        assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
        last_completion_tokens = chunk.usage.completion_tokens
    assert last_completion_tokens == 10
    for stop in (None, ["no such stop string, held back"]):
        completion, empty = "", 0
        for chunk in client.chat.completions.create(**chat, stop=stop, extra_body={"min_characters": 10},
                                                    stream_options={"include_usage": False}):
            completion += chunk.choices[0].delta.content
            empty += chunk.choices[0].delta.content == ""
        assert len(completion) >= 10
        assert empty >= (3 if stop else 1)  # the role chunk; with the stop, steps whose text is held back

    prompt = dict(model=model, prompt="What is the capital of France?", max_tokens=5, temperature=0.0, stream=True)
    for options in ({"include_usage": False, "continuous_usage_stats": False}, {"include_usage": False, "continuous_usage_stats": True}, {}):
        for chunk in client.completions.create(**prompt, stream_options=options):
            assert chunk.usage is None
    _usage_on_the_last_chunk_only(
        client.completions.create(**prompt, stream_options={"include_usage": True, "continuous_usage_stats": False}))
    stream = client.completions.create(**prompt, stream_options={"include_usage": True, "continuous_usage_stats": True})
    for chunk in stream:
        assert chunk.usage is not None and chunk.usage.prompt_tokens > 0 and chunk.usage.completion_tokens > 0
        assert chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens
        if chunk.choices[0].finish_reason is not None:
            final_chunk = next(stream)
            assert final_chunk.usage.completion_tokens > 0 and final_chunk.choices == []
    for options in ({"include_usage": None}, {"include_usage": True}, {"continuous_usage_stats": None}, {"continuous_usage_stats": True}):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(**{**prompt, "stream": False}, stream_options=options)


def test_truncate_prompt_tokens(client, model, tokenizer):
    ids = tokenizer.encode(PROMPT)
    left = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, extra_body={"truncate_prompt_tokens": 4, "return_token_ids": True})
    assert left.choices[0].prompt_token_ids == ids[-4:] and left.usage.prompt_tokens == 4
    right = client.completions.create(model=model, prompt=PROMPT, max_tokens=1,
                                      extra_body={"truncate_prompt_tokens": 4, "truncation_side": "right", "return_token_ids": True})
    assert right.choices[0].prompt_token_ids == ids[:4]
    # a prompt longer than max_model_len (1024) is served once truncated
    huge = " ".join(["word"] * 1500)
    r = client.completions.create(model=model, prompt=huge, max_tokens=1, extra_body={"truncate_prompt_tokens": 100})
    assert r.usage.prompt_tokens == 100
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=1,
                                          extra_body={"truncate_prompt_tokens": 6})
    assert chat.usage.prompt_tokens == 6
    for bad in (0, -2, 1025):
        with pytest.raises(openai.BadRequestError, match="truncate_prompt_tokens"):
            client.completions.create(model=model, prompt=PROMPT, max_tokens=1, extra_body={"truncate_prompt_tokens": bad})


def test_logprob_caps_and_errors_name_bad_values(client, model):
    with pytest.raises(openai.BadRequestError, match="--max-logprobs"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, logprobs=True, top_logprobs=-1)
    with pytest.raises(openai.BadRequestError, match="--max-logprobs"):
        client.completions.create(model=model, prompt="Hi", max_tokens=1, logprobs=-1)
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=model, prompt="Hi", max_tokens=1, logit_bias={"abc": 1, "7": 2, "x1": 3})
    assert "'abc'" in exc.value.message and "'x1'" in exc.value.message and "'7'" not in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=model, prompt="Hi", max_tokens=1, logit_bias={"999999": 1, "1000001": 1})
    assert "999999" in exc.value.message and "1000001" in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=model, prompt=[1, 2, 999999, 3, 50000000], max_tokens=1)
    assert "999999 at position 2" in exc.value.message and "50000000 at position 4" in exc.value.message


def test_chat_echo_and_beam_fields_accepted(client, model):
    messages = [{"role": "user", "content": "Say a sentence."}, {"role": "assistant", "content": "The answer is"}]
    kw = dict(model=model, messages=messages, max_tokens=3, temperature=0)
    body = {"continue_final_message": True, "add_generation_prompt": False}
    plain = client.chat.completions.create(**kw, extra_body=body).choices[0].message.content
    echoed = client.chat.completions.create(**kw, extra_body={**body, "echo": True}).choices[0].message.content
    assert echoed == "The answer is" + plain
    chunks = list(client.chat.completions.create(**kw, stream=True, extra_body={**body, "echo": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == echoed
    r = client.completions.create(model=model, prompt="Hi", max_tokens=1,
                                  extra_body={"use_beam_search": False, "length_penalty": 1.0, "early_stopping": False})
    assert r.choices[0].finish_reason == "length"


@pytest.fixture(scope="module")
def hf_default():
    from host.core.models.default_model import default_model_path

    return hf_model(default_model_path())


def test_beam_search_on_both_routes_matches_transformers(client, model, tokenizer, hf_default):
    """``use_beam_search`` with ``n`` beams: the beams transformers' ``num_beams`` finds, best
    first, on /v1/completions (streamed too) and /v1/chat/completions; sampling settings beam
    search cannot honour are a 400 naming them."""
    eos = [tokenizer.eos_token_id]
    ids = tokenizer.encode(PROMPT)
    want = hf_beams(hf_default, ids, 3, 6, eos)
    beam = {"use_beam_search": True, "length_penalty": 1.0}
    out = client.completions.create(model=model, prompt=PROMPT, n=3, max_tokens=6, extra_body={**beam, "return_token_ids": True})
    assert [c.token_ids for c in out.choices] == [tokens for tokens, _ in want]
    assert [c.text for c in out.choices] == [tokenizer.decode(t, skip_special_tokens=True) for t, _ in want]
    chunks = list(client.completions.create(model=model, prompt=PROMPT, n=3, max_tokens=6, stream=True, extra_body=beam))
    streamed = {}
    for chunk in chunks:
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[i] for i in range(3)] == [c.text for c in out.choices]

    messages = [{"role": "user", "content": "Name a colour."}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    want = hf_beams(hf_default, tokenizer.encode(text, add_special_tokens=False), 2, 5, eos)
    chat = client.chat.completions.create(model=model, messages=messages, n=2, max_tokens=5, extra_body=beam)
    assert [c.message.content for c in chat.choices] == [tokenizer.decode(t, skip_special_tokens=True) for t, _ in want]

    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt=PROMPT, n=2, max_tokens=4, top_p=0.5, extra_body=beam)
    assert "use_beam_search does not support top_p" in str(err.value)


# -- vLLM's own OpenAI-server tests (tests/entrypoints/openai/...) against host serve: logprobs ----------------------


def _reference_rows(hf, ids: list[int]):
    """transformers' log-softmax over the vocabulary after each prefix of ``ids`` (row ``i - 1``
    scores ``ids[i]``)."""
    import torch

    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def test_chat_logprobs_is_lax_as_vllm(client, model, hf_default):
    """vLLM's ``logprobs: bool | None`` is pydantic's lax bool: ``1`` (as some clients send it),
    ``"true"``, ``"yes"`` are true; ``0``, ``"off"``, ``null`` false; ``2`` or ``"maybe"`` a 400.
    The logprobs are transformers' on the same weights."""
    messages = [{"role": "user", "content": "Name a colour."}]
    kw = dict(model=model, messages=messages, max_tokens=3, temperature=0, extra_body={"return_token_ids": True, "ignore_eos": True})
    on = client.chat.completions.create(logprobs=1, **kw)
    ids, out = on.prompt_token_ids, on.choices[0].token_ids
    rows = _reference_rows(hf_default, ids + out)
    got = [e.logprob for e in on.choices[0].logprobs.content]
    assert got == pytest.approx([rows[len(ids) + i - 1, t].item() for i, t in enumerate(out)], abs=1e-3)
    for value in ("true", "yes", 1.0):
        same = client.chat.completions.create(logprobs=value, **kw).choices[0].logprobs
        assert [e.logprob for e in same.content] == pytest.approx(got, abs=1e-5)
    for value in (0, "off", None):
        assert client.chat.completions.create(logprobs=value, **kw).choices[0].logprobs is None
    for value in (2, "maybe"):
        with pytest.raises(openai.BadRequestError, match="logprobs"):
            client.chat.completions.create(logprobs=value, **kw)
    # vLLM's other logprob leniencies: top_logprobs 0 without logprobs, prompt_logprobs 0 in a stream
    assert client.chat.completions.create(top_logprobs=0, **kw).choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="top_logprobs requires logprobs"):
        client.chat.completions.create(top_logprobs=1, **kw)
    stream_kw = {**kw, "extra_body": {"prompt_logprobs": 0, "ignore_eos": True}}
    chunks = list(client.chat.completions.create(stream=True, **stream_kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == on.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="stream=True"):
        client.chat.completions.create(stream=True, **{**kw, "extra_body": {"prompt_logprobs": 1}})


def _check_widths(plp, ids: list[int], width: int, rows) -> None:
    """vLLM's prompt_logprobs: ``None`` first; then the ``width`` most likely tokens (ranks
    1..width) plus the prompt token when it is not among them, the values transformers'."""
    assert len(plp) == len(ids) and plp[0] is None
    for i in range(1, len(ids)):
        pos, tok = plp[i], str(ids[i])
        assert tok in pos and pos[tok]["logprob"] == pytest.approx(rows[i - 1, ids[i]].item(), abs=1e-3)
        top = sorted((e for t, e in pos.items() if e["rank"] <= width), key=lambda e: e["rank"])
        assert [e["rank"] for e in top] == list(range(1, width + 1))
        assert len(pos) == width + (pos[tok]["rank"] > width)
        best = rows[i - 1].topk(max(width, 1)).values.tolist()[:width]
        assert [e["logprob"] for e in top] == pytest.approx(best, abs=1e-3)


def test_prompt_logprobs_widths_as_vllm(client, model, tokenizer, hf_default):
    """``prompt_logprobs: N`` gives N entries per position, N + 1 where the prompt token is not
    among the N most likely (vLLM's rule), on chat and completions; with completions' ``echo``
    and a wider ``logprobs``, the echoed prompt gets that width and ``prompt_logprobs`` keeps N."""
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Who won the world series in 2020?"}]
    rows = None
    for width in (0, 1, 2):
        chat = client.chat.completions.create(model=model, messages=messages, max_tokens=1,
                                              extra_body={"prompt_logprobs": width, "return_token_ids": True})
        ids = chat.prompt_token_ids
        rows = _reference_rows(hf_default, ids) if rows is None else rows
        _check_widths(chat.prompt_logprobs, ids, width, rows)
    assert any(len(p) == 2 for p in chat.prompt_logprobs[1:])  # width 2 and a prompt token outside the top 2: N + 1

    ids = tokenizer.encode(PROMPT)
    rows = _reference_rows(hf_default, ids)
    for width in (1, 2):
        c = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": width}).choices[0]
        _check_widths(c.prompt_logprobs, ids, width, rows)
    echo = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, echo=True, logprobs=3,
                                     extra_body={"prompt_logprobs": 1}).choices[0]
    _check_widths(echo.prompt_logprobs, ids, 1, rows)
    assert all(len(top) in (3, 4) for top in echo.logprobs.top_logprobs[1:len(ids)])


def test_generated_logprobs_equal_the_prompt_logprobs_of_the_same_tokens(client, model, tokenizer, hf_default):
    """vLLM's test_comparison_with_prompt_logprobs_and_logprobs (tests/entrypoints/openai/basic/
    test_return_token_ids.py), its assertions as written, plus: a generated token's logprob is its
    prompt logprob once the output is sent back as a prompt (and transformers'). SmolLM2 answers
    this prompt with special tokens (``<|im_end|>``, ``<|im_start|>``), which ``token_ids`` holds
    and the text leaves out (on vLLM too): ``ignore_eos`` and ``skip_special_tokens: false`` keep
    the 20 tokens and their text whole, as vLLM's tiny random model's output is."""
    completion = client.completions.create(
        model=model, prompt="Hello, world! How are you today?", max_tokens=20, temperature=0, echo=True, logprobs=1,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True, "prompt_logprobs": 1, "ignore_eos": True,
                    "skip_special_tokens": False},
    )
    choice = completion.choices[0]
    assert choice.token_ids is not None and choice.prompt_token_ids is not None
    assert choice.prompt_logprobs is not None and choice.logprobs is not None
    logprobs_token_ids = [int(t.removeprefix("token_id:")) for t in choice.logprobs.tokens if t.startswith("token_id:")]
    assert len(choice.token_ids) < len(logprobs_token_ids)
    assert logprobs_token_ids[-len(choice.token_ids):] == choice.token_ids
    assert logprobs_token_ids == choice.prompt_token_ids + choice.token_ids
    assert "Hello, world" in tokenizer.decode(choice.prompt_token_ids)
    assert choice.text.endswith(tokenizer.decode(choice.token_ids))

    generated = choice.logprobs.token_logprobs[len(choice.prompt_token_ids):]
    ids = choice.prompt_token_ids + choice.token_ids
    again = client.completions.create(model=model, prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": 1}).choices[0]
    shared = [again.prompt_logprobs[len(choice.prompt_token_ids) + i][str(t)]["logprob"] for i, t in enumerate(choice.token_ids)]
    assert shared == pytest.approx(generated, abs=1e-4)
    rows = _reference_rows(hf_default, ids)
    assert generated == pytest.approx([rows[len(choice.prompt_token_ids) + i - 1, t].item() for i, t in enumerate(choice.token_ids)], abs=1e-3)

    streamed_prompt_token_ids, streamed_token_ids, streamed_logprob_token_ids = [], [], []
    for n, chunk in enumerate(client.completions.create(
        model=model, prompt="Tell me a short fact about Python:", max_tokens=30, temperature=0, stream=True, echo=False,
        logprobs=1, extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
    )):
        streamed_logprob_token_ids += [int(t.removeprefix("token_id:")) for t in chunk.choices[0].logprobs.tokens]
        if n == 0:
            streamed_prompt_token_ids = chunk.choices[0].prompt_token_ids
        streamed_token_ids += chunk.choices[0].token_ids
    assert streamed_prompt_token_ids == tokenizer.encode("Tell me a short fact about Python:")
    assert streamed_token_ids == streamed_logprob_token_ids and streamed_token_ids
