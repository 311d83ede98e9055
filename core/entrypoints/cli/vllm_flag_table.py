"""The launch-flag table of ``docs/openai_api.md``, generated from the code: every flag ``host serve``
takes, with its status next to vLLM's.

- the engine flags (:class:`~host.core.engine_args.EngineArgs`) and the server flags
  (:class:`~host.core.entrypoints.server_settings.ServerSettings`): *implemented*, with their help;
- vLLM's nested configs key by key (:mod:`.nested_configs`): *translated* into host's flags,
  *accepted, no effect* (one log line), or refused;
- the vLLM flags host takes without effect or refuses (:data:`.vllm_flags.VLLM_FLAGS`), with the
  values host runs with anyway.

``python -m host.core.entrypoints.cli.vllm_flag_table`` prints it; a test keeps the docs equal to it.
"""

from __future__ import annotations

from host.core.entrypoints.cli.engine_flags import default_text, engine_fields, flag_cell
from host.core.entrypoints.cli.nested_configs import nested_config_table
from host.core.entrypoints.cli.server_flags import option_names, server_fields
from host.core.entrypoints.cli.vllm_flags import VLLM_FLAGS

HEADER = "| flag | host | what it does here |\n|---|---|---|\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _spellings(names: list[str]) -> str:
    shown = []
    for name in names:
        on, _, off = name.partition("/")
        shown.append(f"--[no-]{on[2:]}" if off == f"--no-{on[2:]}" else on)
    return ", ".join(f"`{s}`" for s in shown)


def vllm_flag_table() -> str:
    """The markdown table (see the module)."""
    rows = [("`MODEL`, `--model`", "implemented", "the model to serve, under the name typed (or --served-model-name)")]
    for field in engine_fields(exclude=("model",)):
        help_text = field.metadata["help"]
        if field.metadata["choices"]:
            help_text += ": " + ", ".join(f"`{c}`" for c in field.metadata["choices"])
        rows.append((flag_cell(field), "implemented (engine flag, docs/engine.md)", f"{help_text} (default: {default_text(field)})"))
    for field in server_fields():
        rows.append((_spellings(option_names(field)), "implemented (host serve)", field.metadata["help"].rstrip(".")))
    for flag, status, meaning in nested_config_table():
        rows.append((f"`{flag}`", status, meaning))
    for spec in VLLM_FLAGS:
        status = "refused" if spec.refuse else "accepted, no effect"
        if spec.accept:
            status = f"accepted: {', '.join(spec.accept)}; other values {status.replace('accepted, ', '')}"
        rows.append((f"`{spec.name}`" + (" VALUE" if spec.takes_value else ""), status, spec.reason))
    return HEADER + "".join(f"| {_cell(a)} | {_cell(b)} | {_cell(c)} |\n" for a, b, c in rows)


if __name__ == "__main__":
    print(vllm_flag_table(), end="")
