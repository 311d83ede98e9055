"""Helpers shared by tests (importable because tests/conftest.py puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parent.parent
HOST_BIN = str(Path(sys.executable).with_name("host"))


@contextlib.contextmanager
def on_sys_path(*paths: str) -> Iterator[None]:
    """Make installed fixture packages discoverable in this process for the block."""
    sys.path[:0] = list(paths)
    try:
        yield
    finally:
        for p in paths:
            sys.path.remove(p)
        for mod in [m for m in sys.modules if m.startswith("host_fixture_")]:
            del sys.modules[mod]


def subprocess_env(sites: list[str], **extra: str) -> dict[str, str]:
    """A clean environment for a child process with only ``sites`` as extra plugins. A checkout
    whose directory is named ``host`` (a worktree imported through PYTHONPATH) stays on the path,
    so the child runs the code under test rather than the editable install's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOST_")}
    env["PYTHONPATH"] = os.pathsep.join([*sites, *([str(REPO.parent)] if REPO.name == "host" else [])])
    env.update(extra)
    return env


def run_host(args: list[str], sites: list[str], timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    """Run the installed ``host`` command in a child process."""
    return subprocess.run([HOST_BIN, *args], capture_output=True, text=True, env=subprocess_env(sites, **extra), timeout=timeout)


def run_hosts(*calls: tuple) -> list[subprocess.CompletedProcess]:
    """Several :func:`run_host` calls at once, each ``(args, sites)`` or ``(args, sites, env)``;
    the results in the order given. Each child spends its seconds importing (one core each), so
    independent commands run side by side rather than one after another."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(run_host, call[0], call[1], **(call[2] if len(call) > 2 else {})) for call in calls]
        return [f.result() for f in futures]


@contextlib.contextmanager
def host_runs(calls: dict[str, list[str]], timeout: float = 300, inputs: dict[str, str] | None = None) -> Iterator[dict]:
    """Start every ``host <args>`` of ``calls`` at once (no extra plugins, like
    :func:`run_host`; ``inputs`` gives a call its stdin) and yield ``{name: Future}`` whose
    ``result()`` is that call's ``CompletedProcess``: a module's tests each wait for their own
    command while the others run on the other core. Leaving the block waits for all of them."""
    from concurrent.futures import ThreadPoolExecutor

    inputs = inputs or {}
    with ThreadPoolExecutor(len(calls)) as pool:
        yield {
            name: pool.submit(subprocess.run, [HOST_BIN, *args], input=inputs.get(name), capture_output=True, text=True,
                              env=subprocess_env([]), timeout=timeout)
            for name, args in calls.items()
        }


MOE_BASE = dict(
    hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
    max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.1, tie_word_embeddings=False,
)
MOE_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # layer 1 dense (mlp_only_layers), shared expert with its gate
    "qwen2_moe": ("Qwen2Moe", dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=96,
                                   shared_expert_intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=False)),
    "qwen3_moe": ("Qwen3Moe", dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, intermediate_size=96,
                                   norm_topk_prob=True, head_dim=16, decoder_sparse_step=1)),
    "mixtral": ("Mixtral", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)),
    "olmoe": ("Olmoe", dict(num_experts=8, num_experts_per_tok=2, intermediate_size=32, clip_qkv=3.0)),
}


def tiny_moe(path: Any, case: str, seed: int = 0, **extra: Any) -> str:
    """A tiny random mixture-of-experts checkpoint of ``MOE_CASES[case]`` saved in ``path`` with
    ``save_pretrained`` (norms moved off 1, routers scaled so each token's choices are clear)."""
    import torch
    import transformers

    prefix, overrides = MOE_CASES[case]
    config = getattr(transformers, f"{prefix}Config")(**{**MOE_BASE, **overrides, **extra})
    config.architectures = [f"{prefix}ForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
                elif "gate" in name and param.dim() == 2 and param.shape[0] <= 8:
                    param.mul_(20.0)  # routers with clear choices: the same experts in both runs
    model.save_pretrained(path)
    return str(path)


def hf_model(path):
    """The Hugging Face reference model of a checkpoint directory (e.g. one ``tiny_checkpoint``
    made), in the dtype it was saved in, in eval mode; each call loads a fresh copy."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype="auto").eval()


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The reference: ``n`` greedy tokens from a Hugging Face model (EOS ignored)."""
    import torch

    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
        )
    return out[0, len(prompt):].tolist()


def hf_greedy_logprobs(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """The reference: ``n`` greedy tokens from a Hugging Face model (EOS ignored) and the float32
    log-probability of each."""
    import torch

    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=n,
            min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0, output_scores=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, tokens)]


def random_ids(n: int, seed: int, vocab: int):
    """``n`` token ids in ``[3, vocab)`` from a seeded generator (a tensor)."""
    import torch

    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def assert_engine_matches_hf(llm, hf, vocab: int, max_tokens: int = 8) -> None:
    """Through ``llm``: one prompt, then two more — one sharing its 24-token prefix (which must
    come from the prefix cache) and one of its own — each giving ``hf``'s greedy tokens with
    logprobs within 1e-4 (``llm`` built with a small step budget exercises chunked prefill)."""
    from host import SamplingParams

    prefix = random_ids(24, 5, vocab).tolist()
    prompts = [prefix + random_ids(n, 10 + n, vocab).tolist() for n in (3, 17)] + [random_ids(13, 4, vocab).tolist()]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params)
    assert rest[0].num_cached_tokens == 24
    for out, prompt in zip(first + rest, prompts):
        tokens, logprobs = hf_greedy_logprobs(hf, prompt, max_tokens)
        assert out.outputs[0].token_ids == tokens
        ours = [lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, tokens)]
        assert max(abs(a - b) for a, b in zip(ours, logprobs)) < 1e-4


def random_gpt_oss(config_kwargs: dict, seed: int = 0, gate_up_scale: float = 1.0):
    """A random transformers gpt-oss: norms moved off 1, visible sinks (std 1.5), random biases,
    routers with clear choices (the same experts in every run), the experts' gate/up weights
    times ``gate_up_scale`` (to make the SwiGLU clamp cut in)."""
    import torch
    import transformers

    config = transformers.GptOssConfig(**config_kwargs)
    config.architectures = ["GptOssForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.GptOssForCausalLM(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
                elif name.endswith("sinks"):
                    param.copy_(1.5 * torch.randn_like(param))
                elif ".router." in name:
                    param.mul_(20.0)
                elif name.endswith("gate_up_proj"):
                    param.mul_(gate_up_scale)
                elif name.endswith("bias"):
                    param.copy_(0.1 * torch.randn_like(param))
    return model


def metric_total(url: str, suffix: str) -> float:
    """The sum over labels of the ``*:<suffix>`` samples a server's ``/metrics`` shows (whatever
    the prefix); fails when there is none."""
    import httpx

    total, found = 0.0, False
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if not line.startswith("#") and name.endswith(":" + suffix):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"no *:{suffix} in /metrics"
    return total


def hf_beams(model, prompt: list[int], width: int, max_new: int, stops: list[int] | None, length_penalty: float = 1.0,
             early_stopping: bool | str = False) -> list[tuple[list[int], float]]:
    """transformers' beam search: ``(generated tokens up to and with the stop token, score)``
    per returned beam, best first (one torch thread: on a busy machine two run it 5x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                num_beams=width, num_return_sequences=width, do_sample=False, length_penalty=length_penalty,
                early_stopping=early_stopping, max_new_tokens=max_new, eos_token_id=stops,
                pad_token_id=stops[0] if stops else 0, return_dict_in_generate=True, output_scores=True,
            )
    finally:
        torch.set_num_threads(threads)
    beams = []
    for row, score in zip(out.sequences, out.sequences_scores):
        gen = row[len(prompt):].tolist()
        ends = [i for i, t in enumerate(gen) if stops and t in stops]
        beams.append((gen[: ends[0] + 1] if ends else gen, float(score)))
    return beams


# -- a real `host serve` subprocess ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, log_path: str) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


@contextlib.contextmanager
def run_server(tmp_path, args: list[str] = (), sites: list[str] = (), timeout: float = 180, **env: str) -> Iterator["Server"]:
    """Start ``host serve`` and wait for /health; stop it (SIGTERM, then SIGKILL) afterwards."""
    port = free_port()
    log_path = str(tmp_path / f"server-{port}.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [HOST_BIN, "serve", "--port", str(port), "--max-model-len", "1024", *args],
        stdout=log, stderr=subprocess.STDOUT, env=subprocess_env(list(sites), **env), start_new_session=True,
    )
    server = Server(proc, port, log_path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"host serve exited with {proc.returncode}:\n{server.log()}")
            try:
                import httpx

                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"host serve did not become healthy in {timeout} s:\n{server.log()}")
            time.sleep(0.1)  # a refused connection costs next to nothing; each start waits less
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()


def check_fused_decode(decoder, fused, tol: float) -> list[int]:
    """Install a ``decode_kernel`` on ``decoder`` that runs ``fused`` and, for every step it takes,
    the layer-by-layer path too, asserting they agree within ``tol``; returns the list the batch
    size of each compared step is appended to."""
    import torch

    compared: list[int] = []

    def checked(input_ids, positions, hidden):
        out = fused(input_ids, positions, hidden.clone())
        if out is not None:
            decoder.decode_kernel = None
            try:
                ref = decoder(input_ids, positions)
            finally:
                decoder.decode_kernel = checked
            torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
            compared.append(input_ids.shape[0])
        return out

    decoder.decode_kernel = checked
    return compared
