"""Engine flags declared once: ``EngineArgs`` fields carry their help, the commands build their
options from them, the docs' table is generated from them, and the two flags that choose a
registered plugin (``--attention-backend``, ``--distributed-executor-backend``) reach the engine."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from host import LLM, SamplingParams
from host.core.engine_args import EngineArgs
from host.core.entrypoints.cli.engine_flags import engine_fields, engine_flag_kwargs, flag_name, flag_table, with_engine_flags
from host.core.entrypoints.cli.main import app

REPO = Path(__file__).resolve().parents[2]


def command_options(name: str) -> set[str]:
    """Every option spelling of ``host NAME`` (``--x`` and ``--no-x`` alike)."""
    command = typer.main.get_command(app).commands[name]
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def test_every_field_has_help_and_a_consistent_flag():
    for field in dataclasses.fields(EngineArgs):
        assert field.metadata["help"], field.name
        assert not field.metadata["help"].endswith("."), field.name  # the CLI adds the period
        if field.metadata["choices"]:
            assert field.default in field.metadata["choices"], field.name
    names = {flag_name(f) for f in engine_fields()}
    assert {"--attention-backend", "--distributed-executor-backend", "--max-num-seqs", "--kv-cache-memory"} <= names
    assert "--cuda-graphs" not in names and "--skip-tokenizer-init" not in names  # keyword-only fields


@pytest.mark.parametrize("command, exclude", [("generate", set()), ("chat", set()), ("serve", {"model"})])
def test_commands_take_every_engine_flag(command, exclude):
    options = command_options(command)
    for field in engine_fields(exclude):
        assert flag_name(field) in options, (command, field.name)
        if field.metadata["short"]:
            assert field.metadata["short"] in options
    assert {"--plugins", "--block-plugins", "--strict-plugins", "--platform"} <= options
    if command == "serve":
        assert "-m" not in options  # `host serve MODEL`: the model is the argument (--model is vLLM's spelling of it)


def test_docs_table_is_generated_from_the_fields():
    text = (REPO / "docs" / "engine.md").read_text()
    start = text.index("| keyword | flag | default | meaning |")
    documented = text[start : text.index("\n\n", start) + 1]
    keywords = re.findall(r"^\| `(\w+)` \|", documented, flags=re.M)
    fields = [f.name for f in dataclasses.fields(EngineArgs)]
    assert sorted(set(fields) - set(keywords)) == [], "fields missing from docs/engine.md"
    assert sorted(set(keywords) - set(fields)) == [], "docs/engine.md documents keywords EngineArgs lacks"
    assert documented == flag_table(), "regenerate the table: python -m host.core.entrypoints.cli.engine_flags"


def _all_options() -> set[str]:
    """Every option of every ``host`` command and sub-command."""
    found: set[str] = set()
    stack = [typer.main.get_command(app)]
    while stack:
        command = stack.pop()
        stack.extend(getattr(command, "commands", {}).values())
        found |= {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    return found


OTHER_PROGRAMS = {"--continuous-batching"}  # `transformers serve`'s flag, in the peer benchmark


@pytest.mark.parametrize("doc", ["README.md", "docs/engine.md", "docs/serving.md"])
def test_documented_flags_exist(doc):
    text = (REPO / doc).read_text()
    mentioned = {m.replace("[no-]", "") for m in re.findall(r"(?<![\w-])--(?:\[no-\])?[a-z][a-z-]*[a-z]", text)}
    missing = sorted(mentioned - _all_options() - OTHER_PROGRAMS)
    assert missing == [], f"{doc} names flags no host command has"


@with_engine_flags()
def _record(*, engine_kwargs: dict) -> None:
    typer.echo(json.dumps(engine_kwargs))


def _parse(*args: str):
    probe = typer.Typer()
    probe.command()(_record)
    return CliRunner().invoke(probe, list(args))


def test_options_become_engine_args_keywords():
    assert json.loads(_parse().output) == {}  # nothing given: the engine's defaults
    result = _parse(
        "-O3", "--max-num-seqs", "8", "--no-custom-ops", "--enforce-eager", "--kv-cache-memory", "1GiB",
        "--cuda-graph-sizes", "none", "--dtype", "bfloat16", "--attention-backend", "cpu_paged",
        "--distributed-executor-backend", "uniproc", "--no-enable-chunked-prefill", "-m", "some/dir",
    )
    assert result.exit_code == 0, result.output
    kwargs = json.loads(result.output)
    assert kwargs == {
        "optimization_level": 3, "max_num_seqs": 8, "custom_ops": False, "enforce_eager": True,
        "kv_cache_memory": 2**30, "cuda_graphs": False, "dtype": "bfloat16", "attention_backend": "cpu_paged",
        "distributed_executor_backend": "uniproc", "enable_chunked_prefill": False, "model": "some/dir",
    }
    assert EngineArgs.from_kwargs(**kwargs).cuda_graphs is False


def test_bad_values_are_usage_errors_naming_the_flag():
    result = _parse("--dtype", "float64")
    assert result.exit_code == 2 and "float64" in result.output
    result = _parse("--kv-cache-memory", "lots")
    assert result.exit_code == 2 and "2GiB" in result.output
    result = _parse("--scheduling-policy", "lifo")
    assert result.exit_code == 2 and "lifo" in result.output


def test_engine_flag_kwargs_names_an_unknown_flag():
    with pytest.raises(ValueError, match="'max_seqs' is not an engine flag.*max_num_seqs"):
        engine_flag_kwargs(max_seqs=4)


def greedy(llm: LLM) -> list[int]:
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    return llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], params)[0].outputs[0].token_ids


def test_attention_backend_selects_a_registered_backend_by_name(plugin_host, tiny_checkpoint):
    path = str(tiny_checkpoint("llama"))
    expected = greedy(LLM(path, skip_tokenizer_init=True, max_model_len=64))
    for name in ("cpu_paged", "torch_paged"):  # the two registered backends that run on the CPU
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, attention_backend=name)
        assert llm.engine.executor.worker.model_runner.attn_backend.name == name
        assert greedy(llm) == expected, name


def test_forced_attention_backend_names_the_failed_capability(plugin_host, tiny_checkpoint, monkeypatch):
    # under the Triton interpreter (set by the Triton tests' modules) triton_paged would fit the CPU
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    path = str(tiny_checkpoint("llama"))
    with pytest.raises(ValueError, match=r"'triton_paged' cannot run this model: triton_paged: device type 'cpu'.*"
                                         r"backends that fit: cpu_paged, torch_paged.*registered: .*cpu_paged"):
        LLM(path, skip_tokenizer_init=True, max_model_len=64, attention_backend="triton_paged")
    with pytest.raises(ValueError, match="'flash' is not registered; registered backends: .*cpu_paged"):
        LLM(path, skip_tokenizer_init=True, max_model_len=64, attention_backend="flash")


def test_unknown_executor_lists_the_registered_ones(plugin_host, tiny_checkpoint):
    path = str(tiny_checkpoint("llama"))
    with pytest.raises(ValueError, match="distributed_executor_backend='nosuch' is not registered; registered executors: .*uniproc"):
        LLM(path, skip_tokenizer_init=True, max_model_len=64, distributed_executor_backend="nosuch")
