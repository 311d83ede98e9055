"""``host pd-proxy`` in front of two real ``host serve`` instances of a tiny model, a ``p2p``
producer (prefill) and a consumer (decode), driven with the official openai client.

Outputs are checked against transformers on the same weights (completions) or against the
decode server asked directly, without a connector's params (chat); the decode server's
``prompt_tokens_computed`` shows it computed one prompt token per request (the rest came from
the producer); both KV caches are empty afterwards. A second proxy whose "prefill" instance is
the consumer (which hands nothing off: its kv_transfer_params are null) shows the no-connector
path: the decode side recomputes the prompt with the same output."""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from helpers import HOST_BIN, free_port, hf_greedy, hf_model, metric_total, run_server, subprocess_env

BLOCK = 16
N_NEW = 6


def _wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        assert time.monotonic() < deadline, f"{url} did not become healthy in {timeout} s"
        time.sleep(0.2)


@contextlib.contextmanager
def proxy_process(tmp_path, prefill: str, decode: str):
    """``host pd-proxy`` as a subprocess, stopped afterwards."""
    port = free_port()
    log = open(tmp_path / f"proxy-{port}.log", "w")
    proc = subprocess.Popen([HOST_BIN, "pd-proxy", "--prefill", prefill, "--decode", decode, "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=subprocess_env([]))
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@contextlib.contextmanager
def proxy_thread(prefill: list[str], decode: list[str]):
    """The proxy app on a real socket, served by uvicorn in a thread of this process."""
    import uvicorn

    from host.core.entrypoints.pd_proxy import build_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(prefill, decode, timeout_s=30), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the in-process proxy did not start"
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture(scope="module")
def pd(tmp_path_factory, tiny_checkpoint):
    from host.core.models.default_model import resolve_model_path

    model = tiny_checkpoint("llama", vocab_size=49152, max_position_embeddings=2048, initializer_range=0.1,
                            tie_word_embeddings=True)
    common = ["--model", str(model), "--tokenizer", resolve_model_path("default"), "--max-model-len", "512",
              "--block-size", str(BLOCK), "--kv-cache-memory", "64MiB", "--max-num-seqs", "16", "-O0",
              "--attention-backend", "torch_paged"]
    tmp = tmp_path_factory.mktemp("pd")
    cfg = {"kv_connector": "p2p", "kv_role": "kv_producer"}
    servers = [run_server(tmp, [*common, "--kv-transfer-config", json.dumps(cfg)]),
               run_server(tmp, [*common, "--kv-transfer-config", json.dumps(
                   {**cfg, "kv_role": "kv_consumer", "kv_connector_extra_config": {"handshake_timeout_s": 1.0, "read_timeout_s": 3.0}})])]
    with contextlib.ExitStack() as stack:
        with ThreadPoolExecutor(2) as pool:  # both start at once (~15 s each)
            started = [pool.submit(s.__enter__) for s in servers]
        for s, f in zip(servers, started):
            if f.exception() is None:
                stack.push(s.__exit__)
        producer, consumer = (f.result() for f in started)
        proxy = stack.enter_context(proxy_process(tmp, producer.url, consumer.url))
        yield {"model": str(model), "hf": hf_model(str(model)), "producer": producer, "consumer": consumer, "proxy": proxy}


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)


def _complete(url: str, model: str, prompt: list[int], stream: bool = False) -> list[int]:
    kw = dict(model=model, prompt=prompt, max_tokens=N_NEW, temperature=0,
              extra_body={"return_token_ids": True, "ignore_eos": True})
    client = _client(url)
    if not stream:
        out = client.completions.create(**kw)
        return list(out.choices[0].token_ids)
    ids: list[int] = []
    for chunk in client.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            ids += list(getattr(choice, "token_ids", None) or [])
    return ids


def _settled(*servers, timeout: float = 20.0) -> None:
    """Every server's KV cache usage back to 0 (the producer frees its blocks on the consumer's DONE)."""
    deadline = time.monotonic() + timeout
    for s in servers:
        while metric_total(s.url, "kv_cache_usage_perc") != 0.0:
            assert time.monotonic() < deadline, f"{s.url} still holds KV blocks"
            time.sleep(0.2)


def test_pd_through_the_proxy_equals_transformers_and_decode_computes_one_token_each(pd):
    rng = random.Random(3)
    lengths = [5, 16, 17, 23, 31, 40, 47, 64, 70, 81, 96, 110, 128, 150]  # one shorter than a block
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in lengths]
    full_hit = prompts[7]  # the decode side has all of it after the first wave
    partial = prompts[10][:48] + [rng.randrange(100, 40000) for _ in range(21)]  # a 3-block prefix hit
    consumer, proxy, model = pd["consumer"], pd["proxy"], pd["model"]
    before = metric_total(consumer.url, "prompt_tokens_computed_total")
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda p: _complete(proxy, model, p), prompts))
    got += [_complete(proxy, model, full_hit), _complete(proxy, model, partial, stream=True)]
    computed = metric_total(consumer.url, "prompt_tokens_computed_total") - before
    want = [hf_greedy(pd["hf"], p, N_NEW) for p in [*prompts, full_hit, partial]]
    assert got == want
    assert computed == len(want)  # only each prompt's last token: the rest was pulled or a local hit
    _settled(pd["producer"], consumer)


def test_streaming_and_chat_through_the_proxy_equal_the_decode_server_alone(pd):
    proxy, consumer, model = pd["proxy"], pd["consumer"], pd["model"]
    rng = random.Random(11)
    prompt = [rng.randrange(100, 40000) for _ in range(37)]
    assert _complete(proxy, model, prompt, stream=True) == hf_greedy(pd["hf"], prompt, N_NEW)
    messages = [{"role": "user", "content": "Name three colours of the rainbow, please."}]
    kw = dict(model=model, messages=messages, max_tokens=N_NEW, temperature=0, extra_body={"ignore_eos": True})
    direct = _client(consumer.url).chat.completions.create(**kw).choices[0].message.content
    via = _client(proxy).chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in _client(proxy).chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert via == direct == streamed and direct
    assert _client(proxy).models.list().data[0].id == model
    _settled(pd["producer"], consumer)


def test_without_a_producer_the_decode_side_recomputes_with_the_same_output(pd):
    consumer, model = pd["consumer"], pd["model"]
    rng = random.Random(17)
    prompt = [rng.randrange(100, 40000) for _ in range(53)]  # 3 full blocks and 5 tokens
    with proxy_thread([consumer.url], [consumer.url]) as url:  # a consumer hands nothing off: null params
        before = metric_total(consumer.url, "prompt_tokens_computed_total")
        assert _complete(url, model, prompt) == hf_greedy(pd["hf"], prompt, N_NEW)
        # the "prefill" computed it all; the decode request found its full blocks in the local prefix cache
        assert metric_total(consumer.url, "prompt_tokens_computed_total") - before == len(prompt) + len(prompt) % BLOCK
    _settled(consumer)


def test_errors_are_openai_bodies_with_the_upstream_status(pd):
    proxy, model = pd["proxy"], pd["model"]
    with pytest.raises(openai.NotFoundError) as err:
        _client(proxy).completions.create(model="no-such-model", prompt=[1, 2, 3], max_tokens=2)
    assert "no-such-model" in str(err.value)
    with pytest.raises(openai.BadRequestError):
        _client(proxy).completions.create(model=model, prompt=[1, 2, 3], max_tokens=2, temperature=-1)
    dead = f"http://127.0.0.1:{free_port()}"
    with proxy_thread([dead], [pd["consumer"].url]) as url:
        with pytest.raises(openai.APIStatusError) as err:
            _client(url).completions.create(model=model, prompt=[1, 2, 3], max_tokens=2)
        assert err.value.status_code == 502 and dead in err.value.message
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503 and dead in health.json()["error"]["message"]
    assert httpx.get(f"{proxy}/health").status_code == 200


def test_a_client_disconnect_aborts_the_decode_request(pd):
    proxy, consumer, model = pd["proxy"], pd["consumer"], pd["model"]
    before = metric_total(consumer.url, "generation_tokens_total")
    stream = _client(proxy).completions.create(model=model, prompt=[5, 6, 7, 8], max_tokens=400, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 15
    while metric_total(consumer.url, "num_requests_running") != 0:
        assert time.monotonic() < deadline, "the decode server kept generating for a gone client"
        time.sleep(0.2)
    assert metric_total(consumer.url, "generation_tokens_total") - before < 300  # stopped well short of 400
    _settled(pd["producer"], consumer)


def test_a_killed_prefill_server_leaves_the_decode_side_recomputing_and_the_proxy_answering_502(pd):
    """Runs last: it kills the module's producer. Its params are taken, then it dies before the
    consumer pulls; the decode request recomputes (kv_load_failure_policy recompute) in bounded time."""
    producer, consumer, proxy, model = pd["producer"], pd["consumer"], pd["proxy"], pd["model"]
    rng = random.Random(23)
    prompt = [rng.randrange(100, 40000) for _ in range(45)]
    first = httpx.post(f"{producer.url}/v1/completions", timeout=30, json={
        "model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "kv_transfer_params": {"do_remote_decode": True}})
    params = first.json()["kv_transfer_params"]
    assert params["do_remote_prefill"] and params["remote_block_ids"]
    producer.proc.kill()
    producer.proc.wait(10)
    before = metric_total(consumer.url, "prompt_tokens_computed_total")
    start = time.monotonic()
    out = _client(consumer.url).completions.create(model=model, prompt=prompt, max_tokens=N_NEW, temperature=0,
                                                   extra_body={"return_token_ids": True, "ignore_eos": True,
                                                               "kv_transfer_params": params})
    assert list(out.choices[0].token_ids) == hf_greedy(pd["hf"], prompt, N_NEW)
    assert time.monotonic() - start < 20
    assert metric_total(consumer.url, "prompt_tokens_computed_total") - before == len(prompt)  # recomputed in full
    with pytest.raises(openai.APIStatusError) as err:
        _client(proxy).completions.create(model=model, prompt=prompt, max_tokens=2)
    assert err.value.status_code == 502 and producer.url in err.value.message
    health = httpx.get(f"{proxy}/health")
    assert health.status_code == 503 and producer.url in health.json()["error"]["message"]
    _settled(consumer)
