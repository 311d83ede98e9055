"""The group and process facts are declared once, by the hook-spec modules, and gathered into
one table that pyproject's entry points, the plugin host and ``host plugins list`` agree with."""

from __future__ import annotations

import re
import tomllib
import types
from pathlib import Path

import pytest

from host.hooks import groups
from host.hooks.groups import FAMILIES, FAMILY_MODULES, GROUPS, family_group, groups_for

REPO = Path(__file__).resolve().parents[2]


def spec_module(**attrs) -> types.ModuleType:
    module = types.ModuleType("host.hooks.synthetic")
    for name, value in {"GROUP": "host.synthetic", "LOADED_IN": ("engine",), "LAZY_IN": (), "SUMMARY": "s", **attrs}.items():
        setattr(module, name, value)
    return module


def test_every_spec_module_declares_its_group():
    spec_files = {p.stem for p in (REPO / "hooks").glob("*.py")} - {"__init__", "groups", "markers"}
    assert {m.__name__.rsplit(".", 1)[-1] for m in FAMILIES} == spec_files
    for module in FAMILIES:
        group = GROUPS[module.GROUP]
        assert FAMILY_MODULES[group.name] is module
        assert group.processes == module.LOADED_IN and group.lazy_in == module.LAZY_IN
        assert group.summary == module.SUMMARY and group.summary
        assert f"``{group.name}``" in module.__doc__  # the module's docstring names its group


def test_group_table_as_the_host_reads_it():
    # the load order and the per-process sets the plugin host has always used
    assert list(GROUPS) == [
        "host.general", "host.models", "host.platforms", "host.attention_backends", "host.quantization",
        "host.kv_connectors", "host.executors", "host.io_processors", "host.endpoints",
        "host.stat_loggers", "host.tool_parsers", "host.reasoning_parsers",
    ]
    assert groups_for("api", include_lazy=False) == [
        "host.general", "host.io_processors", "host.endpoints", "host.stat_loggers", "host.tool_parsers", "host.reasoning_parsers",
    ]
    assert groups_for("api")[:3] == ["host.general", "host.models", "host.platforms"]
    assert "host.executors" in groups_for("engine") and "host.executors" not in groups_for("worker")
    assert (groups.GENERAL_GROUP, groups.PLATFORMS_GROUP, groups.ENDPOINTS_GROUP) == (
        "host.general", "host.platforms", "host.endpoints"
    )
    with pytest.raises(ValueError, match="unknown process 'gpu'"):
        groups_for("gpu")


def test_no_group_table_outside_hooks():
    # the facts live in host.hooks alone: nothing else builds Group records or a process list
    offenders = []
    for folder in ("core", "sdk", "plugins"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            if re.search(r"\bGroup\(|^PROCESSES\b", text, re.MULTILINE):
                offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"group or process tables outside hooks/: {offenders}"


def test_every_pyproject_entry_point_group_is_a_known_group():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = set(project["entry-points"])
    assert declared, "pyproject declares no entry-point groups"
    assert declared <= set(GROUPS), f"unknown entry-point groups in pyproject.toml: {sorted(declared - set(GROUPS))}"


def test_a_bad_declaration_is_a_value_error_naming_it():
    assert family_group(spec_module(LAZY_IN=())).processes == ("engine",)
    with pytest.raises(ValueError, match=r"LOADED_IN names \['gpu'\].*api, engine, worker"):
        family_group(spec_module(LOADED_IN=("engine", "gpu")))
    with pytest.raises(ValueError, match="LAZY_IN=.*outside LOADED_IN"):
        family_group(spec_module(LAZY_IN=("api",)))
