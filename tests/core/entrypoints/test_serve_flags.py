"""A vLLM launch script's flags on ``host serve``, parsed by the real command without starting a
server (``run_server`` records what it would start): implemented, accepted with one line saying
why it has no effect, or refused naming the reason. Plus the served model's name and the dtype
fallback, through the engine config the server would build."""

from __future__ import annotations

import logging
import os

import pytest
from typer.testing import CliRunner

from host.core.engine_args import EngineArgs
from host.core.entrypoints.api_server import ServerSettings, served_model_names
from host.core.entrypoints.cli import serve_cmd as serve_module
from host.core.entrypoints.cli.main import app
from host.core.entrypoints.cli.vllm_flags import VLLM_FLAGS
from host.core.models.default_model import DEFAULT_MODEL_ID, served_name

# flags a vLLM launch script passes that host implements itself (engine flags or serve's own)
IMPLEMENTED = [
    "--seed", "7", "--max-logprobs", "5", "--enable-chunked-prefill", "--dtype", "half", "--max-model-len", "512",
    "--gpu-memory-utilization", "0.8", "--max-num-seqs", "16", "--max-num-batched-tokens", "1024", "--enforce-eager",
    "--tokenizer", "tok", "--block-size", "16", "--enable-prefix-caching", "--load-format", "auto",
    "--host", "0.0.0.0", "--port", "8001", "--api-key", "k", "--served-model-name", "a", "--served-model-name", "b",
    "--disable-log-stats", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_r1",
    "--enable-prompt-tokens-details", "--enable-tokenizer-info-endpoint", "--enable-server-load-tracking",
    "--chat-template", "{{ messages[0]['content'] }}", "--trust-request-chat-template", "--max-queued-requests", "8",
    "--uvicorn-log-level", "WARNING", "--disable-uvicorn-access-log", "--root-path", "/llm", "--disable-fastapi-docs",
    "--ssl-keyfile", "key.pem", "--ssl-certfile", "cert.pem", "--kv-cache-dtype", "fp8",
    "--download-dir", "/tmp/x", "--revision", "main", "--tokenizer-revision", "v1",
]
# accepted without effect: each logs one line
NO_EFFECT = [
    "--trust-remote-code", "--disable-frontend-multiprocessing", "--disable-log-requests",
    "--swap-space", "4", "--max-seq-len-to-capture", "8192",
]


@pytest.fixture
def serve(monkeypatch):
    """``host serve ARGS`` up to the point where the server would start: the result and what
    ``run_server`` got (``model``, ``settings``: the ServerSettings, ``engine_kwargs``)."""
    calls: list[dict] = []
    monkeypatch.setattr(serve_module, "run_server", lambda model, settings, **kw: calls.append({"model": model, "settings": settings, **kw}))

    def invoke(*args: str):
        result = CliRunner().invoke(app, ["serve", *args])
        return result, (calls[-1] if calls else None)

    return invoke


def test_a_vllm_launch_scripts_flags_are_accepted(serve, caplog):
    with caplog.at_level(logging.WARNING, logger="host.serve"):
        result, call = serve("HuggingFaceTB/SmolLM2-135M-Instruct", *IMPLEMENTED, *NO_EFFECT)
    assert result.exit_code == 0, result.output
    assert call["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    engine = call["engine_kwargs"]
    assert engine["seed"] == 7 and engine["max_logprobs"] == 5 and engine["dtype"] == "half"
    assert engine["download_dir"] == "/tmp/x" and engine["revision"] == "main" and engine["tokenizer_revision"] == "v1"
    assert engine["enable_chunked_prefill"] is True and engine["enforce_eager"] is True and engine["max_num_seqs"] == 16
    assert engine["kv_cache_dtype"] == "fp8"
    api = call["settings"]
    assert api.chat_template == "{{ messages[0]['content'] }}"
    assert api.enable_tokenizer_info_endpoint and api.enable_server_load_tracking and api.enable_prompt_tokens_details
    assert api.served_model_names == ["a", "b"] and api.max_queued_requests == 8
    assert api.disable_fastapi_docs is True
    assert api.uvicorn_options == {"log_level": "warning", "access_log": False, "root_path": "/llm",
                                       "ssl_keyfile": "key.pem", "ssl_certfile": "cert.pem"}
    # ONE line per flag without effect, naming the flag and why
    lines = [r.getMessage() for r in caplog.records if r.name == "host.serve"]
    assert len(lines) == len([a for a in NO_EFFECT if a.startswith("--")]) == 5, lines
    assert any(line.startswith("--trust-remote-code has no effect here: host runs only installed architectures") for line in lines)
    assert any(line.startswith("--swap-space 4 has no effect here: host never swaps KV blocks") for line in lines)
    assert all(" has no effect here: " in line for line in lines)


def test_values_host_runs_with_anyway_start_without_a_line(serve, caplog):
    with caplog.at_level(logging.WARNING, logger="host.serve"):
        result, call = serve("--tensor-parallel-size", "1", "--kv-cache-dtype", "auto", "--tokenizer-mode", "auto")
    assert result.exit_code == 0, result.output
    assert [r for r in caplog.records if r.name == "host.serve"] == []


@pytest.mark.parametrize("args, reason", [
    (["--worker-use-ray"], "--distributed-executor-backend ray"),
    (["--limit-mm-per-prompt", "image=1"], "text-only"),
    (["--tool-parser-plugin", "my_parser.py"], "host.tool_parsers"),
])
def test_flags_host_cannot_honour_are_refused_with_the_reason(serve, args, reason):
    result, call = serve(*args)
    assert result.exit_code == 2 and call is None
    text = " ".join(result.output.split())
    assert f"{' '.join(args)} is not supported" in text and reason in text, result.output


def test_an_unknown_kv_cache_dtype_is_refused_naming_the_choices(serve):
    result, call = serve("--kv-cache-dtype", "fp8_e5m2")
    assert result.exit_code == 2 and call is None
    text = " ".join(result.output.split())
    assert "fp8_e5m2" in text and "fp8_e4m3" in text, result.output


def test_https_needs_both_the_key_and_the_certificate(serve):
    result, call = serve("--ssl-keyfile", "key.pem")
    assert result.exit_code == 2 and call is None
    assert "HTTPS needs both --ssl-keyfile and --ssl-certfile; add --ssl-certfile" in result.output


def test_disable_fastapi_docs_removes_the_api_description(plugin_host, tiny_checkpoint):
    from starlette.testclient import TestClient

    from host.core.entrypoints.api_server import build_app

    config = EngineArgs(model=str(tiny_checkpoint("llama")), skip_tokenizer_init=True, max_model_len=64).create_engine_config()
    for off in (False, True):
        client = TestClient(build_app(config, ServerSettings(disable_fastapi_docs=off), plugin_host, start_engine=False))
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert client.get(path).status_code == (404 if off else 200), (path, off)


def test_help_lists_every_vllm_flag():
    result = CliRunner().invoke(app, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for spec in VLLM_FLAGS:
        assert spec.name in result.output, spec.name
    for name in ("--chat-template", "--enable-tokenizer-info-endpoint", "--enable-server-load-tracking", "--seed", "--max-logprobs"):
        assert name in result.output


def test_chat_template_is_a_file_or_the_template_text(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert serve_module.read_chat_template(str(path)) == path.read_text()
    assert serve_module.read_chat_template("{{ 1 }}") == "{{ 1 }}"
    with pytest.raises(ValueError, match="'missing.jinja' is neither a file nor a Jinja template"):
        serve_module.read_chat_template("missing.jinja")


# -- the served model's name --------------------------------------------------------------------


def test_the_served_name_is_what_the_user_typed():
    assert served_name(None) == DEFAULT_MODEL_ID == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert served_name("default") == DEFAULT_MODEL_ID
    assert served_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert served_name("./models/llama") == "./models/llama"


def test_a_local_folder_is_served_under_the_relative_path_typed(tiny_checkpoint, monkeypatch):
    path = tiny_checkpoint("llama")
    monkeypatch.chdir(path.parent)
    typed = os.path.join(".", path.name)
    config = EngineArgs(model=typed, skip_tokenizer_init=True, max_model_len=64).create_engine_config()
    assert config.model.model == str(path)  # the engine loads the absolute path ...
    assert served_model_names(config, ServerSettings()) == [typed]  # ... clients see what was typed
    assert served_model_names(config, ServerSettings(served_model_names=["x", "y", "x"])) == ["x", "y"]


def test_float16_on_the_cpu_runs_in_bfloat16_with_a_warning(tiny_checkpoint, caplog):
    path = str(tiny_checkpoint("llama"))
    with caplog.at_level(logging.WARNING, logger="host.engine"):
        config = EngineArgs(model=path, dtype="half", skip_tokenizer_init=True, max_model_len=64).create_engine_config()
    assert config.model.dtype == "bfloat16"
    assert any("dtype float16 is not supported on the cpu platform" in r.getMessage() and "running in bfloat16" in r.getMessage()
               for r in caplog.records)
    assert EngineArgs(model=path, dtype="float", max_model_len=64).create_engine_config().model.dtype == "float32"


def test_seed_makes_unseeded_requests_reproducible_across_restarts(tiny_checkpoint):
    """``--seed``: a request without its own seed samples the same tokens after a restart with the
    same engine seed, other tokens with another seed (vLLM's engine seed)."""
    from host import LLM, SamplingParams

    path = str(tiny_checkpoint("llama"))
    params = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)

    def sample(seed: int) -> list[int]:
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, seed=seed)
        return llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], params)[0].outputs[0].token_ids

    first = sample(1234)
    assert sample(1234) == first
    assert sample(4321) != first


def test_cors_flags_send_cors_headers_also_before_the_api_key(serve, plugin_host, tiny_checkpoint):
    from starlette.testclient import TestClient

    from host.core.entrypoints.api_server import build_app

    result, call = serve("--allowed-origins", '["https://app.example"]', "--allowed-methods", "GET,POST")
    assert result.exit_code == 0, result.output
    cors = call["settings"].cors
    assert cors == {"allow_origins": ["https://app.example"], "allow_methods": ["GET", "POST"], "allow_headers": ["*"],
                    "allow_credentials": False}
    result, _ = serve("--allowed-origins", "[1]")
    assert result.exit_code == 2 and "is not a JSON list of strings" in result.output

    config = EngineArgs(model=str(tiny_checkpoint("llama")), skip_tokenizer_init=True, max_model_len=64).create_engine_config()
    client = TestClient(build_app(config, ServerSettings(api_key="k", cors=cors), plugin_host, start_engine=False))
    preflight = client.options("/v1/models", headers={"Origin": "https://app.example", "Access-Control-Request-Method": "GET"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "https://app.example"
    refused = client.get("/v1/models", headers={"Origin": "https://app.example"})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "https://app.example"
    assert "access-control-allow-origin" not in client.get("/v1/models", headers={"Origin": "https://evil.example"}).headers
    plain = TestClient(build_app(config, ServerSettings(api_key="k"), plugin_host, start_engine=False))
    assert "access-control-allow-origin" not in plain.get("/v1/models", headers={"Origin": "https://app.example"}).headers


def test_the_model_as_vllms_model_flag(serve):
    result, call = serve("--model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--port", "8001")
    assert result.exit_code == 0, result.output
    assert call["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    result, _ = serve("a-model", "--model", "another-model")
    assert result.exit_code == 2 and "given twice" in result.output
