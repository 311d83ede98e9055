"""Every ``host serve`` flag is declared once, in ``ServerSettings``: the command line's default,
``run_server``'s and the settings object's are the same, and ``host serve`` has no server option
that is not a settings field (a flag declared a second time, with its own default, fails here)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import typer
from typer.testing import CliRunner

from host.core.entrypoints.api_server import ServerSettings as AppServerSettings
from host.core.entrypoints.cli import serve_cmd as serve_module
from host.core.entrypoints.cli.engine_flags import engine_fields
from host.core.entrypoints.cli.main import app
from host.core.entrypoints.cli.nested_configs import NESTED_CONFIGS
from host.core.entrypoints.cli.plugin_flags import plugin_options
from host.core.entrypoints.cli.server_flags import field_default, option_names, server_fields
from host.core.entrypoints.cli.vllm_flags import VLLM_FLAGS
from host.core.entrypoints.server_settings import ServerSettings

FIELDS = {f.name: f for f in server_fields()}
UNSET_ENV = {"HOST_API_KEY": None, "HOST_ALLOW_RUNTIME_LORA_UPDATING": None}


def _serve_params() -> dict[str, object]:
    """The click parameters of ``host serve``, by name."""
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_the_settings_are_the_app_settings():
    assert AppServerSettings is ServerSettings


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_every_server_flag_has_one_default(name):
    field = FIELDS[name]
    default = field_default(field)
    param = _serve_params().get(name)
    assert param is not None, f"ServerSettings.{name} has no host serve option"
    cli_default = param.default
    if param.multiple:  # a repeatable option not given is the field's empty list
        assert default == [] and cli_default in (None, (), []), (name, cli_default)
    else:
        assert cli_default == default, f"--{name}: the command line's default {cli_default!r} is not the settings' {default!r}"
    assert list(param.opts) + list(param.secondary_opts) == [
        n for decl in option_names(field) for n in decl.split("/")
    ]
    signature = inspect.signature(serve_module.run_server)
    if name in signature.parameters:
        assert signature.parameters[name].default == default, f"run_server's {name} default differs from the settings'"


def test_run_server_takes_the_settings_and_declares_no_flag_again():
    parameters = inspect.signature(serve_module.run_server).parameters
    assert list(parameters) == ["model", "settings", "engine_kwargs"]
    assert parameters["settings"].default is None  # None: ServerSettings(), the defaults above


def test_serve_has_no_server_option_outside_the_settings():
    declared = (
        set(FIELDS) | {f.name for f in engine_fields()} | {p.name for p in plugin_options()}
        | {spec.param for spec in VLLM_FLAGS} | {"model", "model_option"}
        | {option[2:].replace("-", "_") for option in NESTED_CONFIGS}  # vLLM's nested configs, translated
    )
    stray = sorted(set(_serve_params()) - declared)
    assert stray == [], f"host serve options not declared in ServerSettings (or as engine/plugin/vLLM flags): {stray}"


def test_serve_without_flags_runs_the_default_settings(monkeypatch):
    calls: list[ServerSettings] = []
    monkeypatch.setattr(serve_module, "run_server", lambda model, settings, **kw: calls.append(settings))
    result = CliRunner().invoke(app, ["serve"], env=UNSET_ENV)
    assert result.exit_code == 0, result.output
    assert calls == [ServerSettings()]


def test_exit_on_engine_death_is_on_by_default_as_documented():
    """docs/operations.md: ``--exit-on-engine-death`` (default on); the app's settings once said off."""
    assert ServerSettings().exit_on_engine_death is True
    assert "--exit-on-engine-death/--no-exit-on-engine-death" in option_names(FIELDS["exit_on_engine_death"])


def test_settings_fields_not_on_the_command_line_are_few():
    assert sorted(f.name for f in dataclasses.fields(ServerSettings) if not f.metadata["cli"]) == ["cors", "model_tasks"]
