"""The ``host serve`` flags, declared once: :class:`ServerSettings`.

Each field is declared with :func:`host.core.config.flags.flag`, as the engine flags are: its
default, its help text and how the command line offers it. ``host serve`` builds its server
options from these fields (:mod:`host.core.entrypoints.cli.server_flags`), ``run_server`` takes
the settings object, and the app and the endpoint plugins read it (``app.state.settings``); a
test checks that the command line's defaults are the fields' defaults.

A field ``max_request_bytes`` is the option ``--max-request-bytes`` (``names`` gives other
spellings); a boolean off by default is a plain switch, one on by default a pair
(``--exit-on-engine-death/--no-exit-on-engine-death``). Fields with ``cli=False`` are filled by
the server (``model_tasks``) or derived from flags (``cors``, from the CORS flags, unless given).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from host.core.config.flags import flag

MODEL_TASKS = ("generate",)  # what the decoder-only models we load support
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024


@dataclass
class ServerSettings:
    """Every ``host serve`` flag, and what the app needs beyond the engine config."""

    host: str = flag("127.0.0.1", help="Address to listen on.")
    port: int = flag(8000, help="Port to listen on.")
    api_key: str | None = flag(
        envvar="HOST_API_KEY",
        help="Require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on every route but /health, /version, /metrics and the API docs.",
    )
    served_model_names: list[str] = flag(
        factory=list, names=("--served-model-name",),
        help="Name(s) clients use for the model: the first is listed, the others are aliases (default: MODEL as typed).",
    )
    log_level: str = flag("info", help="uvicorn / host log level.")
    max_request_bytes: int = flag(
        DEFAULT_MAX_REQUEST_BYTES, min=1, help="Largest request body in bytes; a larger one is refused with 413."
    )
    trust_request_chat_template: bool = flag(
        False, names=("--trust-request-chat-template/--no-trust-request-chat-template",),
        help="Let requests bring their own Jinja chat template (chat_template_kwargs.chat_template); rendered sandboxed and time-bounded.",
    )
    max_sequences_per_request: int = flag(
        256, min=1, help="Most sequences (prompts x n) one request may ask for; 400 beyond."
    )
    max_queued_requests: int | None = flag(
        min=1, help="Most requests waiting for their first token; more get 429 with Retry-After (default: no limit).",
    )
    # a drain's wait for in-flight requests (host.core.entrypoints.drain)
    shutdown_timeout: float = flag(
        30.0, min=0, help="On SIGTERM or POST /drain: seconds in-flight requests get to finish before they are aborted."
    )
    # on by default, as docs/operations.md promises (a supervisor restarts the server)
    exit_on_engine_death: bool = flag(
        True, help="Exit (code 1) when the engine process dies, so a supervisor restarts the server."
    )
    engine_heartbeat_timeout: float = flag(
        30.0, min=0.1, help="/health answers 503 when the engine process sent nothing for this many seconds."
    )
    # HTTP connection limits (uvicorn; the header timeout: host.core.entrypoints.http_limits)
    header_read_timeout: float = flag(
        10.0, min=0.1, help="Close a connection whose request headers have not all arrived within this many seconds."
    )
    timeout_keep_alive: float = flag(5.0, min=0.1, help="Close an idle keep-alive connection after this many seconds.")
    limit_concurrency: int | None = flag(
        min=1, help="Most open connections (and tasks) before new requests get 503 (default: no limit)."
    )
    # stat loggers (host.core.frontend.stat_loggers): NAME[:ARG] entries, the metric names' prefix
    # (vllm: or host:), the periodic log line's interval and its switch
    stat_loggers: list[str] = flag(
        factory=list,
        help="Extra stat loggers, NAME[:ARG] (repeat or comma-separate), e.g. jsonl:/var/log/host-stats.jsonl.",
    )
    metrics_prefix: str = flag(
        "vllm", help="Prefix of the /metrics names: 'vllm' (vllm:..., vLLM's names, so vLLM dashboards work) or 'host' (host:...)."
    )
    log_stats_interval: float = flag(
        10.0, min=0.01, help="Seconds between the stats log lines (and the stat loggers' log() calls)."
    )
    disable_log_stats: bool = flag(False, help="Turn off the periodic stats log line.")
    # OpenAI-surface options vLLM scripts pass (docs/openai_api.md): tool calling, reasoning output
    enable_auto_tool_choice: bool = flag(
        False, help='Let tool_choice "auto" return tool calls (needs --tool-call-parser).'
    )
    tool_call_parser: str | None = flag(
        help="Tool-call parser (host.tool_parsers) for the model's output format, e.g. hermes."
    )
    reasoning_parser: str | None = flag(
        help="Reasoning parser (host.reasoning_parsers), e.g. deepseek_r1: fills reasoning_content."
    )
    # the store behind POST /v1/responses' store / previous_response_id and GET/DELETE /v1/responses/{id}
    responses_store_size: int = flag(
        1000, min=0, help="Most responses /v1/responses keeps for GET and previous_response_id (the oldest go first; 0 keeps none).",
    )
    responses_store_ttl: float = flag(
        3600.0, min=1, help="Seconds a stored /v1/responses response is kept (then GET and previous_response_id answer 404).",
    )
    enable_prompt_tokens_details: bool = flag(
        False, help="Report usage.prompt_tokens_details (cached_tokens from the prefix cache)."
    )
    # the template text; the command line takes a file or the text (read_chat_template)
    chat_template: str | None = flag(
        parse="chat_template",
        help="A Jinja chat template (a file, or the template text) used instead of the tokenizer's.",
    )
    enable_tokenizer_info_endpoint: bool = flag(
        False, help="Serve GET /tokenizer_info (the tokenizer's class, limits, special tokens and chat template)."
    )
    enable_server_load_tracking: bool = flag(False, help="Serve GET /load: the number of requests in flight.")
    disable_fastapi_docs: bool = flag(False, help="Serve no /docs, /redoc or /openapi.json.")
    # LoRA (docs/lora.md): adapters served at start; the opt-in for POST /v1/load_lora_adapter and
    # /v1/unload_lora_adapter (else 404)
    lora_modules: list[str] = flag(
        factory=list,
        help='A LoRA adapter served as model NAME (with --enable-lora): NAME=PATH or \'{"name": ..., "path": ..., "base_model_name": ...}\'; repeat for more.',
    )
    enable_lora_runtime_updates: bool = flag(
        False, envvar="HOST_ALLOW_RUNTIME_LORA_UPDATING",
        help="Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (else 404).",
    )
    # the host.io_processors processor /pooling uses when a request names none (docs/pooling.md)
    io_processor: str | None = flag(
        names=("--io-processor", "--io-processor-plugin"),
        help="The IO processor (host.io_processors) POST /pooling runs a request's data through "
        "when it names none, e.g. text_chunks (default: the model's config.json io_processor_plugin, else none).",
    )
    # uvicorn's own options (see uvicorn_options)
    uvicorn_log_level: str | None = flag(help="uvicorn's log level (default: --log-level).")
    disable_uvicorn_access_log: bool = flag(False, help="No access-log line per request.")
    root_path: str | None = flag(help="The path prefix a proxy serves this server under (ASGI root_path).")
    ssl_keyfile: str | None = flag(help="Serve HTTPS with this private key file (with --ssl-certfile).")
    ssl_certfile: str | None = flag(help="Serve HTTPS with this certificate file.")
    ssl_ca_certs: str | None = flag(help="CA certificates file for client certificates.")
    # CORS (starlette's CORSMiddleware, see cors); none given: no CORS headers (vLLM sends them for any origin)
    allowed_origins: str | None = flag(
        help='CORS: origins browsers may call from, a JSON list or comma-separated (e.g. \'["*"]\'); none given: no CORS headers.'
    )
    allowed_methods: str | None = flag(help="CORS: allowed methods (default with CORS on: all).")
    allowed_headers: str | None = flag(help="CORS: allowed request headers (default with CORS on: all).")
    allow_credentials: bool = flag(False, help="CORS: allow credentials (cookies, Authorization).")
    # -- not flags ---------------------------------------------------------------------------
    model_tasks: tuple[str, ...] = flag(
        MODEL_TASKS, cli=False, help="what the served model does (run_server: the engine config's, see tasks_of)"
    )
    cors: dict[str, Any] | None = flag(
        cli=False, help="starlette CORSMiddleware keywords; None sends no CORS headers",
        default_text="from the CORS flags (cors_settings)",
    )

    def __post_init__(self) -> None:
        if self.cors is None:
            self.cors = cors_settings(self.allowed_origins, self.allowed_methods, self.allowed_headers, self.allow_credentials)
        _ = self.uvicorn_options  # a ValueError unless --ssl-keyfile and --ssl-certfile come together

    @property
    def uvicorn_options(self) -> dict[str, Any]:
        """The ``uvicorn.Config`` keywords of the uvicorn flags that were given."""
        return uvicorn_options(
            log_level=self.uvicorn_log_level, access_log=False if self.disable_uvicorn_access_log else None,
            root_path=self.root_path, ssl_keyfile=self.ssl_keyfile, ssl_certfile=self.ssl_certfile,
            ssl_ca_certs=self.ssl_ca_certs,
        )


def _name_list(flag: str, value: str) -> list[str]:
    """A JSON list (vLLM's form, ``'["*"]'``) or comma-separated names."""
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
