"""The vLLM launch-script flags ``host serve`` takes although they change nothing here, or refuses
with the reason.

A script written for ``vllm serve`` passes flags such as ``--trust-remote-code``,
``--disable-log-requests`` or ``--swap-space 4``. Each flag of :data:`VLLM_FLAGS` is one of:

- *accepted without effect*: given, it logs ONE warning line saying why it does nothing here
  (never silently), and the server starts;
- *refused*: a usage error (exit code 2) naming the flag, the reason and what to do instead;
- *a value host already runs with* (``accept``): ``--tokenizer-mode auto`` or ``--cpu-offload-gb 0``
  describe what host does anyway and start without a line; any other value is refused (or only logged, for flags whose other values merely do not apply).

The vLLM flags host implements are ordinary options (engine flags such as ``--seed``,
``--max-logprobs``, ``--dtype half``, ``--kv-cache-dtype fp8``, ``--enable-chunked-prefill``, or ``host serve``'s own,
such as ``--chat-template``, ``--uvicorn-log-level``, ``--ssl-certfile``, ``--root-path``); docs/openai_api.md lists all of them with their status.
:func:`with_vllm_flags` gives a command these options, received as one parameter
``vllm_flags`` (``{flag: value}`` of those given); :func:`log_vllm_flags` writes their lines.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import typer

from host.core.entrypoints.cli.flag_groups import add_flag_group

PANEL = "vLLM compatibility (accepted without effect, or refused with the reason)"
logger = logging.getLogger("host.serve")


@dataclass(frozen=True)
class VllmFlag:
    """One vLLM flag: its spelling, whether it takes a value, and what host does with it.

    :param refuse: refuse values outside ``accept`` (else they are accepted and logged).
    :param accept: values meaning what host does anyway (accepted with no line); ``()`` for a
        switch or a flag whose every value is logged (or refused).
    """

    name: str
    reason: str
    takes_value: bool = False
    refuse: bool = False
    accept: tuple[str, ...] = ()

    @property
    def param(self) -> str:
        return self.name[2:].replace("-", "_")


VLLM_FLAGS: tuple[VllmFlag, ...] = (
    # switches that change nothing here
    VllmFlag("--trust-remote-code", "host runs only installed architectures (host.models plugins, or transformers' own classes through --model-impl transformers) and never runs code from a model folder"),
    VllmFlag("--disable-frontend-multiprocessing", "the OpenAI front end always runs in the API process, the engine in its own"),
    VllmFlag("--disable-log-requests", "host does not log each request (the periodic stats line is --disable-log-stats)"),
    VllmFlag("--enable-log-requests", "host does not log each request; /metrics and --stat-loggers report them"),
    VllmFlag("--disable-custom-all-reduce", "host picks its shared-memory all-reduce per call and falls back to torch.distributed by itself"),
    VllmFlag("--enable-request-id-headers", "host's responses carry no X-Request-Id header"),
    VllmFlag("--use-v2-block-manager", "host has one block manager, the paged one (the flag is gone from vLLM too)"),
    VllmFlag("--disable-sliding-window", "a model whose config names a sliding window (Mistral, Phi-3, Qwen2, Ministral) always attends over it, as transformers does"),
    VllmFlag("--enable-sleep-mode", "host has no sleep/wake endpoints"),
    VllmFlag("--enforce-eager-prefill", "host's prefill never runs in device graphs"),
    VllmFlag("--return-tokens-as-token-ids", "set return_tokens_as_token_ids on the request instead"),
    VllmFlag("--enable-force-include-usage", "request usage with stream_options.include_usage"),
    VllmFlag("--worker-use-ray", "use --distributed-executor-backend ray (vLLM removed this flag too)", refuse=True),
    # values that change nothing here
    VllmFlag("--code-revision", "host runs no code from a model folder", takes_value=True),
    VllmFlag("--tokenizer-mode", "host loads the folder's tokenizer with transformers' AutoTokenizer (fast where there is one)",
             takes_value=True, accept=("auto",)),
    VllmFlag("--swap-space", "host never swaps KV blocks to CPU memory: a preempted request recomputes its blocks", takes_value=True),
    VllmFlag("--cpu-offload-gb", "host keeps every weight on the device", takes_value=True, accept=("0",)),
    VllmFlag("--max-seq-len-to-capture", "host's decode graphs cover every length (--cuda-graph-sizes chooses the batch sizes)", takes_value=True),
    VllmFlag("--max-parallel-loading-workers", "host reads one weight file at a time", takes_value=True),
    VllmFlag("--max-log-len", "host does not log prompts", takes_value=True),
    VllmFlag("--response-role", "chat answers always have role assistant", takes_value=True, accept=("assistant",)),
    VllmFlag("--chat-template-content-format", "host joins text content parts into a string for every template",
             takes_value=True, accept=("auto", "string")),
    VllmFlag("--guided-decoding-backend", "host's structured outputs run on xgrammar, its one backend (vLLM's newer "
             "spelling: --structured-outputs-config.backend)", takes_value=True, refuse=True, accept=("auto", "xgrammar")),
    VllmFlag("--generation-config", "sampling defaults come from the request (vLLM's --generation-config vllm)",
             takes_value=True, accept=("vllm",)),
    VllmFlag("--preemption-mode", "host preempts by recomputing", takes_value=True, accept=("recompute",)),
    VllmFlag("--num-scheduler-steps", "host schedules every step (async scheduling overlaps planning instead)", takes_value=True, accept=("1",)),
    VllmFlag("--device", "the platform is detected (--platform forces one)", takes_value=True, accept=("auto",)),
    VllmFlag("--override-generation-config", "sampling defaults come from the request", takes_value=True),
    # refused: host cannot do what they ask
    VllmFlag("--limit-mm-per-prompt", "host serves text-only models", takes_value=True, refuse=True),
    VllmFlag("--tool-parser-plugin", "host's tool parsers are installed plugins (entry point group host.tool_parsers), "
             "chosen with --tool-call-parser", takes_value=True, refuse=True),
    VllmFlag("--config", "host serve reads no config file; pass the flags on the command line", takes_value=True, refuse=True),
    VllmFlag("--headless", "host's API server and engine always start together", refuse=True),
    VllmFlag("--middleware", "host's routes and middlewares are endpoint plugins (host.endpoints)", takes_value=True, refuse=True),
    VllmFlag("--hf-overrides", "host reads the model's config.json as it is; edit it in a copy of the folder",
             takes_value=True, refuse=True),
)


def vllm_options() -> list[inspect.Parameter]:
    """One typer option per :data:`VLLM_FLAGS` entry: a switch, or one text value."""
    params = []
    for spec in VLLM_FLAGS:
        help_text = ("Refused: " if spec.refuse else "No effect: ") + spec.reason + "."
        if spec.accept:
            help_text = f"Accepted: {', '.join(spec.accept)}; other values: " + help_text[0].lower() + help_text[1:]
        if spec.takes_value:
            option = typer.Option(None, spec.name, help=help_text, rich_help_panel=PANEL, show_default=False)
            params.append(inspect.Parameter(spec.param, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=Optional[str]))
        else:
            option = typer.Option(False, spec.name, help=help_text, rich_help_panel=PANEL, show_default=False)
            params.append(inspect.Parameter(spec.param, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=bool))
    return params


def check_vllm_flags(**values: Any) -> dict[str, Any]:
    """The vLLM flags given, ``{"--flag": value}`` (``True`` for a switch); a refused one is a
    usage error naming it, the value and the reason."""
    given: dict[str, Any] = {}
    for spec in VLLM_FLAGS:
        value = values.get(spec.param)
        if value is None or value is False:
            continue
        if spec.refuse and (not spec.accept or str(value).strip().lower() not in spec.accept):
            shown = spec.name if value is True else f"{spec.name} {value}"
            raise typer.BadParameter(f"{shown} is not supported: {spec.reason}", param_hint=spec.name)
        given[spec.name] = value
    return given


def vllm_flag_notes(given: dict[str, Any]) -> list[str]:
    """One line per given flag that has no effect here (values host runs with anyway: none)."""
    specs = {spec.name: spec for spec in VLLM_FLAGS}
    notes = []
    for name, value in given.items():
        spec = specs[name]
        if spec.accept and str(value).strip().lower() in spec.accept:
            continue
        shown = name if value is True else f"{name} {value}"
        notes.append(f"{shown} has no effect here: {spec.reason}")
    return notes


def log_vllm_flags(given: dict[str, Any]) -> None:
    """Log :func:`vllm_flag_notes` (one warning each)."""
    for note in vllm_flag_notes(given):
        logger.warning("%s", note)


def with_vllm_flags(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a typer command the :data:`VLLM_FLAGS`, received as ``vllm_flags`` (see the module)."""
    return add_flag_group(func, "vllm_flags", vllm_options(), check_vllm_flags)
