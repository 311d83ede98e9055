"""What the keys of vLLM's nested config flags mean to host: each key is translated into host's own
flags, accepted without effect (one log line saying why), or refused with the reason.

:mod:`.nested_args` folds the dotted and JSON forms of a config into one JSON object; this module
reads it:

- ``--compilation-config`` (and ``-O.KEY``): ``mode`` / ``level`` (0 eager; 1-3 torch.compile),
  ``cudagraph_mode`` (``NONE``: no decode graphs; any other mode: decode graphs, which in host
  are whole decode steps), ``cudagraph_capture_sizes`` / ``max_cudagraph_capture_size`` (the
  graphs' batch sizes), ``custom_ops`` (``["all"]`` / ``["none"]``: the platform's fused kernels
  on / off) become the engine flags ``--torch-compile``, ``--cuda-graph-sizes`` and
  ``--custom-ops``; the tuning keys of vLLM's own compiler (``pass_config``, ``splitting_ops``,
  ``compile_sizes``, ...) are accepted without effect;
- ``--structured-outputs-config``: ``backend`` ``auto`` / ``xgrammar`` (host's one backend; other
  backends refused), ``reasoning_parser`` (the server's ``--reasoning-parser``),
  ``disable_any_whitespace``, ``disable_fallback``, ``disable_additional_properties``,
  ``enable_in_reasoning`` and ``reasoning_parser_plugin`` each as :data:`STRUCTURED_OUTPUTS_KEYS`
  says;
- ``--speculative-config``, ``--kv-transfer-config``, ``--pooler-config`` and
  ``--quantization-config`` are host's own JSON flags (their config classes read them);
  :func:`check_config_keys` refuses a key they lack at the command line, naming it.

Every refusal is a :class:`NestedConfigError` (a ``ValueError``) reading
``--compilation-config.backend="eager" is not supported: <reason>``; a key no vLLM config has
either is refused listing the keys host reads. :func:`nested_config_table` is the rows of
``docs/openai_api.md``'s flag table for these configs.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable


class NestedConfigError(ValueError):
    """A nested config key host refuses: the message names the key, the reason and what to use instead."""


@dataclass
class Translated:
    """A nested config in host's terms: ``engine`` (``EngineArgs`` keywords), ``server``
    (``ServerSettings`` fields) and ``notes`` (one line per key accepted without effect)."""

    engine: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def set(self, part: str, name: str, value: Any, shown: str) -> None:
        target = self.engine if part == "engine" else self.server
        if name in target and target[name] != value:
            raise NestedConfigError(f"{shown} contradicts another key of the same config ({name}={target[name]!r}); keep one")
        target[name] = value


def _shown(option: str, key: str, value: Any) -> str:
    return f"{option}.{key}={json.dumps(value)}"


@dataclass(frozen=True)
class Key:
    """One key of a vLLM nested config: ``meaning`` says what host does with it (the docs table);
    ``apply(value, shown, result)`` translates a value (raising :class:`NestedConfigError` to refuse
    it); ``None`` accepts every value without effect, logging ``meaning`` as the reason."""

    name: str
    meaning: str
    apply: Callable[[Any, str, Translated], None] | None = None


def _refuse(shown: str, reason: str) -> None:
    raise NestedConfigError(f"{shown} is not supported: {reason}")


def _bool(value: Any, shown: str) -> bool:
    if not isinstance(value, bool):
        raise NestedConfigError(f"{shown} must be true or false")
    return value


def _sizes(value: Any, shown: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in value):
        raise NestedConfigError(f"{shown} must be a list of positive batch sizes, e.g. [1,2,4,8]")
    return sorted(set(value))


# -- --compilation-config -------------------------------------------------------------------------

COMPILATION_MODES = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2, "VLLM_COMPILE": 3}
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def _mode(value: Any, shown: str, out: Translated) -> None:
    mode = COMPILATION_MODES.get(value.upper()) if isinstance(value, str) else value
    if not isinstance(mode, int) or isinstance(mode, bool) or mode not in (0, 1, 2, 3):
        raise NestedConfigError(
            f"{shown} is not a compilation mode; use 0-3 or {', '.join(COMPILATION_MODES)} (0: eager, 1-3: torch.compile)"
        )
    out.set("engine", "torch_compile", mode > 0, shown)


def _cudagraph_mode(value: Any, shown: str, out: Translated) -> None:
    if not isinstance(value, str) or value.upper() not in CUDAGRAPH_MODES:
        raise NestedConfigError(f"{shown} is not a cudagraph mode; use one of {', '.join(CUDAGRAPH_MODES)}")
    out.set("engine", "cuda_graphs", value.upper() != "NONE", shown)


def _use_cudagraph(value: Any, shown: str, out: Translated) -> None:
    out.set("engine", "cuda_graphs", _bool(value, shown), shown)


def _capture_sizes(value: Any, shown: str, out: Translated) -> None:
    sizes = _sizes(value, shown)
    if sizes:
        out.set("engine", "cuda_graph_sizes", sizes, shown)
    else:
        out.set("engine", "cuda_graphs", False, shown)


def _max_capture_size(value: Any, shown: str, out: Translated) -> None:
    from host.core.config.compilation import default_graph_sizes

    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise NestedConfigError(f"{shown} must be a batch size >= 0 (0: no decode graphs)")
    if value == 0:
        out.set("engine", "cuda_graphs", False, shown)
        return
    given = out.engine.get("cuda_graph_sizes")
    sizes = [s for s in given if s <= value] if given is not None else default_graph_sizes(value)
    out.engine["cuda_graph_sizes"] = sizes  # narrows cudagraph_capture_sizes, as vLLM does


def _custom_ops(value: Any, shown: str, out: Translated) -> None:
    if not isinstance(value, list) or not all(isinstance(op, str) for op in value):
        raise NestedConfigError(f'{shown} must be a list of strings, e.g. ["all"] or ["none"]')
    ops = {op.strip().lower() for op in value}
    if not ops:
        return
    if ops == {"all"} or ops == {"none"}:
        out.set("engine", "custom_ops", ops == {"all"}, shown)
        return
    _refuse(shown, 'host turns the platform\'s fused kernels on or off together; use ["all"] or ["none"] '
                   "(the engine flags --custom-ops / --no-custom-ops)")


def _compile_backend(value: Any, shown: str, out: Translated) -> None:
    if value not in ("", "inductor"):
        _refuse(shown, 'host compiles with the platform\'s torch.compile backend, inductor; drop the key or use "inductor"')


def _full_cuda_graph(value: Any, shown: str, out: Translated) -> None:
    if not _bool(value, shown):
        out.notes.append(f"{shown} has no effect here: host's decode graphs always capture the whole decode step")


COMPILER_TUNING = "vLLM's own compiler and graph-capture tuning; host compiles the whole forward with torch.compile (dynamic shapes) and captures whole decode steps"

COMPILATION_KEYS: tuple[Key, ...] = (
    Key("mode", "0: no torch.compile; 1-3 (or STOCK_TORCH_COMPILE, DYNAMO_TRACE_ONCE, VLLM_COMPILE): --torch-compile", _mode),
    Key("level", "the old name of mode: the same", _mode),
    Key("cudagraph_mode", "NONE: no decode graphs; PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE: decode graphs (whole decode steps)", _cudagraph_mode),
    Key("use_cudagraph", "false: no decode graphs; true: decode graphs", _use_cudagraph),
    Key("full_cuda_graph", "true: what host does (whole decode steps); false: no effect", _full_cuda_graph),
    Key("cudagraph_capture_sizes", "--cuda-graph-sizes (an empty list: no decode graphs)", _capture_sizes),
    Key("max_cudagraph_capture_size", "the largest decode graph: host's ladder up to it, or the capture sizes up to it (0: no graphs)", _max_capture_size),
    Key("custom_ops", '["all"]: --custom-ops; ["none"]: --no-custom-ops; per-op lists refused', _custom_ops),
    Key("backend", '"" or "inductor": what host runs; other backends refused', _compile_backend),
    *(Key(name, COMPILER_TUNING) for name in (
        "pass_config", "splitting_ops", "compile_sizes", "compile_ranges_split_points", "inductor_compile_config",
        "inductor_passes", "use_inductor", "use_inductor_graph_partition", "compile_mm_encoder", "cudagraph_num_of_warmups",
        "cudagraph_copy_inputs", "cudagraph_specialize_lora", "dynamic_shapes_config",
    )),
    *(Key(name, "vLLM's compile cache and debug output; host keeps no compiled-graph cache of its own")
      for name in ("cache_dir", "debug_dump_path", "compile_cache_save_format", "local_cache_dir")),
)

# -- --structured-outputs-config ------------------------------------------------------------------

OTHER_BACKENDS = ("guidance", "outlines", "lm-format-enforcer")


def _so_backend(value: Any, shown: str, out: Translated) -> None:
    if value in ("auto", "xgrammar"):
        return
    reason = "host's structured outputs run on xgrammar, its one backend"
    if value not in OTHER_BACKENDS:
        reason = f"{json.dumps(value)} is not a vLLM backend either ({', '.join(('auto', 'xgrammar', *OTHER_BACKENDS))}); " + reason
    _refuse(shown, reason + '; use "xgrammar" or "auto"')


def _reasoning_parser(value: Any, shown: str, out: Translated) -> None:
    if not isinstance(value, str):
        raise NestedConfigError(f"{shown} must be a reasoning parser's name, e.g. deepseek_r1")
    if value:
        out.set("server", "reasoning_parser", value, shown)


def _reasoning_parser_plugin(value: Any, shown: str, out: Translated) -> None:
    if value:
        _refuse(shown, "host's reasoning parsers are installed plugins (entry point group host.reasoning_parsers), "
                       "chosen with --reasoning-parser")


def _disable_any_whitespace(value: Any, shown: str, out: Translated) -> None:
    if not _bool(value, shown):
        out.notes.append(f"{shown} has no effect here: host compiles JSON schemas without free whitespace "
                         "(small models otherwise emit whitespace until max_tokens)")


def _disable_fallback(value: Any, shown: str, out: Translated) -> None:
    if not _bool(value, shown):
        out.notes.append(f"{shown} has no effect here: host has one backend (xgrammar) and reports its errors, with no fallback")


def _disable_additional_properties(value: Any, shown: str, out: Translated) -> None:
    if _bool(value, shown):
        _refuse(shown, "it belongs to vLLM's guidance backend; host's xgrammar follows the schema's additionalProperties as written")


def _enable_in_reasoning(value: Any, shown: str, out: Translated) -> None:
    if _bool(value, shown):
        _refuse(shown, "host constrains the output from the reasoning parser's end tag on, never the reasoning itself; "
                       "drop the key, or drop --reasoning-parser to constrain the whole output")


STRUCTURED_OUTPUTS_KEYS: tuple[Key, ...] = (
    Key("backend", '"auto" or "xgrammar": host\'s backend; guidance, outlines, lm-format-enforcer refused', _so_backend),
    Key("reasoning_parser", "--reasoning-parser (host serve)", _reasoning_parser),
    Key("reasoning_parser_plugin", "refused: reasoning parsers are host.reasoning_parsers plugins", _reasoning_parser_plugin),
    Key("disable_any_whitespace", "true: what host does; false: no effect (host never adds free whitespace)", _disable_any_whitespace),
    Key("disable_fallback", "true: what host does; false: no effect (one backend, no fallback)", _disable_fallback),
    Key("disable_additional_properties", "false: what host does; true refused (vLLM's guidance backend only)", _disable_additional_properties),
    Key("enable_in_reasoning", "false: what host does; true refused (host constrains the output after the reasoning)", _enable_in_reasoning),
)

NESTED_CONFIGS: dict[str, tuple[Key, ...]] = {
    "--compilation-config": COMPILATION_KEYS,
    "--structured-outputs-config": STRUCTURED_OUTPUTS_KEYS,
}
"""The vLLM configs host translates into its own flags, key by key."""


def translate(option: str, config: dict[str, Any]) -> Translated:
    """``config`` (the folded JSON object of ``option``, one of :data:`NESTED_CONFIGS`) in host's
    terms; a refused or unknown key is a :class:`NestedConfigError`."""
    keys = NESTED_CONFIGS[option]
    names = [k.name for k in keys]
    for name, value in config.items():
        if name not in names:
            raise NestedConfigError(
                f"{_shown(option, name, value)} is not supported: {option} has no key {name!r} in vLLM or host; "
                f"the keys are {', '.join(names)} (docs/openai_api.md)"
            )
    out = Translated()
    for key in keys:  # the table's order: cudagraph_capture_sizes before max_cudagraph_capture_size
        if key.name not in config:
            continue
        value = config[key.name]
        shown = _shown(option, key.name, value)
        if key.apply is None:
            out.notes.append(f"{shown} has no effect here: {key.meaning}")
        else:
            key.apply(value, shown, out)
    return out


# -- host's own JSON-object flags: the keys they read ------------------------------------------------

VLLM_ONLY_KEYS: dict[str, dict[str, str]] = {
    "--speculative-config": {
        "draft_tensor_parallel_size": "the draft runs in the target's workers, with the target's parallelism",
        "quantization": "the draft model is read as its checkpoint says",
        "max_model_len": "the draft runs with the target's --max-model-len",
        "revision": "the draft is a local directory (model)",
        "code_revision": "host runs no code from a model folder",
        "speculative_token_tree": "host drafts one chain of tokens",
        "disable_padded_drafter_batch": "host's proposers batch the drafts themselves",
    },
    "--kv-transfer-config": {
        "kv_buffer_device": "the connector chooses its buffers (kv_connector_extra_config)",
        "kv_buffer_size": "the connector chooses its buffers (kv_connector_extra_config)",
        "kv_rank": "peers are named by engine_id",
        "kv_parallel_size": "peers are named by engine_id",
        "kv_ip": "give the connector's address in kv_connector_extra_config",
        "kv_port": "give the connector's ports in kv_connector_extra_config (or let it derive them from --port)",
        "kv_connector_module_path": "KV connectors are installed plugins (entry point group host.kv_connectors)",
    },
    "--pooler-config": {
        "dimensions": "send dimensions on the request",
        "enable_chunked_processing": "a prompt is pooled in one step, up to --max-model-len",
        "max_embed_len": "a prompt is pooled in one step, up to --max-model-len",
        "softmax": "host's pooling models return embeddings, not classifier scores",
        "activation": "host's pooling models return embeddings, not classifier scores",
        "use_activation": "host's pooling models return embeddings, not classifier scores",
        "logit_bias": "host's pooling models return embeddings, not classifier scores",
        "step_tag_id": "host has no step reward models",
        "returned_token_ids": "host has no step reward models",
    },
}
"""Keys of vLLM's versions of host's JSON-object flags that host does not read, with the reason."""


def _own_keys() -> dict[str, tuple[str, ...]]:
    from host.core.config import KVTransferConfig, SpeculativeConfig

    return {
        "--speculative-config": tuple(f.name for f in dataclasses.fields(SpeculativeConfig)),
        "--kv-transfer-config": tuple(f.name for f in dataclasses.fields(KVTransferConfig)),
        "--pooler-config": ("pooling_type", "normalize"),
        "--quantization-config": ("ignore", "targets"),
    }


def check_config_keys(option: str, value: dict[str, Any]) -> None:
    """Refuse (:class:`NestedConfigError`) a key of host's JSON-object flag ``option`` that its
    config does not read, naming the key, the reason and the keys it reads."""
    known = _own_keys().get(option)
    if known is None:
        return
    for name, item in value.items():
        if name in known:
            continue
        reason = VLLM_ONLY_KEYS.get(option, {}).get(name, f"{option} has no key {name!r}")
        raise NestedConfigError(f"{_shown(option, name, item)} is not supported: {reason}; the keys host reads are {', '.join(known)}")


def nested_config_table() -> list[tuple[str, str, str]]:
    """``(flag, status, what host does)`` rows for the docs: one per translated key, one per host JSON flag."""
    rows = []
    for option, keys in NESTED_CONFIGS.items():
        for key in keys:
            status = "accepted, no effect" if key.apply is None else "translated"
            rows.append((f"{option}.{key.name}", status, key.meaning))
    for option, known in _own_keys().items():
        lacking = VLLM_ONLY_KEYS.get(option, {})
        text = f"host's own flag (engine flag, docs/engine.md): keys {', '.join(known)}"
        if lacking:
            text += f"; refused with the reason: {', '.join(lacking)}"
        rows.append((f"{option}.KEY", "implemented", text))
    return rows


# -- the options -----------------------------------------------------------------------------------


def with_nested_configs(*options: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a typer command the options ``options`` (of :data:`NESTED_CONFIGS`), each a JSON
    object (the dotted forms are folded into it by :mod:`.nested_args`); the command receives one
    :class:`Translated`, ``nested_configs``, of those given (a refusal is a usage error)."""
    import inspect
    from typing import Optional

    import typer

    from host.core.entrypoints.cli.flag_groups import add_flag_group

    params = []
    for option in options:
        keys = ", ".join(k.name for k in NESTED_CONFIGS[option] if k.apply is not None)
        help_text = (f"vLLM's {option[2:]} as JSON, or one key at a time ({option}.KEY VALUE); host reads {keys} "
                     "and refuses the keys it lacks with the reason (docs/openai_api.md).")
        opt = typer.Option(None, option, help=help_text, metavar="JSON", show_default=False, rich_help_panel=PANEL)
        params.append(inspect.Parameter(option[2:].replace("-", "_"), inspect.Parameter.KEYWORD_ONLY, default=opt,
                                        annotation=Optional[str]))

    def convert(**values: Any) -> Translated:
        out = Translated()
        for option in options:
            text = values[option[2:].replace("-", "_")]
            if text is None:
                continue
            try:
                config = json.loads(text)
                if not isinstance(config, dict):
                    raise NestedConfigError(f"{option} {text!r} must be a JSON object")
                part = translate(option, config)
            except json.JSONDecodeError as exc:
                raise typer.BadParameter(f"{text!r} is not JSON ({exc})", param_hint=option) from None
            except NestedConfigError as exc:
                raise typer.BadParameter(str(exc), param_hint=option) from None
            out.engine.update(part.engine)
            out.server.update(part.server)
            out.notes.extend(part.notes)
        return out

    return lambda func: add_flag_group(func, "nested_configs", params, convert)


PANEL = "vLLM nested configs"


def merge_flags(given: dict[str, Any], translated: dict[str, Any], flag_of: Callable[[str], str]) -> dict[str, Any]:
    """``given`` (flags from the command line, ``None`` for one not given) with the ``translated``
    values added; a value the command line gives differently is a ``ValueError`` naming both."""
    merged = dict(given)
    for name, value in translated.items():
        if merged.get(name) is not None and merged[name] != value:
            raise ValueError(
                f"{flag_of(name)} {merged[name]!r} contradicts a vLLM nested config key asking for {name}={value!r}; pass one of them"
            )
        merged[name] = value
    return merged


def log_nested_notes(translated: Translated, logger: Any) -> None:
    """One warning per key accepted without effect."""
    for note in translated.notes:
        logger.warning("%s", note)
