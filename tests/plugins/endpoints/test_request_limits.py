"""Values the server used to accept and choke on, refused with a 400 that names the field: through
the official ``openai`` client where it can send them, raw HTTP where it cannot (JSON's
``Infinity``, ``1e400``, a lone surrogate, wrongly typed fields, integers beyond 64 bits in lists).
One server (the session's ``flags_server``, with ``--max-sequences-per-request 16``); after
every refusal nothing runs and no KV is held."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from helpers import metric_total

LIMIT = 16


@pytest.fixture(scope="module")
def server(flags_server):
    """The session's ``flags_server`` (tests/conftest.py, shared with other modules)."""
    args = flags_server.proc.args
    assert args[args.index("--max-sequences-per-request") + 1] == str(LIMIT)
    return flags_server


def _gauge(server, suffix: str) -> float:
    return metric_total(server.url, suffix)


def _idle(server) -> None:
    assert _gauge(server, "num_requests_running") == 0
    assert _gauge(server, "num_requests_waiting") == 0
    assert _gauge(server, "kv_cache_usage_perc") == 0


def _refused(exc_info, *words: str) -> str:
    err = exc_info.value
    assert err.status_code == 400, err
    message = err.body["message"] if isinstance(err.body, dict) else str(err)
    for word in words:
        assert word in message, message
    return message


def _raw(server, path: str, body: str) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=body.encode(), headers={"content-type": "application/json"}, timeout=30)


# -- non-finite floats --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"])
def test_infinite_floats_are_refused_naming_the_field(server, model, name):
    # raw HTTP: the openai client refuses to write a non-finite float, other clients do not
    response = _raw(server, "/v1/completions", f'{{"model": "{model}", "prompt": "Hi", "max_tokens": 2, "{name}": Infinity}}')
    assert response.status_code == 400, response.text
    assert name in response.json()["error"]["message"] and "finite" in response.json()["error"]["message"]


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_json_non_finite_literals_are_refused(server, model, literal):
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hi"}}], "max_tokens": 2, "temperature": {literal}}}'
    response = _raw(server, "/v1/chat/completions", body)
    assert response.status_code == 400 and "temperature" in response.json()["error"]["message"], response.text
    body = f'{{"model": "{model}", "prompt": "Hi", "max_tokens": 2, "logit_bias": {{"5": {literal}}}}}'
    response = _raw(server, "/v1/completions", body)
    assert response.status_code == 400 and "logit_bias" in response.json()["error"]["message"], response.text


def test_allowed_token_ids_still_hold_at_extreme_finite_temperature(server, client, model):
    """The finding: with temperature=inf (or 1e300: inf in the sampler's float32) the allowed
    set was violated. Those are refused; a large temperature float32 holds is accepted and the
    constraint holds."""
    response = _raw(server, "/v1/completions", f'{{"model": "{model}", "prompt": "Hi", "temperature": 1e300}}')
    assert response.status_code == 400 and "float32" in response.json()["error"]["message"], response.text
    allowed = {httpx.post(f"{server.url}/detokenize", json={"tokens": [t]}).json()["prompt"] for t in (42, 43)}
    out = client.completions.create(model=model, prompt="Hi", max_tokens=8, temperature=1e38, logprobs=1,
                                    extra_body={"allowed_token_ids": [42, 43], "ignore_eos": True, "seed": 1})
    assert len(out.choices[0].logprobs.tokens) == 8 and set(out.choices[0].logprobs.tokens) <= allowed


# -- integers beyond 64 bits ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["seed", "top_k", "priority", "min_tokens"])
def test_integers_beyond_64_bits_are_a_400_naming_the_range(client, model, server, name):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=model, prompt="Hi", max_tokens=2, extra_body={name: 2**64})
    _refused(exc, name, "9223372036854775807")
    _idle(server)


def test_n16_with_a_huge_seed_is_a_400_and_leaves_nothing_running(client, model, server):
    """The finding: a 500 after admission, and 15 of 16 sequences kept running with no client."""
    for seed in (2**64, 2**63 - 1):  # beyond 64 bits, and in range but seed + 15 is not
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], n=16, seed=seed,
                                           max_tokens=200, extra_body={"ignore_eos": True})
        _refused(exc, "seed")
        _idle(server)
    # the largest seed that fits still works for every sample
    out = client.completions.create(model=model, prompt="Hi", n=4, seed=2**63 - 4, max_tokens=2)
    assert len(out.choices) == 4
    _idle(server)


@pytest.mark.parametrize("field_body", ['"stop_token_ids": [18446744073709551616]',
                                        '"allowed_token_ids": [18446744073709551616]',
                                        '"logit_bias": {"18446744073709551616": 1}',
                                        '"n": 18446744073709551616',
                                        '"max_tokens": 18446744073709551616',
                                        '"prompt": [1, 18446744073709551616]'])
def test_huge_token_ids_and_counts_are_a_400(server, model, field_body):
    response = _raw(server, "/v1/completions", f'{{"model": "{model}", "prompt": "Hi", {field_body}}}')
    assert response.status_code == 400, response.text
    name = field_body.split('"')[1]
    assert name in response.json()["error"]["message"] + (response.json()["error"]["param"] or "")
    response = _raw(server, "/detokenize", '{"tokens": [1, 18446744073709551616]}')
    assert response.status_code == 400 and "tokens" in response.json()["error"]["param"], response.text


# -- logprobs ------------------------------------------------------------------------------------


def test_logprobs_beyond_max_logprobs_are_refused(client, model, server):
    for extra in ({"logprobs": 21}, {"logprobs": -1}):
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(model=model, prompt="Hi", max_tokens=2, **extra)
        _refused(exc, "logprobs", "--max-logprobs")
    for asked in (21, -1):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                           logprobs=True, top_logprobs=asked)
        _refused(exc, "top_logprobs", "--max-logprobs")
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(model=model, prompt="Hi", max_tokens=2, extra_body={"prompt_logprobs": asked})
        _refused(exc, "prompt_logprobs", "--max-logprobs")
    _idle(server)
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                         logprobs=True, top_logprobs=20)
    assert all(len(t.top_logprobs) == 20 for t in out.choices[0].logprobs.content)


# -- prompts x n ---------------------------------------------------------------------------------


def test_prompts_times_n_beyond_the_limit_is_refused(client, model, server):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=model, prompt=["a", "b", "c"], n=6, max_tokens=2)
    _refused(exc, "18 sequences", "--max-sequences-per-request", str(LIMIT))
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=model, prompt=[[1, 2]] * (LIMIT + 1), max_tokens=2)
    _refused(exc, "--max-sequences-per-request")
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], n=LIMIT + 1, max_tokens=2)
    _refused(exc, "--max-sequences-per-request")
    _idle(server)
    out = client.completions.create(model=model, prompt=["a", "b"], n=LIMIT // 2, max_tokens=1)
    assert sorted(c.index for c in out.choices) == list(range(LIMIT))


# -- text and types ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, where",
    [
        ("/v1/chat/completions", '{{"model": "{m}", "messages": [{{"role": "user", "content": "a\\ud800b"}}], "max_tokens": 2}}', "messages.0.content"),
        ("/v1/completions", '{{"model": "{m}", "prompt": "\\udfff", "max_tokens": 2}}', "prompt"),
        ("/v1/completions", '{{"model": "{m}", "prompt": "Hi", "stop": ["\\ud800"], "max_tokens": 2}}', "stop.0"),
        ("/tokenize", '{{"model": "{m}", "prompt": "x\\ud83d"}}', "prompt"),
    ],
)
def test_a_lone_surrogate_is_a_400(server, model, path, body, where):
    response = _raw(server, path, body.format(m=model))
    assert response.status_code == 400, response.text
    assert where in response.json()["error"]["message"] and "surrogate" in response.json()["error"]["message"]
    # a well-formed pair (an emoji written as two escapes) is fine
    assert _raw(server, "/tokenize", json.dumps({"prompt": "\U0001f600"})).status_code == 200


@pytest.mark.parametrize(
    "field, value",
    [("max_tokens", '"10"'), ("stream", '"yes"'), ("n", '"2"'), ("n", "2.0"), ("temperature", '"0.5"'), ("seed", '"1"'),
     ("logprobs", '"2"'), ("ignore_eos", "1"), ("stop_token_ids", '["2"]'), ("stream_options", '{"include_usage": "yes"}')],
)
def test_wrongly_typed_fields_are_refused_not_coerced(server, model, field, value):
    response = _raw(server, "/v1/completions", f'{{"model": "{model}", "prompt": "Hi", "max_tokens": 2, "{field}": {value}}}'
                    if field != "max_tokens" else f'{{"model": "{model}", "prompt": "Hi", "max_tokens": {value}}}')
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith(field)


def test_what_the_official_client_sends_still_works(client, model, server):
    out = client.completions.create(model=model, prompt="Hi", max_tokens=3, temperature=0, top_p=1, seed=3,
                                    logit_bias={"42": 1}, stop=["\n\n"], presence_penalty=0, frequency_penalty=0, logprobs=2, n=2)
    assert len(out.choices) == 2
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi 😀"}], max_tokens=3,
                                                 temperature=1, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"top_k": 5, "min_p": 0.1, "priority": -(2**63)}))
    assert chunks[-1].usage is not None
    _idle(server)
