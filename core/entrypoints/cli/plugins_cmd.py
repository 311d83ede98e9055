"""``host plugins ...`` and ``host platform``: what is installed, what loads where, and why."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from host.core.entrypoints.cli.flag_groups import GroupedHelpCommand
from host.core.entrypoints.cli.plugin_flags import with_plugin_flags
from host.core.plugins.manager import FAILED, REGISTRY_HOOK, PluginError, PluginHost, get_plugin_host
from host.core.plugins.settings import PluginSettings
from host.hooks.groups import GENERAL_GROUP, GROUPS, PLATFORMS_GROUP, PROCESSES, groups_for

plugins_app = typer.Typer(help="Inspect installed plugins.", no_args_is_help=True, rich_markup_mode=None)



def inspect_host(
    plugins: str | None = None, block_plugins: str | None = None, strict_plugins: bool | None = None, platform: str | None = None
) -> PluginHost:
    """Load every group in this (CLI) process without raising, to report on all of them."""
    settings = PluginSettings.from_env(plugins=plugins, block_plugins=block_plugins, strict=strict_plugins, platform=platform)
    given = (plugins, block_plugins, strict_plugins, platform) != (None, None, None, None)
    host = PluginHost(settings) if given else get_plugin_host(settings)
    host.load_groups(GROUPS, raise_on_fatal=False)
    for kind in REGISTRY_HOOK:
        try:
            host.registry(kind)
        except PluginError:
            pass  # recorded on the plugin; shown in the listing
    return host


def _rows(host: PluginHost, group: str | None, process: str | None) -> list[dict[str, Any]]:
    if group is not None and group not in GROUPS:
        raise typer.BadParameter(f"unknown group {group!r}; expected one of {', '.join(GROUPS)}", param_hint="--group")
    if process is not None and process not in PROCESSES:
        raise typer.BadParameter(f"unknown process {process!r}; expected one of {', '.join(PROCESSES)}", param_hint="--process")
    wanted = set(groups_for(process)) if process else set(GROUPS)
    rows = []
    for record in host.list_records():
        if record.group not in wanted or (group is not None and record.group != group):
            continue
        rows.append(record.to_dict())
    return rows


@plugins_app.command("list", cls=GroupedHelpCommand)
@with_plugin_flags
def list_plugins(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    group: Optional[str] = typer.Option(None, "--group", help="Only this entry-point group (e.g. host.platforms)."),
    process: Optional[str] = typer.Option(None, "--process", help="Only groups this process loads: api, engine or worker."),
    show_all: bool = typer.Option(False, "--all", help="Also show what each plugin registered, groups with no plugin, and every architecture the transformers fallback runs."),
    server: Optional[str] = typer.Option(
        None, "--server", help="Ask a running host serve (e.g. http://127.0.0.1:8000) what each of its processes loaded: "
        "the API server, the engine and every worker process. The API key is read from HOST_API_KEY.",
    ),
    *,
    plugin_flags: dict[str, Any],
) -> None:
    """List every discovered plugin: group, distribution, processes, status and hooks."""
    if server is not None:
        _list_server_plugins(server, as_json)
        return
    host = inspect_host(**plugin_flags)
    rows = _rows(host, group, process)
    unknown = host.unknown_allowlisted()
    kernels = _kernel_rows(host)
    models = _model_rows(include_fallback=show_all)
    if as_json:
        payload: dict[str, Any] = {"plugins": rows, "unknown_allowlisted": unknown, "kernels": kernels, "models": models}
        if show_all:
            payload["groups"] = {
                name: {"processes": list(g.processes), "lazy_in": list(g.lazy_in), "summary": g.summary}
                for name, g in GROUPS.items()
            }
        typer.echo(json.dumps(payload, indent=2))
        return
    console = Console(width=max(Console().width, 160))
    table = Table(title="host plugins", show_lines=False)
    for col in ("name", "group", "distribution", "version", "source", "processes", "status", "hooks"):
        table.add_column(col)
    for row in rows:
        status = row["status"] + (f": {row['reason']}" if row["reason"] else "")
        style = {"loaded": "green", "failed": "red", "blocked": "yellow"}.get(row["status"], "dim")
        hooks = ", ".join(row["hooks"])
        if show_all and row["registered"]:
            hooks += "\n  registers: " + ", ".join(row["registered"])
        table.add_row(
            row["name"], row["group"], row["distribution"], row["version"], row["source"],
            ",".join(row["processes"]), f"[{style}]{status}[/{style}]", hooks,
        )
    console.print(table)
    if show_all:
        present = {r["group"] for r in rows}
        for name, g in GROUPS.items():
            if name not in present:
                console.print(f"[dim]{name}: no plugin installed ({g.summary}; processes: {','.join(g.processes)})[/dim]")
    for name in unknown:
        console.print(f"[red]allowlisted name {name!r} matches no installed plugin[/red]")
    if kernels:
        console.print(_kernel_table(kernels))
    if models:
        console.print(_model_table(models, show_all))


def _model_rows(include_fallback: bool) -> list[dict[str, str]]:
    """The architectures and their implementations (:func:`host.core.models.registry.architecture_rows`:
    the native ones, and with ``include_fallback`` (``--all``) every transformers one); empty,
    with a warning, when the models group cannot load."""
    from host.core.models.registry import architecture_rows

    try:
        return architecture_rows(include_fallback)
    except Exception as exc:  # noqa: BLE001 - a listing reports, it does not fail
        typer.echo(f"warning: models: {exc}", err=True)
        return []


def _model_table(models: list[dict[str, str]], show_all: bool) -> Table:
    native = [m for m in models if m["implementation"] == "native"]
    fallback = [m["architecture"] for m in models if m["implementation"] == "transformers"]
    table = Table(title="model architectures (--model-impl auto: native where registered, else transformers)")
    for col in ("architecture", "implementation", "plugin", "class"):
        table.add_column(col)
    for m in native:
        table.add_row(m["architecture"], "native", m["plugin"], m["target"])
    if show_all:
        for arch in fallback:
            table.add_row(arch, "transformers", "", "the transformers fallback")
    else:
        table.add_row("any other *ForCausalLM", "transformers", "", "the transformers fallback (--all lists them)")
    return table


def _list_server_plugins(server: str, as_json: bool) -> None:
    """What each process of a running server loaded, from its ``/v1/plugins``."""
    import os

    import httpx

    headers = {"Authorization": f"Bearer {os.environ['HOST_API_KEY']}"} if os.environ.get("HOST_API_KEY") else {}
    url = server.rstrip("/") + "/v1/plugins"
    try:
        response = httpx.get(url, headers=headers, timeout=30)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        typer.echo(f"cannot read {url}: {exc}; is `host serve` running there (and HOST_API_KEY set if it needs a key)?", err=True)
        raise typer.Exit(1) from None
    payload = response.json()
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
        return
    console = Console(width=max(Console().width, 160))
    table = Table(title=f"plugins loaded by {server}", show_lines=False)
    for col in ("process", "pid", "name", "group", "distribution", "status"):
        table.add_column(col)
    for process, entry in payload.get("processes", {}).items():
        if "error" in entry:
            table.add_row(process, str(entry.get("pid")), "", "", "", f"[red]{entry['error']}[/red]")
        for row in entry.get("plugins", []):
            table.add_row(process, str(row.get("process_pid", entry.get("pid"))), row["name"], row["group"], row["distribution"], row["status"])
    console.print(table)


@plugins_app.command("new")
def new_plugin(
    name: str = typer.Argument(..., help="The plugin's name: the entry point, the Python package (with _) and the distribution (with -)."),
    group: str = typer.Option(..., "--group", help=f"The plugin family, with or without 'host.': {', '.join(GROUPS)}."),
    directory: str = typer.Option(".", "--dir", help="Where to create the package directory NAME/."),
) -> None:
    """Write a pip-installable plugin package NAME/: a working minimal plugin of the family, its
    entry point, a README, and tests running the family's conformance suite."""
    from pathlib import Path

    from host.core.entrypoints.cli.plugin_template import write_plugin

    try:
        files = write_plugin(name, group, Path(directory))
    except ValueError as exc:
        typer.echo(f"host plugins new: {exc}", err=True)
        raise typer.Exit(2) from None
    root = files[0].parent
    for path in files:
        typer.echo(f"  wrote {path}")
    typer.echo(f"next: pip install -e {root} && pytest {root / 'tests'} && host plugins list")


@plugins_app.command("check", cls=GroupedHelpCommand)
@with_plugin_flags
def check_plugins(*, plugin_flags: dict[str, Any]) -> None:
    """Exit non-zero if an allowlisted (or built-in) plugin failed or an allowlisted name is unknown."""
    host = inspect_host(**plugin_flags)
    problems = [f"allowlisted name {n!r} matches no installed plugin" for n in host.unknown_allowlisted()]
    for r in host.list_records():
        if r.status == FAILED and r.fatal:
            problems.append(f"{r.name} ({r.group}, {r.distribution}) failed: {r.reason}")
    warnings = [f"{r.name} ({r.group}) failed: {r.reason}" for r in host.list_records() if r.status == FAILED and not r.fatal]
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    if problems:
        for p in problems:
            typer.echo(f"error: {p}", err=True)
        raise typer.Exit(code=1)
    loaded = sum(1 for r in host.list_records() if r.status == "loaded")
    typer.echo(f"ok: {loaded} plugins load cleanly")


@with_plugin_flags
def platform_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    *,
    plugin_flags: dict[str, Any],
) -> None:
    """Print the platform this machine resolves to, and why."""
    from host.core.plugins.platform import PlatformResolutionError, resolve_platform

    flags = dict(plugin_flags)
    settings = PluginSettings.from_env(strict=flags.pop("strict_plugins"), **flags)
    host = PluginHost(settings)
    try:
        host.load_groups([GENERAL_GROUP, PLATFORMS_GROUP])
        res = resolve_platform(host)
    except (PlatformResolutionError, PluginError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1)
    methods = _quantization_rows(host, res.platform)
    kernels = _kernel_rows(host, res.platform)
    if as_json:
        typer.echo(json.dumps({**res.to_dict(), "quantization_methods": methods, "kernels": kernels}, indent=2))
        return
    console = Console()
    console.print(f"[bold]{res.platform.name}[/bold]: {res.reason}")
    for key, value in res.platform.describe().items():
        console.print(f"  {key}: {value}")
    table = Table(title="platform probes")
    for col in ("platform", "plugin", "source", "detected", "why / error"):
        table.add_column(col)
    for p in res.probes:
        why = "; ".join(x for x in (p.reason, p.error) if x)
        table.add_row(p.name, p.plugin.split(":", 1)[-1], "builtin" if p.builtin else "third-party", str(p.detected), why)
    console.print(table)
    quant = Table(title="quantization methods (--quantization)")
    for col in ("method", "plugin", "what", "runs here"):
        quant.add_column(col)
    for m in methods:
        here = "; ".join(f"{dtype}: {'yes' if why is None else why}" for dtype, why in m["runs_here"].items())
        quant.add_row(m["name"], m["plugin"], m["summary"], here)
    console.print(quant)
    if kernels:
        console.print(_kernel_table(kernels))
    sys.stdout.flush()


def _kernel_rows(host: PluginHost, platform: Any = None) -> list[dict[str, Any]]:
    """Which kernel serves each op of the kernel table on ``platform``'s device type (resolved
    from ``host`` when not given), and why, with the runners-up: ``host``'s loaded plugins offer
    their kernels (``host_offer_kernels``, default settings) first. A platform that does not
    resolve or a failing plugin is a warning and what the table holds is still shown."""
    from host.interfaces.kernels import kernel_report

    if platform is None:
        from host.core.plugins.platform import PlatformResolutionError, resolve_platform

        try:
            platform = resolve_platform(host).platform
        except (PlatformResolutionError, PluginError, ValueError) as exc:
            typer.echo(f"warning: kernels: no platform resolves here ({exc})", err=True)
            return []
    try:
        host.offer_kernels(platform, None, only_new=True)
    except PluginError as exc:
        typer.echo(f"warning: kernels: {exc}", err=True)
    return kernel_report(platform.device_type, fill=False)


def _kernel_table(kernels: list[dict[str, Any]]) -> Table:
    device = kernels[0]["device_type"]
    table = Table(title=f"kernels on {device} (host_offer_kernels; the first row of each op serves it)")
    for col in ("op", "kernel", "plugin", "why", "runners-up"):
        table.add_column(col)
    for k in kernels:
        rest = "\n".join(f"{r['name']} ({r['source']}): {r['why']}" for r in k["runners_up"]) or "-"
        table.add_row(k["op"], f"[green]{k['serves']}[/green]", k["source"], k["why"], rest)
    return table


def _quantization_rows(host: PluginHost, platform: Any) -> list[dict[str, Any]]:
    """Every registered quantization method, and whether it runs on ``platform`` in each of its dtypes."""
    from host.core.models.quant_plan import unsupported_reason
    from host.hooks.quantization import GROUP

    host.load_groups([GROUP], raise_on_fatal=False)
    try:
        registry = host.registry("quantization_methods")
    except PluginError as exc:
        typer.echo(f"warning: quantization methods: {exc}", err=True)
        return []
    rows = []
    for name, cls in sorted(registry.items()):
        rows.append({
            "name": name,
            "plugin": host.registry_owner("quantization_methods", name).split(":", 1)[-1],
            "summary": getattr(cls, "summary", ""),
            "runs_here": {d: unsupported_reason(cls, platform, d) for d in platform.supported_dtypes},
        })
    return rows
