"""``host bench serve``: load-test a running OpenAI-compatible server (ours or a peer's).

Sends a fixed workload — random word prompts of about ``--input-len`` tokens, or the prompts of
a file — to ``/v1/chat/completions`` or ``/v1/completions`` with streaming, at most
``--concurrency`` at once and (optionally) Poisson arrivals at ``--request-rate`` per second.
Every request is timed from send to the first streamed text (TTFT), between text chunks (ITL)
and to the end; TPOT is (end - first token) / (output tokens - 1). Output tokens come from the
server's ``usage`` when it reports one, else from the number of streamed chunks. Prints the
request throughput, output tokens/s and mean / p50 / p90 / p99 of TTFT, ITL, TPOT and
end-to-end latency, and writes them to a JSON file. The run is bounded: a fixed number of
requests, each with a timeout. A server with speculative decoding (its ``/metrics`` has the
``spec_decode_*`` counters) also gets the run's drafts, acceptance rate, mean accepted length and
accepted tokens per draft position, from the counters' change over the run.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any, Optional

import typer

bench_app = typer.Typer(help="Benchmarks.", no_args_is_help=True, rich_markup_mode=None)

_WORDS = (
    "the of and to in is was for on that with as by at from his her it an are were be this which or "
    "have had one their all but not they has been she when who will more no if out so up said what its "
    "about into than them can only other new some could time these two may then do first any my now "
    "such like our over man me even most made after also did many before must through back years where "
    "much your way well down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day same another know"
).split()


def _prompts(num: int, input_len: int, seed: int, path: str | None) -> list[str]:
    if path:
        text = Path(path).read_text(encoding="utf-8")
        items = json.loads(text) if path.endswith(".json") else [line for line in text.splitlines() if line.strip()]
        items = [p if isinstance(p, str) else p.get("prompt", "") for p in items]
        if not items:
            raise typer.BadParameter(f"{path} has no prompts", param_hint="--dataset")
        return [items[i % len(items)] for i in range(num)]
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(input_len)) for _ in range(num)]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values) if values else float("nan"),
        "p50": _pct(values, 0.5),
        "p90": _pct(values, 0.9),
        "p99": _pct(values, 0.99),
    }


async def _one(client: Any, url: str, body: dict[str, Any], chat: bool, timeout: float) -> dict[str, Any]:
    start = time.perf_counter()
    first = None
    last = None
    itls: list[float] = []
    chunks = 0
    usage_tokens = None
    text_parts: list[str] = []
    error = None
    try:
        async with client.stream("POST", url, json=body, timeout=timeout) as resp:
            if resp.status_code != 200:
                error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    payload = json.loads(data)
                    if payload.get("usage"):
                        usage_tokens = payload["usage"].get("completion_tokens")
                    if "error" in payload:
                        error = str(payload["error"])
                    for choice in payload.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                        if piece:
                            now = time.perf_counter()
                            if first is None:
                                first = now
                            else:
                                itls.append(now - last)
                            last = now
                            chunks += 1
                            text_parts.append(piece)
    except Exception as exc:  # noqa: BLE001 - a failed request is counted, not fatal
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    tokens = usage_tokens if usage_tokens is not None else chunks
    return {
        "ok": error is None and first is not None,
        "error": error,
        "ttft": None if first is None else first - start,
        "e2e": end - start,
        "itls": itls,
        "output_tokens": tokens,
        "tpot": (end - first) / (tokens - 1) if first is not None and tokens > 1 else None,
        "text": "".join(text_parts),
    }


async def _run(args: dict[str, Any], prompts: list[str]) -> tuple[list[dict[str, Any]], float]:
    import httpx
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    chat = args["endpoint"] == "chat"
    url = args["base_url"].rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    headers = {"Authorization": f"Bearer {args['api_key']}"} if args["api_key"] else {}
    rng = random.Random(args["seed"])
    sem = asyncio.Semaphore(args["concurrency"])
    results: list[dict[str, Any]] = []

    def body(prompt: str) -> dict[str, Any]:
        b: dict[str, Any] = {
            "model": args["model"], "max_tokens": args["output_len"], "temperature": args["temperature"],
            "stream": True, "stream_options": {"include_usage": True},
        }
        if chat:
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        if args["ignore_eos"]:
            b["ignore_eos"] = True
        return b

    limits = httpx.Limits(max_connections=args["concurrency"] + 4, max_keepalive_connections=args["concurrency"] + 4)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=args["timeout"]) as client:
        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
            task = progress.add_task("requests", total=len(prompts))

            async def worker(prompt: str) -> None:
                async with sem:
                    res = await _one(client, url, body(prompt), chat, args["timeout"])
                results.append(res)
                progress.advance(task)

            start = time.perf_counter()
            pending = []
            for prompt in prompts:
                pending.append(asyncio.ensure_future(worker(prompt)))
                if args["request_rate"] != float("inf"):
                    await asyncio.sleep(rng.expovariate(args["request_rate"]))
            await asyncio.gather(*pending)
            duration = time.perf_counter() - start
    return results, duration


SPEC_KEYS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def spec_decode_counters(text: str) -> dict[str, Any] | None:
    """The ``*:spec_decode_*_total`` counters of a ``/metrics`` page (any prefix; summed over
    engines), or None when the server has none."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, Any] = {key: 0.0 for key in SPEC_KEYS} | {"per_pos": {}}
    seen = False
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name.split(":", 1)[-1]
            if not name.startswith("spec_decode_") or not name.endswith("_total"):
                continue
            key = name.removeprefix("spec_decode_").removesuffix("_total")
            seen = True
            if key == "num_accepted_tokens_per_pos":
                pos = int(s.labels.get("position", 0))
                found["per_pos"][pos] = found["per_pos"].get(pos, 0.0) + s.value
            elif key in SPEC_KEYS:
                found[key] += s.value
    return found if seen else None


def spec_decode_report(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the run added to the counters: drafts, draft and accepted tokens, the acceptance
    rate (accepted / drafted), the mean accepted length (1 + accepted / drafts, vLLM's) and the
    accepted tokens per draft position; None without speculation."""
    if after is None:
        return None
    before = before or {key: 0.0 for key in SPEC_KEYS} | {"per_pos": {}}
    delta = {key: int(after[key] - before[key]) for key in SPEC_KEYS}
    positions = sorted(after["per_pos"])
    delta["accepted_per_pos"] = [int(after["per_pos"][p] - before["per_pos"].get(p, 0.0)) for p in positions]
    delta["acceptance_rate"] = delta["num_accepted_tokens"] / delta["num_draft_tokens"] if delta["num_draft_tokens"] else 0.0
    delta["mean_accepted_length"] = 1 + delta["num_accepted_tokens"] / delta["num_drafts"] if delta["num_drafts"] else 1.0
    return delta


def _scrape_spec(base_url: str, api_key: str | None) -> dict[str, Any] | None:
    import httpx

    try:
        r = httpx.get(base_url.rstrip("/") + "/metrics", headers={"Authorization": f"Bearer {api_key}"} if api_key else {}, timeout=30)
        return spec_decode_counters(r.text) if r.status_code == 200 else None
    except Exception:  # noqa: BLE001 - a peer server without /metrics: no spec report
        return None


@bench_app.command("serve")
def bench_serve(
    base_url: str = typer.Option("http://127.0.0.1:8000", "--base-url", help="Server to load."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name to send (default: the server's first /v1/models entry)."),
    endpoint: str = typer.Option("chat", "--endpoint", help="chat or completions."),
    num_prompts: int = typer.Option(64, "--num-prompts"),
    input_len: int = typer.Option(128, "--input-len", help="Words per random prompt (about that many tokens)."),
    output_len: int = typer.Option(128, "--output-len", help="max_tokens of every request."),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="Prompts file: one per line, or a JSON list."),
    concurrency: int = typer.Option(16, "--concurrency", help="Requests in flight at most."),
    request_rate: float = typer.Option(float("inf"), "--request-rate", help="Poisson arrivals per second (inf: all at once)."),
    temperature: float = typer.Option(0.0, "--temperature"),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Send ignore_eos (host / vLLM extension)."),
    seed: int = typer.Option(0, "--seed"),
    timeout: float = typer.Option(600.0, "--timeout", help="Per-request timeout, seconds."),
    api_key: Optional[str] = typer.Option(None, "--api-key"),
    label: str = typer.Option("host", "--label", help="Name of the server under test, for the results file."),
    result_file: Optional[str] = typer.Option(None, "--result-file", help="JSON output (default bench/results/serve-<label>-<date>.json)."),
) -> None:
    """Load a running server with a fixed workload and report latency and throughput."""
    import httpx

    if endpoint not in ("chat", "completions"):
        raise typer.BadParameter("use chat or completions", param_hint="--endpoint")
    if concurrency < 1 or num_prompts < 1:
        raise typer.BadParameter("--concurrency and --num-prompts must be >= 1")
    if model is None:
        try:
            r = httpx.get(base_url.rstrip("/") + "/v1/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else {}, timeout=30)
            model = r.json()["data"][0]["id"]
        except Exception as exc:  # noqa: BLE001
            typer.echo(f"error: cannot list models at {base_url}: {exc}; pass --model", err=True)
            raise typer.Exit(2)
    prompts = _prompts(num_prompts, input_len, seed, dataset)
    args = dict(
        base_url=base_url, model=model, endpoint=endpoint, output_len=output_len, concurrency=concurrency,
        request_rate=request_rate, temperature=temperature, ignore_eos=ignore_eos, seed=seed, timeout=timeout, api_key=api_key,
    )
    spec_before = _scrape_spec(base_url, api_key)
    results, duration = asyncio.run(_run(args, prompts))
    spec = spec_decode_report(spec_before, _scrape_spec(base_url, api_key))
    ok = [r for r in results if r["ok"]]
    failed = [r for r in results if not r["ok"]]
    out_tokens = sum(r["output_tokens"] for r in ok)
    metrics = {
        "ttft_s": _summary([r["ttft"] for r in ok]),
        "itl_s": _summary([x for r in ok for x in r["itls"]]),
        "tpot_s": _summary([r["tpot"] for r in ok if r["tpot"] is not None]),
        "e2e_s": _summary([r["e2e"] for r in ok]),
    }
    report = {
        "benchmark": "serve",
        "label": label,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "server": base_url,
        "model": model,
        "workload": {k: v for k, v in args.items() if k not in ("api_key",)} | {
            "num_prompts": num_prompts, "input_len": input_len, "dataset": dataset,
            "request_rate": "inf" if request_rate == float("inf") else request_rate,
        },
        "duration_s": duration,
        "completed": len(ok),
        "failed": len(failed),
        "errors": sorted({r["error"] for r in failed if r["error"]})[:5],
        "request_throughput": len(ok) / duration,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / duration,
        **metrics,
    }
    if spec is not None:
        report["spec_decode"] = spec
    typer.echo(f"\n{label} at {base_url} ({model}): {len(ok)}/{len(results)} requests in {duration:.1f} s")
    typer.echo(f"  request throughput {report['request_throughput']:.2f} req/s, output {report['output_tokens_per_s']:.1f} tok/s ({out_tokens} tokens)")
    for name, key in (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s")):
        s = metrics[key]
        typer.echo(f"  {name:5s} ms: mean {1000 * s['mean']:.1f}  p50 {1000 * s['p50']:.1f}  p90 {1000 * s['p90']:.1f}  p99 {1000 * s['p99']:.1f}")
    if spec is not None:
        typer.echo(f"  spec decode: {spec['num_drafts']} drafts, {spec['num_accepted_tokens']}/{spec['num_draft_tokens']} draft tokens "
                   f"accepted ({100 * spec['acceptance_rate']:.1f}%), mean accepted length {spec['mean_accepted_length']:.2f}, "
                   f"accepted per position {spec['accepted_per_pos']}")
    if failed:
        typer.echo(f"  {len(failed)} failed, e.g. {report['errors'][:2]}", err=True)
    path = Path(result_file or Path("bench") / "results" / f"serve-{label}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=float))
    typer.echo(f"  saved {path}")
