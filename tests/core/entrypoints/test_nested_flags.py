"""vLLM's nested config flags on ``host serve`` / ``host generate``, in their JSON, dotted and
``-O`` forms: each parsed by the real command up to where the server would start (``run_server``
records what it got), translated into host's engine and server flags, logged when it has no
effect, refused (exit 2) naming the key and the reason. Plus one real start of vLLM's
tool-calling test server line."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from typer.testing import CliRunner

from helpers import run_server
from host.core.entrypoints.cli import serve_cmd as serve_module
from host.core.entrypoints.cli.main import app
from host.core.entrypoints.cli.nested_args import NestedArgsError, rewrite_nested_args
from host.core.entrypoints.cli.nested_configs import COMPILER_TUNING


@pytest.fixture
def serve(monkeypatch):
    """``host serve ARGS`` up to the server start: ``(result, engine_kwargs, settings)``."""
    calls: list[dict] = []
    monkeypatch.setattr(serve_module, "run_server", lambda model, settings, **kw: calls.append({"settings": settings, **kw}))

    def invoke(*args: str):
        result = CliRunner().invoke(app, ["serve", *args])
        call = calls[-1] if calls else None
        return result, (call["engine_kwargs"] if call else None), (call["settings"] if call else None)

    return invoke


def _refused(result, *words: str) -> None:
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in text, (word, result.output)


@pytest.mark.parametrize("args, engine", [
    # compilation config: the JSON form, the dotted form, -O.KEY, and the two merged
    (["--compilation-config", '{"mode": 3}'], {"torch_compile": True}),
    (["--compilation-config", '{"level": 0}'], {"torch_compile": False}),
    (["--compilation-config.mode", "VLLM_COMPILE"], {"torch_compile": True}),
    (["--compilation-config.cudagraph_capture_sizes", "[1,2,4]"], {"cuda_graph_sizes": [1, 2, 4]}),
    (["--compilation-config.cudagraph_capture_sizes", "[]"], {"cuda_graphs": False}),
    (["-O.cudagraph_mode=FULL_DECODE_ONLY"], {"cuda_graphs": True}),
    (["-O.cudagraph_mode", "NONE"], {"cuda_graphs": False}),
    (["-O.max_cudagraph_capture_size=16"], {"cuda_graph_sizes": [1, 2, 4, 8, 16]}),
    (["--compilation-config", '{"mode": 3, "cudagraph_capture_sizes": [1, 2, 4, 8]}', "-O.max_cudagraph_capture_size=4"],
     {"torch_compile": True, "cuda_graph_sizes": [1, 2, 4]}),
    (["--compilation-config", '{"custom_ops": ["none"]}'], {"custom_ops": False}),
    (["--compilation-config.custom_ops+", "all"], {"custom_ops": True}),
    (["-O", '{"cudagraph_mode": "PIECEWISE", "backend": "inductor"}'], {"cuda_graphs": True}),
    (["--compilation_config.mode=0"], {"torch_compile": False}),  # vLLM's underscore spelling
    # -O as the optimization level
    (["-O3"], {"optimization_level": 3}),
    (["-O", "3"], {"optimization_level": 3}),
    (["-O=1"], {"optimization_level": 1}),
    # host's own JSON flags, dotted
    (["--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens", "4"],
     {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}),
    (["--speculative-config", '{"method": "ngram"}', "--speculative-config.prompt_lookup_max=3"],
     {"speculative_config": {"method": "ngram", "prompt_lookup_max": 3}}),
    (["--kv-transfer-config.kv_connector", "p2p", "--kv-transfer-config.kv_role", "kv_consumer"],
     {"kv_transfer_config": {"http_port": 8000, "kv_connector": "p2p", "kv_role": "kv_consumer"}}),
    (["--pooler-config.pooling_type", "MEAN", "--pooler-config.normalize", "false"],
     {"pooler_config": {"pooling_type": "MEAN", "normalize": False}}),
    (["--max_model_len", "512", "--enable_chunked_prefill"], {"max_model_len": 512, "enable_chunked_prefill": True}),
])
def test_each_form_becomes_host_engine_flags(serve, args, engine):
    result, kwargs, _ = serve(*args)
    assert result.exit_code == 0, result.output
    assert kwargs == engine


def test_structured_outputs_config_becomes_server_settings(serve, caplog):
    result, kwargs, settings = serve("--structured-outputs-config.backend", "xgrammar", "--enable-auto-tool-choice",
                                     "--tool-call-parser", "hermes")
    assert result.exit_code == 0, result.output
    assert kwargs == {} and settings.enable_auto_tool_choice and settings.tool_call_parser == "hermes"
    result, _, settings = serve("--structured-outputs-config", '{"backend": "auto", "disable_any_whitespace": true}',
                                "--structured-outputs-config.reasoning_parser", "deepseek_r1")
    assert result.exit_code == 0, result.output
    assert settings.reasoning_parser == "deepseek_r1"


def test_keys_without_effect_log_one_line_each(serve, caplog):
    with caplog.at_level(logging.WARNING, logger="host.serve"):
        result, kwargs, _ = serve("-O.cache_dir=/tmp/c", "--compilation-config.pass_config.fuse_norm_quant", "true",
                                  "--structured-outputs-config.disable_fallback", "false")
    assert result.exit_code == 0, result.output
    assert kwargs == {}
    lines = [r.getMessage() for r in caplog.records if r.name == "host.serve"]
    assert lines == [
        '--compilation-config.pass_config={"fuse_norm_quant": true} has no effect here: ' + COMPILER_TUNING,
        '--compilation-config.cache_dir="/tmp/c" has no effect here: '
        "vLLM's compile cache and debug output; host keeps no compiled-graph cache of its own",
        "--structured-outputs-config.disable_fallback=false has no effect here: "
        "host has one backend (xgrammar) and reports its errors, with no fallback",
    ]


def serve_module_tuning() -> str:
    from host.core.entrypoints.cli.nested_configs import _TUNING

    return _TUNING


@pytest.mark.parametrize("args, words", [
    (["--structured-outputs-config.backend", "guidance"], ['backend="guidance" is not supported', "xgrammar, its one backend"]),
    (["--structured-outputs-config", '{"backend": "outlines"}'], ['backend="outlines" is not supported', 'use "xgrammar" or "auto"']),
    (["--guided-decoding-backend", "lm-format-enforcer"], ["--guided-decoding-backend lm-format-enforcer is not supported", "xgrammar"]),
    (["--structured-outputs-config.enable_in_reasoning=true"], ["enable_in_reasoning=true is not supported", "end tag"]),
    (["--structured-outputs-config.reasoning_parser_plugin", "p.py"], ["reasoning_parser_plugin", "host.reasoning_parsers"]),
    (["--structured-outputs-config.no_such", "1"], ["no_such=1 is not supported", "has no key 'no_such'", "backend, reasoning_parser"]),
    (["--compilation-config.custom_ops", '["+rms_norm"]'], ['custom_ops=["+rms_norm"] is not supported', '["all"] or ["none"]']),
    (["-O.backend=eager"], ['backend="eager" is not supported', "inductor"]),
    (["-O.cudagraph_mode", "SOMETIMES"], ["not a cudagraph mode", "FULL_DECODE_ONLY"]),
    (["--compilation-config", '{"mode": 7}'], ["mode=7 is not a compilation mode", "0-3"]),
    (["--compilation-config", '{"mode": 3, "level": 0}'], ["contradicts"]),
    (["--compilation-config.mode", "3", "--no-torch-compile"], ["--torch-compile False contradicts", "torch_compile=True"]),
    (["--speculative-config.draft_tensor_parallel_size", "2"], ["draft_tensor_parallel_size=2 is not supported",
                                                                "the target's parallelism", "num_speculative_tokens"]),
    (["--kv-transfer-config.kv_ip", "1.2.3.4"], ['kv_ip="1.2.3.4" is not supported', "kv_connector_extra_config"]),
    (["--pooler-config.dimensions", "64"], ["dimensions=64 is not supported", "on the request", "pooling_type, normalize"]),
    (["--pooler-config.bogus", "1"], ["bogus=1 is not supported", "has no key 'bogus'"]),
    (["--compilation-config", "[1]"], ["must be a JSON object"]),
    (["--compilation-config", "{bad", "--compilation-config.mode", "3"], ["is not JSON"]),
    (["--compilation-config.mode"], ["--compilation-config.mode needs a value"]),
])
def test_keys_host_lacks_are_refused_with_the_reason(serve, args, words):
    result, kwargs, _ = serve(*args)
    assert kwargs is None
    _refused(result, *words)


def test_generate_takes_the_compilation_config(monkeypatch):
    got: list[dict] = []

    class Recorder:
        def __init__(self, **kwargs):
            got.append(kwargs)
            raise ValueError("recorded")

    import host

    monkeypatch.setattr(host, "LLM", Recorder)
    result = CliRunner().invoke(app, ["generate", "hi", "-O.cudagraph_mode=NONE", "--compilation-config.mode", "3",
                                      "--speculative-config.method", "ngram"])
    assert result.exit_code == 2 and "recorded" in result.output
    engine = {k: v for k, v in got[-1].items() if v is not None}  # the plugin flags not given are None
    assert engine == {"cuda_graphs": False, "torch_compile": True, "speculative_config": {"method": "ngram"}}
    result = CliRunner().invoke(app, ["generate", "hi", "--structured-outputs-config.backend", "xgrammar"])
    _refused(result, "No such option")  # structured outputs are a server's


def test_the_rewrite_leaves_option_values_alone():
    options = {"--chat-template": True, "--compilation-config": True, "-O": True, "--enforce-eager": False}
    args = ["--chat-template", "-O.mode=3", "--enforce-eager", "m", "--", "--compilation-config.mode", "1"]
    assert rewrite_nested_args(args, options) == args  # a value, a switch, a positional, and all after --
    assert rewrite_nested_args(["-O.mode=3", "x", "-O.cudagraph_mode", "NONE"], options) == [
        "--compilation-config", json.dumps({"mode": 3, "cudagraph_mode": "NONE"}), "x"]
    assert rewrite_nested_args(["--compilation-config.pass_config.a", "1", "--compilation-config.pass_config.b=x"], options) == [
        "--compilation-config", json.dumps({"pass_config": {"a": 1, "b": "x"}})]
    # a command without the config keeps the dotted option, for click to call it unknown
    assert rewrite_nested_args(["--speculative-config.method", "ngram"], options) == ["--speculative-config.method", "ngram"]
    with pytest.raises(NestedArgsError, match="empty key"):
        rewrite_nested_args(["--compilation-config..x", "1"], options)


def test_vllm_tool_calling_test_server_line_starts(tmp_path):
    """vLLM's tool-calling test server line, flags as vLLM's tests pass them, on the default model."""
    args = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--structured-outputs-config.backend", "xgrammar"]
    with run_server(tmp_path, args) as server:
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert "No such option" not in server.log()


def test_docs_flag_table_is_generated_from_the_code():
    """docs/openai_api.md's launch-flag table lists every engine and server flag, the nested
    configs' keys and VLLM_FLAGS, as the generator prints them (so the docs cannot call a flag
    refused that the code implements)."""
    from pathlib import Path

    from host.core.entrypoints.cli.vllm_flag_table import HEADER, vllm_flag_table

    text = (Path(__file__).resolve().parents[3] / "docs" / "openai_api.md").read_text()
    start = text.index(HEADER)
    end = text.find("\n\n", start)
    documented = text[start:] if end < 0 else text[start : end + 1]
    assert documented == vllm_flag_table(), "regenerate the table: python -m host.core.entrypoints.cli.vllm_flag_table"
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size"):
        row = next(line for line in documented.splitlines() if f"`{flag}`" in line)
        assert "| implemented" in row, row
