"""``host serve [MODEL]``: the OpenAI-compatible HTTP server.

The API server runs in this process; the engine core in a child process it starts and stops.
It takes every engine flag but ``--model`` (the model is the argument) and the plugin flags,
which become the ``HOST_*`` environment so the engine process sees the same settings.
Start-up prints the platform, the attention backend, the plugins each process loaded and the
address. SIGINT / SIGTERM (or ``POST /drain``) drain the server: new requests get 503, those in
flight get ``--shutdown-timeout`` seconds, the rest are aborted, then the server and its engine
stop; a second signal stops at once. With ``--exit-on-engine-death`` (the default) the server
exits with code 1 once its engine process died. Connections whose request headers are not in
after ``--header-read-timeout`` seconds are closed; idle keep-alive ones after
``--timeout-keep-alive``; ``--limit-concurrency`` caps open connections (503 beyond).

The model is served under the name typed (``host.core.models.default_model.served_name``; the
default model as ``HuggingFaceTB/SmolLM2-135M-Instruct``) unless ``--served-model-name`` names it.
A vLLM launch script's flags are accepted: those host implements are options here or engine
flags, the rest come from :mod:`.vllm_flags` (one log line each, or a refusal with the reason).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Optional

import typer

from host.core.entrypoints.cli.engine_flags import with_engine_flags
from host.core.entrypoints.cli.plugin_flags import with_plugin_flags
from host.core.entrypoints.cli.vllm_flags import log_vllm_flags, with_vllm_flags

API_SWITCH_INTERVAL_S = 0.0005
"""The API process's GIL switch interval (Python's default is 5 ms)."""


@with_vllm_flags
@with_plugin_flags
@with_engine_flags(exclude=("model",))
def serve_cmd(
    model: Optional[str] = typer.Argument(
        None, help="HF model directory or .gguf file, served under the name typed here (default: HuggingFaceTB/SmolLM2-135M-Instruct)."
    ),
    model_option: Optional[str] = typer.Option(
        None, "--model", help="The model as a flag, as vLLM scripts pass it (the same as the MODEL argument)."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="HOST_API_KEY", help="Require 'Authorization: Bearer KEY' on every route but /health, /version, /metrics and the API docs."),
    served_model_name: Optional[list[str]] = typer.Option(
        None, "--served-model-name",
        help="Name(s) clients use for the model: the first is listed, the others are aliases (default: MODEL as typed).",
    ),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn / host log level."),
    max_request_bytes: int = typer.Option(
        8 * 1024 * 1024, "--max-request-bytes", min=1, help="Largest request body in bytes; a larger one is refused with 413."
    ),
    trust_request_chat_template: bool = typer.Option(
        False, "--trust-request-chat-template/--no-trust-request-chat-template",
        help="Let requests bring their own Jinja chat template (chat_template_kwargs.chat_template); rendered sandboxed and time-bounded.",
    ),
    max_sequences_per_request: int = typer.Option(
        256, "--max-sequences-per-request", min=1, help="Most sequences (prompts x n) one request may ask for; 400 beyond."
    ),
    max_queued_requests: Optional[int] = typer.Option(
        None, "--max-queued-requests", min=1,
        help="Most requests waiting for their first token; more get 429 with Retry-After (default: no limit).",
    ),
    shutdown_timeout: float = typer.Option(
        30.0, "--shutdown-timeout", min=0, help="On SIGTERM or POST /drain: seconds in-flight requests get to finish before they are aborted."
    ),
    exit_on_engine_death: bool = typer.Option(
        True, "--exit-on-engine-death/--no-exit-on-engine-death", help="Exit (code 1) when the engine process dies, so a supervisor restarts the server."
    ),
    engine_heartbeat_timeout: float = typer.Option(
        30.0, "--engine-heartbeat-timeout", min=0.1, help="/health answers 503 when the engine process sent nothing for this many seconds."
    ),
    header_read_timeout: float = typer.Option(
        10.0, "--header-read-timeout", min=0.1, help="Close a connection whose request headers have not all arrived within this many seconds."
    ),
    timeout_keep_alive: float = typer.Option(5.0, "--timeout-keep-alive", min=0.1, help="Close an idle keep-alive connection after this many seconds."),
    limit_concurrency: Optional[int] = typer.Option(
        None, "--limit-concurrency", min=1, help="Most open connections (and tasks) before new requests get 503 (default: no limit)."
    ),
    stat_loggers: Optional[list[str]] = typer.Option(
        None, "--stat-loggers", help="Extra stat loggers, NAME[:ARG] (repeat or comma-separate), e.g. jsonl:/var/log/host-stats.jsonl."
    ),
    metrics_prefix: str = typer.Option("host", "--metrics-prefix", help="Prefix of the /metrics names: 'host' (host:...) or 'vllm' (vllm:..., for vLLM dashboards)."),
    log_stats_interval: float = typer.Option(10.0, "--log-stats-interval", min=0.01, help="Seconds between the stats log lines (and the stat loggers' log() calls)."),
    disable_log_stats: bool = typer.Option(False, "--disable-log-stats", help="Turn off the periodic stats log line."),
    enable_auto_tool_choice: bool = typer.Option(
        False, "--enable-auto-tool-choice", help='Let tool_choice "auto" return tool calls (needs --tool-call-parser).'
    ),
    tool_call_parser: Optional[str] = typer.Option(None, "--tool-call-parser", help="Tool-call parser (host.tool_parsers) for the model's output format, e.g. hermes."),
    reasoning_parser: Optional[str] = typer.Option(None, "--reasoning-parser", help="Reasoning parser (host.reasoning_parsers), e.g. deepseek_r1: fills reasoning_content."),
    enable_prompt_tokens_details: bool = typer.Option(
        False, "--enable-prompt-tokens-details", help="Report usage.prompt_tokens_details (cached_tokens from the prefix cache)."
    ),
    chat_template: Optional[str] = typer.Option(
        None, "--chat-template", help="A Jinja chat template (a file, or the template text) used instead of the tokenizer's."
    ),
    enable_tokenizer_info_endpoint: bool = typer.Option(
        False, "--enable-tokenizer-info-endpoint", help="Serve GET /tokenizer_info (the tokenizer's class, limits, special tokens and chat template)."
    ),
    enable_server_load_tracking: bool = typer.Option(
        False, "--enable-server-load-tracking", help="Serve GET /load: the number of requests in flight."
    ),
    disable_fastapi_docs: bool = typer.Option(False, "--disable-fastapi-docs", help="Serve no /docs, /redoc or /openapi.json."),
    lora_modules: Optional[list[str]] = typer.Option(
        None, "--lora-modules",
        help='A LoRA adapter served as model NAME (with --enable-lora): NAME=PATH or \'{"name": ..., "path": ..., "base_model_name": ...}\'; repeat for more.',
    ),
    enable_lora_runtime_updates: bool = typer.Option(
        False, "--enable-lora-runtime-updates", envvar="HOST_ALLOW_RUNTIME_LORA_UPDATING",
        help="Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (else 404).",
    ),
    io_processor: Optional[str] = typer.Option(
        None, "--io-processor", "--io-processor-plugin", help="The IO processor (host.io_processors) POST /pooling runs a request's data through "
        "when it names none, e.g. text_chunks (default: the model's config.json io_processor_plugin, else none).",
    ),
    uvicorn_log_level: Optional[str] = typer.Option(None, "--uvicorn-log-level", help="uvicorn's log level (default: --log-level)."),
    disable_uvicorn_access_log: bool = typer.Option(False, "--disable-uvicorn-access-log", help="No access-log line per request."),
    root_path: Optional[str] = typer.Option(None, "--root-path", help="The path prefix a proxy serves this server under (ASGI root_path)."),
    ssl_keyfile: Optional[str] = typer.Option(None, "--ssl-keyfile", help="Serve HTTPS with this private key file (with --ssl-certfile)."),
    ssl_certfile: Optional[str] = typer.Option(None, "--ssl-certfile", help="Serve HTTPS with this certificate file."),
    ssl_ca_certs: Optional[str] = typer.Option(None, "--ssl-ca-certs", help="CA certificates file for client certificates."),
    allowed_origins: Optional[str] = typer.Option(
        None, "--allowed-origins", help='CORS: origins browsers may call from, a JSON list or comma-separated (e.g. \'["*"]\'); none given: no CORS headers.'
    ),
    allowed_methods: Optional[str] = typer.Option(None, "--allowed-methods", help="CORS: allowed methods (default with CORS on: all)."),
    allowed_headers: Optional[str] = typer.Option(None, "--allowed-headers", help="CORS: allowed request headers (default with CORS on: all)."),
    allow_credentials: bool = typer.Option(False, "--allow-credentials", help="CORS: allow credentials (cookies, Authorization)."),
    *,
    engine_kwargs: dict[str, Any],
    plugin_flags: dict[str, Any],
    vllm_flags: dict[str, Any],
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API."""
    from host.core.logging_config import configure_logging
    from host.core.plugins.manager import plugin_host_for

    configure_logging(log_level.upper())
    log_vllm_flags(vllm_flags)
    if model is not None and model_option is not None and model != model_option:
        typer.echo(f"error: the model is given twice ({model!r} and --model {model_option!r}); pass it once", err=True)
        raise typer.Exit(code=2)
    model = model if model is not None else model_option
    try:
        os.environ.update(plugin_host_for(**plugin_flags).settings.to_env())  # the engine process inherits them
        if isinstance(engine_kwargs.get("kv_transfer_config"), dict):
            # a connector may derive its side-channel ports from the server's
            engine_kwargs["kv_transfer_config"] = {"http_port": port, **engine_kwargs["kv_transfer_config"]}
        run_server(
            model,
            host=host,
            port=port,
            api_key=api_key,
            served_model_names=list(served_model_name or []),
            log_level=log_level,
            engine_kwargs=engine_kwargs,
            max_request_bytes=max_request_bytes,
            trust_request_chat_template=trust_request_chat_template,
            max_sequences_per_request=max_sequences_per_request,
            max_queued_requests=max_queued_requests,
            shutdown_timeout=shutdown_timeout,
            exit_on_engine_death=exit_on_engine_death,
            engine_heartbeat_timeout=engine_heartbeat_timeout,
            http_limits={"header_read_timeout": header_read_timeout, "timeout_keep_alive": timeout_keep_alive,
                         "limit_concurrency": limit_concurrency},
            uvicorn_options=uvicorn_options(
                log_level=uvicorn_log_level, access_log=False if disable_uvicorn_access_log else None, root_path=root_path,
                ssl_keyfile=ssl_keyfile, ssl_certfile=ssl_certfile, ssl_ca_certs=ssl_ca_certs,
            ),
            stat_settings={"stat_loggers": list(stat_loggers or []), "metrics_prefix": metrics_prefix,
                           "log_stats_interval": log_stats_interval, "disable_log_stats": disable_log_stats},
            api_settings={"enable_auto_tool_choice": enable_auto_tool_choice, "tool_call_parser": tool_call_parser,
                          "reasoning_parser": reasoning_parser, "enable_prompt_tokens_details": enable_prompt_tokens_details,
                          "chat_template": read_chat_template(chat_template),
                          "enable_tokenizer_info_endpoint": enable_tokenizer_info_endpoint,
                          "enable_server_load_tracking": enable_server_load_tracking,
                          "disable_fastapi_docs": disable_fastapi_docs,
                          "lora_modules": list(lora_modules or []), "enable_lora_runtime_updates": enable_lora_runtime_updates,
                          "io_processor": io_processor,
                          "cors": cors_settings(allowed_origins, allowed_methods, allowed_headers, allow_credentials)},
        )
    except (ValueError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)


def _name_list(flag: str, value: str) -> list[str]:
    """A JSON list (vLLM's form, ``'["*"]'``) or comma-separated names."""
    import json

    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            items = None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"{flag} {value!r} is not a JSON list of strings; use e.g. '[\"*\"]' or a,b")
        return items
    return [part.strip() for part in text.split(",") if part.strip()]


def cors_settings(origins: str | None, methods: str | None, headers: str | None, credentials: bool) -> dict[str, Any] | None:
    """starlette ``CORSMiddleware`` keywords from the CORS flags; ``None`` (no CORS headers) when
    none of them is given. A given flag's list replaces its default, ``*`` (all)."""
    if origins is None and methods is None and headers is None and not credentials:
        return None
    return {
        "allow_origins": _name_list("--allowed-origins", origins) if origins is not None else ["*"],
        "allow_methods": _name_list("--allowed-methods", methods) if methods is not None else ["*"],
        "allow_headers": _name_list("--allowed-headers", headers) if headers is not None else ["*"],
        "allow_credentials": credentials,
    }


def uvicorn_options(**options: Any) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords given (``None`` left out); ``--ssl-keyfile`` and
    ``--ssl-certfile`` come together (a ValueError names the missing one)."""
    given = {k: v for k, v in options.items() if v is not None}
    if given.get("log_level") is not None:
        given["log_level"] = str(given["log_level"]).lower()
    if ("ssl_keyfile" in given) != ("ssl_certfile" in given):
        missing = "--ssl-certfile" if "ssl_keyfile" in given else "--ssl-keyfile"
        raise ValueError(f"HTTPS needs both --ssl-keyfile and --ssl-certfile; add {missing}")
    return given


def read_chat_template(value: str | None) -> str | None:
    """The template text of ``--chat-template``: the file's content when ``value`` names a file,
    else ``value`` itself when it reads as a template (it holds ``{`` or a line break), as vLLM
    decides; a ValueError names a path that does not exist."""
    if value is None:
        return None
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    if any(c in value for c in "{}\n"):
        return value
    raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template; pass the template file's path or its text")


def _describe_plugins(records: list[dict[str, Any]]) -> str:
    loaded = sorted({f"{r['name']}" for r in records if r.get("status") == "loaded"})
    failed = sorted({f"{r['name']}" for r in records if r.get("status") == "failed"})
    text = ", ".join(loaded) or "none"
    return text + (f" (failed: {', '.join(failed)})" if failed else "")


def run_server(
    model: str | None,
    *,
    host: str,
    port: int,
    api_key: str | None,
    served_model_names: list[str],
    log_level: str,
    engine_kwargs: dict[str, Any],
    max_request_bytes: int = 8 * 1024 * 1024,
    trust_request_chat_template: bool = False,
    max_sequences_per_request: int = 256,
    max_queued_requests: int | None = None,
    shutdown_timeout: float = 30.0,
    exit_on_engine_death: bool = True,
    engine_heartbeat_timeout: float = 30.0,
    http_limits: dict[str, Any] | None = None,
    uvicorn_options: dict[str, Any] | None = None,
    stat_settings: dict[str, Any] | None = None,
    api_settings: dict[str, Any] | None = None,
) -> None:
    """Run the server until it is stopped. The first SIGTERM / SIGINT drains it (see
    :mod:`host.core.entrypoints.drain`), a second one stops it at once. Exits non-zero
    (``SystemExit(1)``) when it stopped because the engine process died."""
    import asyncio

    import uvicorn

    from host.core.engine.client import prestart_engine
    from host.core.engine_args import EngineArgs
    from host.core.entrypoints.api_server import ServerSettings, build_app, tasks_of
    from host.core.plugins.manager import get_plugin_host

    plugin_host = get_plugin_host()
    plugin_host.bootstrap("api")
    # the engine process's interpreter, torch and plugins start while the configuration is made;
    # cancel() ends it when nothing used it (a bad flag, a server that did not start)
    early_engine = prestart_engine()
    try:
        config = EngineArgs.from_kwargs(model=model, served_model_name=(served_model_names or [None])[0], **engine_kwargs).create_engine_config()
        app = build_app(config, ServerSettings(
            served_model_names=served_model_names, api_key=api_key, max_sequences_per_request=max_sequences_per_request,
            model_tasks=tasks_of(config),
            max_queued_requests=max_queued_requests, max_request_bytes=max_request_bytes, trust_request_chat_template=trust_request_chat_template,
            shutdown_timeout=shutdown_timeout, exit_on_engine_death=exit_on_engine_death, engine_heartbeat_timeout=engine_heartbeat_timeout,
            **(stat_settings or {}), **(api_settings or {}),
        ), plugin_host, early_engine=early_engine)

        async def announce() -> None:
            await app.state.ready.wait()
            engine = app.state.engine
            info = engine.engine_info
            try:
                engine_plugins = await engine.utility("plugins", timeout=10)
            except Exception:  # noqa: BLE001
                engine_plugins = []
            api_plugins = [r.to_dict() for r in plugin_host.list_records()]
            lines = [
                f"host serve: model {config.model.model} as {', '.join(app.state.served_model_names)} "
                f"(max_model_len {config.model.max_model_len}, dtype {config.model.dtype})",
                f"  platform: {info.get('platform')}; attention backend: {info.get('attention_backend')}; "
                f"KV cache: {info.get('num_gpu_blocks')} blocks of {info.get('block_size')} tokens; "
                f"{config.compilation.describe()}",
                f"  plugins (api process {os.getpid()}): {_describe_plugins(api_plugins)}",
                f"  plugins (engine process {info.get('pid')}): {_describe_plugins(engine_plugins)}",
                f"  routes from: {', '.join(app.state.endpoints)}",
                f"  listening on {'https' if (uvicorn_options or {}).get('ssl_certfile') else 'http'}://{host}:{port}"
                + ("  (API key required)" if api_key else ""),
            ]
            print("\n".join(lines), file=sys.stderr, flush=True)

        class Server(uvicorn.Server):
            loop: asyncio.AbstractEventLoop | None = None

            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                if not self.should_exit:
                    self.loop = asyncio.get_running_loop()
                    app.state.drain.on_exit = self.stop
                    asyncio.ensure_future(announce())

            def stop(self, code: int) -> None:
                self.should_exit = True

            def handle_exit(self, sig: int, frame: Any) -> None:
                drain = app.state.drain
                if self.loop is None or drain.draining or not app.state.ready.is_set():
                    super().handle_exit(sig, frame)  # not serving yet, or the second signal: stop now
                    if drain.draining:
                        self.force_exit = True
                    return
                self._captured_signals.append(sig)  # re-raised once the server has stopped
                self.loop.call_soon_threadsafe(drain.start, signal.Signals(sig).name)

        from host.core.entrypoints.http_limits import h11_protocol_with_header_timeout

        limits = dict(http_limits or {})
        protocol = h11_protocol_with_header_timeout(limits.pop("header_read_timeout", 10.0))
        options = {"log_level": log_level.lower(), **(uvicorn_options or {})}  # --uvicorn-log-level, --ssl-*, --root-path
        server = Server(uvicorn.Config(
            app, host=host, port=port, lifespan="on", http=protocol,
            timeout_graceful_shutdown=10, timeout_keep_alive=limits.pop("timeout_keep_alive", 5.0),
            limit_concurrency=limits.pop("limit_concurrency", None), h11_max_incomplete_event_size=16 * 1024, **options,
        ))
        # The worker pool's threads (tokenizing, templating, rendering bodies) share the GIL with the
        # event loop, which must win it back after every await: at the default 5 ms switch interval a
        # /health answer waits out ~20 of them (~100 ms) while a large request is processed.
        sys.setswitchinterval(API_SWITCH_INTERVAL_S)
        server.run()
        if not server.started:
            raise RuntimeError("the server did not start (see the log above)")
        if app.state.drain.exit_code:
            raise SystemExit(app.state.drain.exit_code)
    finally:
        early_engine.cancel()
