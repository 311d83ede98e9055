"""Time to first token and throughput: one ``host serve`` instance vs prefill + decode + ``host pd-proxy``.

Starts two servers of the default model on this machine, a ``p2p`` producer and a consumer, and
the proxy in front of them. "single" sends the requests straight to the consumer without
kv_transfer_params (it is then a plain instance: the same model, flags and machine); "pd" sends
them through the proxy (prefill on the producer, KV pulled over 127.0.0.1, decode on the
consumer). Each phase has its own random prompts, so no prefix-cache hit helps either. Every
request streams; TTFT is the time to the first chunk with a token. Saves
``bench/results/pd_ttft.json`` and prints the ratios.

    python bench/pd_ttft.py [--requests 16] [--concurrency 4] [--prompt-len 512] [--max-tokens 32]

All three processes share the machine's cores: on a small CPU box the numbers are not PD's
benefit on separate GPUs. PD adds a transfer and an HTTP hop, but it also runs prefill and decode
in two engine processes where "single" runs one, so on 2 cores it can come out ahead; other
load on the machine moves the numbers by tens of percent between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

RESULTS = Path(__file__).resolve().parent / "results"
HOST_BIN = str(Path(sys.executable).with_name("host"))
NOTE = ("prefill, decode, proxy and client share one machine's CPU cores; pd runs two engine processes where "
        "single runs one; other load moves the numbers between runs: not PD's benefit on separate GPUs")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not become healthy in {timeout} s")
        time.sleep(0.5)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int) -> dict[str, float]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "return_token_ids": True}
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                n = len(choice.get("token_ids") or [])
                if n and ttft is None:
                    ttft = time.perf_counter() - start
                tokens += n
    return {"ttft_s": ttft if ttft is not None else float("nan"), "e2e_s": time.perf_counter() - start, "tokens": tokens}


async def _phase(url: str, model: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:
        await _one(client, url, model, [7, 8, 9], 2)  # warm-up (connections, first step)

        async def run(p):
            async with sem:
                return await _one(client, url, model, p, max_tokens)

        start = time.perf_counter()
        rows = await asyncio.gather(*(run(p) for p in prompts))
        wall = time.perf_counter() - start
    ttfts = sorted(r["ttft_s"] for r in rows)
    return {
        "ttft_mean_s": statistics.fmean(ttfts), "ttft_p50_s": ttfts[len(ttfts) // 2], "ttft_max_s": ttfts[-1],
        "e2e_mean_s": statistics.fmean(r["e2e_s"] for r in rows), "wall_s": wall,
        "output_tok_per_s": sum(r["tokens"] for r in rows) / wall, "requests": len(rows),
    }


def _computed(url: str) -> float:
    """The server's prompt tokens neither a local nor a connector hit (``*:prompt_tokens_computed_total``)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in httpx.get(f"{url}/metrics").text.splitlines()
               if not line.startswith("#") and line.split("{", 1)[0].split(" ", 1)[0].endswith(":prompt_tokens_computed_total"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--model", default="default")
    ap.add_argument("--start-timeout", type=float, default=300)
    args = ap.parse_args()

    from host.core.models.default_model import resolve_model_path

    model = resolve_model_path(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="pd_ttft-"))
    procs: list[subprocess.Popen] = []
    urls: dict[str, str] = {}
    try:
        for role in ("kv_producer", "kv_consumer"):
            port = _free_port()
            cfg = json.dumps({"kv_connector": "p2p", "kv_role": role})
            log = open(tmp / f"{role}.log", "w")
            procs.append(subprocess.Popen([HOST_BIN, "serve", "--model", model, "--port", str(port), "--max-model-len", "2048",
                                           "--kv-transfer-config", cfg], stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            urls[role] = f"http://127.0.0.1:{port}"
        for (role, url), proc in zip(urls.items(), procs):
            _wait(url, proc, args.start_timeout)
        port = _free_port()
        procs.append(subprocess.Popen([HOST_BIN, "pd-proxy", "--prefill", urls["kv_producer"], "--decode", urls["kv_consumer"],
                                       "--port", str(port)], stdout=open(tmp / "proxy.log", "w"), stderr=subprocess.STDOUT,
                                      start_new_session=True))
        urls["proxy"] = f"http://127.0.0.1:{port}"
        _wait(urls["proxy"], procs[-1], 60)
        served = httpx.get(f"{urls['proxy']}/v1/models").json()["data"][0]["id"]
        rng = random.Random(0)

        def prompts() -> list[list[int]]:
            return [[rng.randrange(100, 40000) for _ in range(args.prompt_len)] for _ in range(args.requests)]

        single = asyncio.run(_phase(urls["kv_consumer"], served, prompts(), args.max_tokens, args.concurrency))
        before = _computed(urls["kv_consumer"])
        pd = asyncio.run(_phase(urls["proxy"], served, prompts(), args.max_tokens, args.concurrency))
        # one per request (+3 for the warm-up's) when every prompt's KV came from the producer
        pd["decode_prompt_tokens_computed"] = _computed(urls["kv_consumer"]) - before
    finally:
        _stop(procs)
    result = {
        "bench": "pd_ttft", "model": model, "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "settings": vars(args), "single": single, "pd": pd,
        "ttft_mean_ratio_pd_over_single": pd["ttft_mean_s"] / single["ttft_mean_s"],
        "throughput_ratio_pd_over_single": pd["output_tok_per_s"] / single["output_tok_per_s"],
        "note": NOTE,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pd_ttft.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"TTFT pd/single = {result['ttft_mean_ratio_pd_over_single']:.2f}; "
          f"throughput pd/single = {result['throughput_ratio_pd_over_single']:.2f}")


if __name__ == "__main__":
    main()
