"""``host serve -dp 2 -tp 2``: two engine-core processes behind one API server, each with its own two
tensor-parallel worker processes (mp executor), through the official openai client. One server (a
tiny random Llama with the default model's tokenizer) serves 32
concurrent streams, each checked against transformers' greedy tokens for its prompt alone; both
engines take a share (the ``engine`` label of ``/metrics``); aborts reach the engine that runs
the request; killing one engine turns ``/health`` to 503 and fails the requests in flight. The
tests run in file order: the last one kills an engine."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import hf_greedy, hf_model, run_server

N_STREAMS, N_TOKENS = 32, 12
LONG = 7000  # tokens a stream would run for if nothing stopped it (seconds of decoding)
PROMPTS = [f"Story {i}: the {'quick ' * (i % 5)}fox number {i * 7} jumped over" for i in range(N_STREAMS)]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_checkpoint):
    from host.core.models.default_model import resolve_model_path

    model = tiny_checkpoint("llama", vocab_size=49152, max_position_embeddings=8192)  # SmolLM2's vocabulary
    tokenizer = resolve_model_path("default")
    # -O0 and torch_paged: no C++ kernel build; what is tested is the two engines behind one server
    args = ["--model", str(model), "--tokenizer", tokenizer, "-dp", "2", "-tp", "2", "--max-model-len", "8192", "--kv-cache-memory", "64MiB",
            "-O0", "--attention-backend", "torch_paged", "--no-exit-on-engine-death"]
    with run_server(tmp_path_factory.mktemp("dp"), args) as server:
        pids = re.search(r"data parallel: 2 engines up, pids \[(\d+), (\d+)\]", server.log())
        assert pids, server.log()
        server.engine_pids = [int(pids[1]), int(pids[2])]
        server.model = str(model)
        server.tokenizer = tokenizer
        yield server


def _samples(server, name: str) -> dict[tuple, float]:
    """``{(engine, finished_reason or None): value}`` of one ``vllm:`` family in /metrics."""
    out = {}
    for fam in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text):
        for s in fam.samples:
            if s.name == f"vllm:{name}":
                out[(s.labels["engine"], s.labels.get("finished_reason"))] = s.value
    return out


def _client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


async def _stream(client, model: str, prompt: str, max_tokens: int):
    return await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )


def test_two_engine_processes_labelled_in_the_log(served):
    server_proc = psutil.Process(served.proc.pid)
    children = {p.pid for p in server_proc.children(recursive=True)}
    assert len(set(served.engine_pids)) == 2 and set(served.engine_pids) <= children
    log = served.log()
    for i, pid in enumerate(served.engine_pids):
        assert f"(engine {i}): data-parallel engine {i} of 2: pid {pid}" in log
    # a deployment-wide utility call (the plugin listing) is answered by engine 0
    processes = httpx.get(f"{served.url}/v1/plugins").json()["processes"]
    engine = processes["engine"]
    assert engine["pid"] == served.engine_pids[0] and {r["process_pid"] for r in engine["plugins"]} == {served.engine_pids[0]}
    # -tp 2: each engine drives two worker processes of its own
    for i, pid in enumerate(served.engine_pids):
        assert len(psutil.Process(pid).children()) >= 2, f"engine {i} has no tensor-parallel workers"
    workers = {processes[f"worker {r}"]["pid"] for r in (0, 1)}
    assert workers <= {p.pid for p in psutil.Process(served.engine_pids[0]).children()}


def test_32_concurrent_streams_match_greedy_alone_on_both_engines(served):
    import transformers

    async def one(client, prompt):
        text, ids, prompt_ids = "", [], None
        async for chunk in await _stream(client, served.model, prompt, N_TOKENS):
            choice = chunk.choices[0]
            text += choice.text
            ids += choice.model_extra.get("token_ids") or []
            prompt_ids = choice.model_extra.get("prompt_token_ids") or prompt_ids
        return text, ids, prompt_ids

    async def run_all():
        client = _client(served)
        try:
            return await asyncio.gather(*(one(client, p) for p in PROMPTS))
        finally:
            await client.close()

    results = asyncio.run(run_all())
    tok = transformers.AutoTokenizer.from_pretrained(served.tokenizer)
    model = hf_model(served.model)
    for prompt, (text, ids, prompt_ids) in zip(PROMPTS, results):
        assert prompt_ids == tok(prompt).input_ids
        expected = hf_greedy(model, prompt_ids, N_TOKENS)
        assert ids == expected, prompt
        assert text == tok.decode(expected), prompt
    done = _samples(served, "request_success_total")
    per_engine = [done[(e, "length")] for e in ("0", "1")]
    assert sum(per_engine) == N_STREAMS and min(per_engine) >= N_STREAMS // 4, per_engine  # balanced by load
    tokens = _samples(served, "generation_tokens_total")
    assert tokens[("0", None)] > 0 and tokens[("1", None)] > 0


def _running(server) -> list[float]:
    running = _samples(server, "num_requests_running")
    return [running[("0", None)], running[("1", None)]]


def test_each_abort_reaches_the_engine_running_the_request(served):
    async def run():
        client = _client(served)
        streams = [await _stream(client, served.model, p, LONG) for p in PROMPTS[:2]]
        for s in streams:  # both are generating
            for _ in range(3):
                await s.__anext__()
        deadline = time.monotonic() + 10
        while _running(served) != [1, 1]:  # one on each engine (least loaded first)
            assert time.monotonic() < deadline, _running(served)
            await asyncio.sleep(0.05)
        for s in streams:  # the client goes away: the server aborts
            await s.close()
        await client.close()
        aborted = time.monotonic()
        while _running(served) != [0, 0]:
            # a lost abort would run on for LONG tokens (many seconds)
            assert time.monotonic() - aborted < 5, _running(served)
            await asyncio.sleep(0.05)

    asyncio.run(run())
    assert httpx.get(f"{served.url}/health").status_code == 200


def test_killing_one_engine_fails_requests_and_health_turns_503(served):
    tree = psutil.Process(served.proc.pid).children(recursive=True)  # engines, their workers

    async def run():
        client = _client(served)
        streams = [await _stream(client, served.model, p, LONG) for p in PROMPTS[:2]]
        for s in streams:
            await s.__anext__()
        os.kill(served.engine_pids[1], signal.SIGKILL)
        killed = time.monotonic()
        for s in streams:  # both the dead engine's request and the other one's end with an error
            with pytest.raises(openai.APIError):
                async for _ in s:
                    pass
        assert time.monotonic() - killed < 5
        await client.close()

    asyncio.run(run())
    health = httpx.get(f"{served.url}/health")
    assert health.status_code == 503 and "data-parallel engine 1 of 2" in health.text
    r = httpx.post(f"{served.url}/v1/completions", json={"model": served.model, "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 503
    survivor = psutil.Process(served.engine_pids[0])
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(30) is not None
    survivor.wait(10)  # the other engine is stopped with the server, not left behind
    gone, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, [p.pid for p in alive]  # nor any engine's worker
