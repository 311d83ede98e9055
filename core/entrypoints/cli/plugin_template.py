"""``host plugins new NAME --group GROUP``: write a pip-installable plugin package from the
family's template in ``host/sdk/template/`` (a working minimal plugin, its README, and tests
running the family's conformance suite from ``host.sdk.testing``)."""

from __future__ import annotations

import re
from pathlib import Path

from host.hooks.groups import GROUPS

TEMPLATES = Path(__file__).resolve().parents[3] / "sdk" / "template"
_NAME = re.compile(r"^[a-z][a-z0-9_-]{1,40}$")


def family_of(group: str) -> str:
    """``"host.endpoints"`` or ``"endpoints"`` -> ``"endpoints"`` (the template directory); a
    ``ValueError`` lists the groups for anything else."""
    full = group if group.startswith("host.") else f"host.{group}"
    if full not in GROUPS:
        raise ValueError(f"unknown group {group!r}; use one of {', '.join(GROUPS)} (with or without 'host.')")
    return full.removeprefix("host.")


def placeholders(name: str, group: str) -> dict[str, str]:
    """The values the templates' ``{{...}}`` fields take for plugin ``name`` in ``group``."""
    if not _NAME.match(name):
        raise ValueError(
            f"plugin name {name!r} must be 2-41 characters of lowercase letters, digits, '_' or '-', starting "
            "with a letter (it becomes the entry-point name, the Python package and the distribution)"
        )
    full = f"host.{family_of(group)}"
    package = name.replace("-", "_")
    info = GROUPS[full]
    return {
        "name": package,
        "package": package,
        "dist": package.replace("_", "-"),
        "group": full,
        "Class": "".join(part.capitalize() for part in package.split("_")),
        "ENV": package.upper(),
        "summary": info.summary or full,
        "processes": ", ".join(info.processes),
    }


def render(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    leftover = re.search(r"\{\{\w+\}\}", text)
    if leftover:
        raise RuntimeError(f"template field {leftover.group(0)} has no value; the template and plugin_template.py disagree")
    return text


def write_plugin(name: str, group: str, parent: Path) -> list[Path]:
    """Write the package into ``parent / name``; returns the files written. An existing
    directory is a ``ValueError`` (nothing is overwritten)."""
    values = placeholders(name, group)
    family = family_of(group)
    root = parent / name
    if root.exists():
        raise ValueError(f"{root} already exists; pick another name or remove it")
    values["use"] = render((TEMPLATES / family / "use.md").read_text().strip(), values)
    files = {
        "pyproject.toml": TEMPLATES / "pyproject.toml.tmpl",
        "README.md": TEMPLATES / "README.md.tmpl",
        f"{values['package']}/__init__.py": TEMPLATES / family / "plugin.py.tmpl",
        "tests/conftest.py": TEMPLATES / "conftest.py.tmpl",
        f"tests/test_{values['package']}.py": TEMPLATES / family / "test_plugin.py.tmpl",
    }
    written = []
    for relative, template in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(template.read_text(), values))
        written.append(path)
    return written
