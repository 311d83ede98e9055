"""Shared test set-up: real pip installs of the fixture plugin packages under tests/fixtures/, and
the one factory of tiny random model checkpoints."""

from __future__ import annotations

import os

# the tests never reach the Hugging Face Hub: a Hub id resolves from a cache a test lays out, or fails
os.environ["HF_HUB_OFFLINE"] = "1"

import json  # noqa: E402
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import helpers`

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
FIXTURE_PACKAGES = ("recorder", "accel_a", "accel_b", "endpoint", "broken", "wronggroup", "statsink", "toolparser", "quantint4", "kvflaky", "ioupper",
                    "olmo2")

pytest_plugins = ["host.sdk.testing"]


@pytest.fixture(scope="session")
def hello_server(tmp_path_factory: pytest.TempPathFactory, fixture_sites: dict[str, str]):
    """``host serve --plugins fixture_hello`` with the fixture endpoint plugin installed: one server
    for the session's tests of a third-party route (the lifecycle and the security tests) and
    the session's default-flag server (openai_server, lm_eval). Tests that share it must not stop
    it, and read its log and counters as deltas from their own start."""
    from helpers import run_server

    with run_server(tmp_path_factory.mktemp("hello"), ["--plugins", "fixture_hello"], sites=[fixture_sites["endpoint"]]) as server:
        yield server


FLAGS_BODY_BYTES = 4 * 1024 * 1024  # --max-request-bytes of flags_server
FLAGS_SEQUENCES = 16  # --max-sequences-per-request of flags_server


@pytest.fixture(scope="session")
def flags_server(tmp_path_factory: pytest.TempPathFactory):
    """One ``host serve`` for the modules whose flags do not touch each other's requests (a
    start is ~15 s; each module checks its own flags are there):

    - ``--served-model-name m --max-request-bytes 4MiB``: plugins/endpoints/test_no_stall.py (the
      largest requests under the body limit, the caps);
    - ``--max-sequences-per-request 16``: plugins/endpoints/test_request_limits.py (refused values,
      the sequences cap);
    - ``--disable-log-stats --log-stats-interval 0.5 --metrics-prefix host``: plugins/stat_loggers/
      test_server_stat_loggers.py (no periodic stats line, host's own metric names);
    - ``--enable-auto-tool-choice --tool-call-parser hermes``: plugins/endpoints/
      test_tool_calling.py (only requests with ``tools`` reach the parser);
    - ``--enable-prompt-tokens-details --block-size 16``: plugins/endpoints/test_vllm_fields.py
      (its prefix-cache prompt is its own; 16 is the default block size, pinned).

    Tests must not stop it, read its log and counters as deltas from their own start, and check
    its gauges once their own requests are done."""
    from helpers import run_server

    args = ["--served-model-name", "m", "--max-request-bytes", str(FLAGS_BODY_BYTES),
            "--max-sequences-per-request", str(FLAGS_SEQUENCES), "--disable-log-stats", "--log-stats-interval", "0.5",
            "--metrics-prefix", "host",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--enable-prompt-tokens-details", "--block-size", "16"]
    with run_server(tmp_path_factory.mktemp("flags"), args) as server:
        yield server


@pytest.fixture(scope="session")
def builtin_plugins_listing():
    """``host plugins list --json`` with no extra plugins (the installed command's
    ``CompletedProcess``), run once for the session: the CLI tests and the built-in plugins'
    own tests read the rows they check from it."""
    from helpers import run_host

    return run_host(["plugins", "list", "--json"], [])


@pytest.fixture(scope="session")
def fixture_sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``pip install`` each fixture package into its own target directory (real installs with
    real dist-info and entry points); tests put the ones they need on ``sys.path``/PYTHONPATH."""
    root = tmp_path_factory.mktemp("fixture-sites")
    running = {}
    for name in FIXTURE_PACKAGES:  # side by side: each builds in its own source and target directory
        cmd = [
            sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
            "--no-build-isolation", "--target", str(root / name), str(FIXTURES / name),
        ]
        running[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failed = {}
    for name, proc in running.items():
        out, _ = proc.communicate()
        if proc.returncode != 0:
            failed[name] = out
    if failed:
        raise RuntimeError("pip install of fixture(s) failed:\n" + "\n".join(f"{n}:\n{o}" for n, o in failed.items()))
    return {name: str(root / name) for name in FIXTURE_PACKAGES}




# -- tiny random checkpoints ----------------------------------------------------------------------

TINY_ARCHS = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}  # arch -> transformers' class prefix
TINY_SHAPE = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=300, max_position_embeddings=128,
)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A factory ``tiny_checkpoint(arch, **overrides) -> Path`` of tiny random Hugging Face
    checkpoints, built with transformers' own model classes and ``save_pretrained``.

    ``arch`` is ``"llama"``, ``"qwen2"`` or ``"qwen3"``; ``overrides`` are config fields over
    ``TINY_SHAPE``. Keyword-only factory arguments shape the weights:

    - ``seed`` (0): ``torch.manual_seed`` right before the model is built (the caller's RNG state
      is left as it was);
    - ``norm_std`` / ``bias_std`` (0): norm weights become ``1 + norm_std * randn`` and biases
      ``bias_std * randn`` (in parameter order), so a mis-mapped tensor shows;
    - ``lm_head_scale`` (1): multiplies ``lm_head.weight`` (tied embeddings too) for a peakier
      distribution;
    - ``dtype`` ("float32"): the dtype the weights are cast to and saved in;
    - ``weights`` (True): ``False`` saves only ``config.json``, for dummy weights or configuration.

    The directory holds no tokenizer (tests pass ``skip_tokenizer_init=True``); load the
    reference model with ``helpers.hf_model(path)``. Identical requests (the same config and the
    same arguments) return the same directory, once per session: tests must not write into it.
    """
    made: dict[str, Path] = {}

    def build(arch: str, *, seed: int = 0, norm_std: float = 0.0, bias_std: float = 0.0, lm_head_scale: float = 1.0,
              dtype: str = "float32", weights: bool = True, **overrides: Any) -> Path:
        import torch
        import transformers

        if arch not in TINY_ARCHS:
            raise ValueError(f"tiny_checkpoint: unknown arch {arch!r}; use one of {sorted(TINY_ARCHS)}")
        prefix = TINY_ARCHS[arch]
        config = getattr(transformers, f"{prefix}Config")(**{**TINY_SHAPE, **overrides})
        config.architectures = [f"{prefix}ForCausalLM"]
        key = json.dumps([config.to_dict(), seed, norm_std, bias_std, lm_head_scale, dtype, weights],
                         sort_keys=True, default=str)
        if key in made:
            return made[key]
        path = tmp_path_factory.mktemp(f"tiny-{arch}")
        if not weights:
            config.save_pretrained(path)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
                with torch.no_grad():
                    for name, param in model.named_parameters():
                        if norm_std and name.endswith("norm.weight"):
                            param.copy_(1.0 + norm_std * torch.randn_like(param))
                        elif bias_std and name.endswith(".bias"):
                            param.copy_(bias_std * torch.randn_like(param))
                    if lm_head_scale != 1.0:
                        model.lm_head.weight.mul_(lm_head_scale)
            model.to(getattr(torch, dtype)).save_pretrained(path)
        made[key] = path
        return path

    return build


# -- the official openai client on a module's `server` fixture (a real host serve) ------------


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id
