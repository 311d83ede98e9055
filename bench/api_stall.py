"""How long ``/health`` waits while the API process handles the largest requests it accepts.

Starts ``host serve`` (the default model, the default ``--max-request-bytes``), then sends, one
after the other, a ``/tokenize`` body and a chat message each just under the body limit, the most
``bad_words`` and the most messages a request may carry, and a completion with logprobs, while a
process polls ``/health`` every 20 ms on its own connection. Prints the worst ``/health`` latency
during each request (the target is 100 ms) and saves ``bench/results/api_stall.json``.

    python bench/api_stall.py [--max-request-bytes N]

The poller runs in its own process and the bodies are encoded before the clock starts: a poller
thread next to the sender would wait for the sender's GIL (``json.dumps`` of 8 MiB, ``json.loads``
of a 12 MB answer) and report that as server latency. ``tests/plugins/endpoints/test_no_stall.py``
runs :func:`measure` against a server it starts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

RESULTS = Path(__file__).resolve().parent / "results"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _poll(url: str) -> None:
    """``--poll URL``: until standard input closes, poll /health every 20 ms; then print the
    ``[start time, latency, ok]`` of each poll as JSON. It runs as its own process: a poller
    thread next to the sender would wait for the sender's GIL and count that as server latency."""
    samples: list[tuple[float, float, bool]] = []
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            start = time.time()
            try:
                ok = client.get("/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            samples.append((start, time.time() - start, ok))
            time.sleep(0.02)
    print(json.dumps(samples))


def _cases(model: str, limit: int) -> list[tuple[str, str, bytes]]:
    """``(name, route, body)``: the largest requests the server accepts, pre-encoded."""
    text = "hello world, this is a long prompt. " * ((limit - 4096) // 36)  # under the limit with the framing
    bodies = [
        ("tokenize, body near the limit", "/tokenize", {"prompt": text}),
        ("chat, one message near the limit", "/v1/chat/completions",
         {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}),
        ("1,000 bad_words", "/v1/completions",
         {"model": model, "prompt": "Hi", "max_tokens": 2, "bad_words": [f"word{i}" for i in range(1000)]}),
        ("tokenize 10,000 messages", "/tokenize", {"messages": [{"role": "user", "content": "hi"}] * 10_000}),
        ("completion with logprobs", "/v1/completions",
         {"model": model, "prompt": "x " * 200, "logprobs": 5, "prompt_logprobs": 5, "max_tokens": 4, "n": 2}),
    ]
    return [(name, route, json.dumps(body).encode()) for name, route, body in bodies]


def measure(url: str, limit: int) -> dict[str, Any]:
    """Send each case to the server at ``url`` while another process polls ``/health``; the
    worst poll latency during each request (and idle, before the first)."""
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    cases = _cases(model, limit)
    poller = subprocess.Popen([sys.executable, __file__, "--poll", url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(2.0)  # the poller's start-up, then idle polls
    windows, rows = [], []
    with httpx.Client(base_url=url, timeout=600) as http:
        for name, route, body in cases:
            start = time.time()
            r = http.post(route, content=body, headers={"content-type": "application/json"})
            windows.append((start, time.time()))
            rows.append({"request": name, "status": r.status_code, "bytes_sent": len(body), "bytes_received": len(r.content),
                         "seconds": round(windows[-1][1] - start, 3), "body": r.content[:300].decode(errors="replace")})
            time.sleep(0.2)
    out, _ = poller.communicate("", timeout=120)  # closing its stdin stops it
    samples = json.loads(out)
    first = windows[0][0]
    for row, (lo, hi) in zip(rows, windows):
        during = [lat for t, lat, _ in samples if lo <= t <= hi or (t < lo < t + lat)]
        row["polls"] = len(during)
        row["worst_health_ms"] = round(max(during, default=0.0) * 1000, 1)
    idle = [lat for t, lat, _ in samples if t + lat < first]
    return {"max_request_bytes": limit, "cpu_count": os.cpu_count(), "rows": rows,
            "idle_worst_health_ms": round(max(idle, default=0.0) * 1000, 1), "idle_polls": len(idle),
            "failed_polls": sum(1 for *_, ok in samples if not ok), "polls": len(samples)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-request-bytes", type=int, default=8 * 1024 * 1024)
    ap.add_argument("--poll", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.poll:
        return _poll(args.poll)
    port = _free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    host = str(Path(sys.executable).with_name("host"))
    proc = subprocess.Popen([host, "serve", "--port", str(port), "--max-request-bytes", str(args.max_request_bytes),
                             "--max-model-len", "1024"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"host serve did not start:\n{Path(log.name).read_text()}")
            time.sleep(0.5)
        result = measure(url, args.max_request_bytes)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    for row in result["rows"]:
        print(f"{row['request']:34s} HTTP {row['status']}  {row['seconds']:7.2f} s  {row['polls']:4d} polls, "
              f"worst /health {row['worst_health_ms']:6.1f} ms")
    print(f"idle: worst /health {result['idle_worst_health_ms']:.1f} ms over {result['idle_polls']} polls; "
          f"{result['failed_polls']} failed polls of {result['polls']}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "api_stall.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
