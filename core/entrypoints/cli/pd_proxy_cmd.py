"""``host pd-proxy``: the prefill/decode disaggregation proxy (``core/entrypoints/pd_proxy``)
in front of ``host serve`` instances started with ``--kv-transfer-config`` (prefill:
``kv_producer``, decode: ``kv_consumer``)."""

from __future__ import annotations

import typer


def pd_proxy_cmd(
    prefill: str = typer.Option(..., "--prefill", help="Prefill instances: URL[,URL...] (http://HOST:PORT)."),
    decode: str = typer.Option(..., "--decode", help="Decode instances: URL[,URL...] (http://HOST:PORT)."),
    port: int = typer.Option(8000, "--port", help="Port the proxy listens on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the proxy listens on."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds an upstream request may take."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn's log level."),
) -> None:
    """Serve one OpenAI endpoint that prefills each request on a prefill instance and decodes it
    on a decode instance with the prefill's kv_transfer_params (round-robin over each list)."""
    import uvicorn

    from host.core.entrypoints.pd_proxy import build_app, parse_urls

    try:
        app = build_app(parse_urls(prefill, "--prefill"), parse_urls(decode, "--decode"), timeout_s=timeout)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    typer.echo(f"host pd-proxy: listening on http://{host}:{port}; prefill {prefill}; decode {decode}", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
