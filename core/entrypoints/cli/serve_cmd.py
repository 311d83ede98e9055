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
flags, the rest come from :mod:`.vllm_flags` (one log line each, or a refusal with the reason);
vLLM's nested configs (``--compilation-config``, ``--structured-outputs-config``, in their JSON
and dotted forms) are translated into engine and server flags by :mod:`.nested_configs`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from typing import Any, Optional

import typer

from host.core.entrypoints.cli.engine_flags import with_engine_flags
from host.core.entrypoints.cli.nested_configs import Translated, log_nested_notes, merge_flags, with_nested_configs
from host.core.entrypoints.cli.plugin_flags import with_plugin_flags
from host.core.entrypoints.cli.server_flags import server_settings, with_server_flags
from host.core.entrypoints.cli.vllm_flags import log_vllm_flags, with_vllm_flags
from host.core.entrypoints.server_settings import ServerSettings
from host.core.entrypoints.server_settings import read_chat_template as read_chat_template  # where it was

logger = logging.getLogger("host.serve")

API_SWITCH_INTERVAL_S = 0.0005
"""The API process's GIL switch interval (Python's default is 5 ms)."""


@with_vllm_flags
@with_nested_configs("--compilation-config", "--structured-outputs-config")
@with_plugin_flags
@with_engine_flags(exclude=("model",))
@with_server_flags
def serve_cmd(
    model: Optional[str] = typer.Argument(
        None, help="HF model directory or .gguf file, served under the name typed here (default: HuggingFaceTB/SmolLM2-135M-Instruct)."
    ),
    model_option: Optional[str] = typer.Option(
        None, "--model", help="The model as a flag, as vLLM scripts pass it (the same as the MODEL argument)."
    ),
    *,
    server_flags: dict[str, Any],
    engine_kwargs: dict[str, Any],
    plugin_flags: dict[str, Any],
    vllm_flags: dict[str, Any],
    nested_configs: Translated,
) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API."""
    from host.core.logging_config import configure_logging
    from host.core.plugins.manager import plugin_host_for

    configure_logging(str(server_flags["log_level"]).upper())
    log_vllm_flags(vllm_flags)
    log_nested_notes(nested_configs, logger)
    if model is not None and model_option is not None and model != model_option:
        typer.echo(f"error: the model is given twice ({model!r} and --model {model_option!r}); pass it once", err=True)
        raise typer.Exit(code=2)
    model = model if model is not None else model_option
    try:
        os.environ.update(plugin_host_for(**plugin_flags).settings.to_env())  # the engine process inherits them
        engine_kwargs = merge_flags(engine_kwargs, nested_configs.engine, _flag_of)
        settings = server_settings(**merge_flags(server_flags, nested_configs.server, _flag_of))
        if isinstance(engine_kwargs.get("kv_transfer_config"), dict):
            # a connector may derive its side-channel ports from the server's
            engine_kwargs["kv_transfer_config"] = {"http_port": settings.port, **engine_kwargs["kv_transfer_config"]}
        run_server(model, settings, engine_kwargs=engine_kwargs)
    except (ValueError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)


def _flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _describe_plugins(records: list[dict[str, Any]]) -> str:
    loaded = sorted({f"{r['name']}" for r in records if r.get("status") == "loaded"})
    failed = sorted({f"{r['name']}" for r in records if r.get("status") == "failed"})
    text = ", ".join(loaded) or "none"
    return text + (f" (failed: {', '.join(failed)})" if failed else "")


def run_server(model: str | None, settings: ServerSettings | None = None, *, engine_kwargs: dict[str, Any] | None = None) -> None:
    """Run the server until it is stopped, with ``settings`` (every server flag; ``None``: the
    defaults) and the engine built from ``model`` and ``engine_kwargs`` (``EngineArgs``
    keywords). The first SIGTERM / SIGINT drains it (see :mod:`host.core.entrypoints.drain`), a
    second one stops it at once. Exits non-zero (``SystemExit(1)``) when it stopped because the
    engine process died."""
    import asyncio

    import uvicorn

    from host.core.engine.client import prestart_engine
    from host.core.engine_args import EngineArgs
    from host.core.entrypoints.api_server import build_app, tasks_of
    from host.core.plugins.manager import get_plugin_host

    settings = settings if settings is not None else ServerSettings()
    host, port = settings.host, settings.port
    plugin_host = get_plugin_host()
    plugin_host.bootstrap("api")
    # the engine process's interpreter, torch and plugins start while the configuration is made;
    # cancel() ends it when nothing used it (a bad flag, a server that did not start)
    early_engine = prestart_engine()
    try:
        config = EngineArgs.from_kwargs(
            model=model, served_model_name=(settings.served_model_names or [None])[0], **(engine_kwargs or {})
        ).create_engine_config()
        settings = dataclasses.replace(settings, model_tasks=tasks_of(config))
        app = build_app(config, settings, plugin_host, early_engine=early_engine)

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
                f"  listening on {'https' if settings.ssl_certfile else 'http'}://{host}:{port}"
                + ("  (API key required)" if settings.api_key else ""),
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

        protocol = h11_protocol_with_header_timeout(settings.header_read_timeout)
        # --uvicorn-log-level, --disable-uvicorn-access-log, --ssl-*, --root-path
        options = {"log_level": settings.log_level.lower(), **settings.uvicorn_options}
        server = Server(uvicorn.Config(
            app, host=host, port=port, lifespan="on", http=protocol,
            timeout_graceful_shutdown=10, timeout_keep_alive=settings.timeout_keep_alive,
            limit_concurrency=settings.limit_concurrency, h11_max_incomplete_event_size=16 * 1024, **options,
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
