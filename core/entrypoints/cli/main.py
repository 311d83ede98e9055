"""The ``host`` command: serving, offline generation and plugin administration."""

from __future__ import annotations

import typer

from host import __version__
from host.core.entrypoints.cli.bench_cmd import bench_app
from host.core.entrypoints.cli.doctor_cmd import doctor_cmd
from host.core.entrypoints.cli.flag_groups import GroupedHelpCommand
from host.core.entrypoints.cli.generate_cmd import chat_cmd, generate_cmd
from host.core.entrypoints.cli.pd_proxy_cmd import pd_proxy_cmd
from host.core.entrypoints.cli.plugins_cmd import platform_cmd, plugins_app
from host.core.entrypoints.cli.serve_cmd import serve_cmd
from host.core.logging_config import configure_logging

app = typer.Typer(
    help="host: an LLM inference and serving engine built as a plugin host.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain help text, like the engine flags' grouped help (flag_groups)
)
app.add_typer(plugins_app, name="plugins")
app.add_typer(bench_app, name="bench")
app.command("platform", cls=GroupedHelpCommand)(platform_cmd)
app.command("doctor", cls=GroupedHelpCommand)(doctor_cmd)
app.command("generate", cls=GroupedHelpCommand)(generate_cmd)
app.command("chat", cls=GroupedHelpCommand)(chat_cmd)
app.command("serve", cls=GroupedHelpCommand)(serve_cmd)
app.command("pd-proxy")(pd_proxy_cmd)


@app.command("version")
def version() -> None:
    """Print host's version."""
    typer.echo(__version__)


def main() -> None:
    configure_logging("WARNING")
    app()


if __name__ == "__main__":
    main()
