"""``host doctor``: what a bug report needs, in one command (CLI process).

Prints every check of :mod:`host.core.entrypoints.cli.doctor_checks` by section (versions,
system, environment, platform, devices, plugins, distributed, resources, ports), each ``ok``,
``warn``, ``fail`` or ``skip`` with a ``fix:`` line under each warn and fail, then a summary.
Exits 1 when any check fails, 0 otherwise (warnings included). ``--json`` prints the same
checks as one JSON object: ``{"checks": [...], "summary": {...}, "ok": bool}``.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

import typer

from host.core.entrypoints.cli.doctor_checks import FAIL, GIB, OK, SKIP, WARN, Check
from host.core.entrypoints.cli.plugin_flags import with_plugin_flags

SECTIONS = ("versions", "system", "environment", "platform", "devices", "plugins", "distributed", "resources", "ports")
_MARK = {OK: "ok  ", WARN: "WARN", FAIL: "FAIL", SKIP: "skip"}


def _guarded(section: str, name: str, fn: Callable[[], list[Check]]) -> list[Check]:
    """Run one check; an exception in it is that check's failure, not the end of the report."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported as a failed check with its text
        return [Check(section, name, FAIL, f"the check itself raised {type(exc).__name__}: {exc}",
                      "a bug in host doctor: include this whole output when you report it")]


def run_checks(plugin_flags: dict[str, Any], host: str, ports: list[int], min_shm_gib: float, min_disk_gib: float,
               dist_timeout: float, distributed: bool) -> list[Check]:
    """Every check, in :data:`SECTIONS` order."""
    from host.core.entrypoints.cli import doctor_checks as dc

    checks = _guarded("versions", "packages", dc.check_versions)
    checks += _guarded("system", "machine", dc.check_system)
    checks += _guarded("environment", "variables", dc.check_environment)
    found: list[Any] = [None]

    def platform() -> list[Check]:
        result, found[0] = dc.check_platform(plugin_flags)
        return result

    checks += _guarded("platform", "resolution", platform)
    checks += _guarded("devices", "devices", lambda: dc.check_devices(found[0]))
    checks += _guarded("plugins", "plugins", lambda: dc.check_plugins(plugin_flags))
    if distributed:
        checks += _guarded("distributed", "all-reduce", lambda: dc.check_distributed(found[0], dist_timeout))
    else:
        checks.append(Check("distributed", "all-reduce", SKIP, "skipped: --no-distributed"))
    checks += _guarded("resources", "shared memory", lambda: dc.check_shm(int(min_shm_gib * GIB)))
    checks += _guarded("resources", "disk", lambda: dc.check_disk(int(min_disk_gib * GIB)))
    checks += _guarded("resources", "default model", dc.check_default_model)
    checks += _guarded("resources", "ipc sockets", dc.check_ipc_dir)
    checks += _guarded("ports", "ports", lambda: dc.check_ports(host, ports))
    return checks


def summarize(checks: list[Check]) -> dict[str, int]:
    counts = {OK: 0, WARN: 0, FAIL: 0, SKIP: 0}
    for c in checks:
        counts[c.status] += 1
    return counts


def render(checks: list[Check]) -> str:
    lines: list[str] = []
    for section in SECTIONS:
        mine = [c for c in checks if c.section == section]
        if not mine:
            continue
        lines.append(f"== {section} ==")
        for c in mine:
            lines.append(f"  [{_MARK[c.status]}] {c.name}: {c.detail}")
            if c.fix:
                lines.append(f"         fix: {c.fix}")
    counts = summarize(checks)
    verdict = "FAIL" if counts[FAIL] else "ok"
    lines.append(f"doctor: {verdict} ({counts[OK]} ok, {counts[WARN]} warn, {counts[FAIL]} fail, {counts[SKIP]} skip)")
    return "\n".join(lines)


@with_plugin_flags
def doctor_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address host serve would listen on."),
    port: Optional[list[int]] = typer.Option(None, "--port", help="Port(s) host serve would use (repeatable). Default: 8000."),
    min_shm_gib: float = typer.Option(1.0, "--min-shm-gib", help="Warn when /dev/shm has less free space (GiB)."),
    min_disk_gib: float = typer.Option(2.0, "--min-disk-gib", help="Warn when a model cache has less free disk (GiB)."),
    dist_timeout: float = typer.Option(60.0, "--dist-timeout", help="Seconds the two-rank all-reduce may take."),
    distributed: bool = typer.Option(True, "--distributed/--no-distributed", help="Run the two-rank all-reduce."),
    *,
    plugin_flags: dict[str, Any],
) -> None:
    """Check this machine for host and print what a bug report needs; exit 1 if a check fails."""
    checks = run_checks(plugin_flags, host, list(port or [8000]), min_shm_gib, min_disk_gib, dist_timeout, distributed)
    counts = summarize(checks)
    if as_json:
        typer.echo(json.dumps({"checks": [c.to_dict() for c in checks], "summary": counts, "ok": counts[FAIL] == 0},
                              indent=2, default=str))
    else:
        typer.echo(render(checks))
    if counts[FAIL]:
        raise typer.Exit(code=1)
