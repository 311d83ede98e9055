"""Tensor parallelism for real: ranks in separate processes, joined by gloo.

``test_tp2_model_matches_hf``: two worker processes (``python -c``) join one
``torch.distributed`` world through :func:`init_distributed`, load tiny random checkpoints with
the real loader (``parallel_config`` of ``-tp 2``: each rank slices its part of every tensor),
run one causal sequence and all-gather the logits; both ranks' logits must match Hugging Face's
within 1e-4 in fp32. The cases cover kv heads replicated (1 kv head, 2 ranks) and split (2 kv
heads), biases, q/k norms (Qwen3), tied and untied LM heads, and a vocabulary that 2 does not
divide (padded logits, trimmed).

``test_tp2_engine_matches_tp1_and_hf_greedy``: the whole engine with ``-tp 2`` over the ``mp``
executor (prefix caching and chunked prefill on) against the ``-tp 1`` engine (logprobs within
1e-4) and Hugging Face greedy decoding.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import hf_model

TOKENS = [3, 17, 5, 250, 9, 42, 7, 299, 1, 128, 64]

WORKER = r"""
import sys, torch
from host.core.config import LoadConfig, ModelConfig, ParallelConfig
from host.core.distributed.parallel_state import destroy_distributed, get_tp_group, init_distributed
from host.core.models.loader import load_model

rank, port, out, tokens, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
torch.set_num_threads(1)
parallel = ParallelConfig(tensor_parallel_size=2, distributed_init_method=f"tcp://127.0.0.1:{port}")
init_distributed(parallel, rank, rank, "gloo")
ids = torch.tensor([int(t) for t in tokens.split(",")])
results = {}
for path in paths:
    model, _ = load_model(ModelConfig(model=path), LoadConfig(), None, parallel_config=parallel)
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        logits = model.compute_logits(model(ids, torch.arange(len(ids))))
    results[path] = {"logits": logits, "heads": (attn.num_heads, attn.num_kv_heads), "kv_heads_per_rank": model.kv_heads_per_rank}
get_tp_group().barrier()
torch.save(results, f"{out}/rank{rank}.pt")
destroy_distributed()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_tp2(paths: list[Path], out: Path, timeout: float = 240) -> list[dict]:
    """Start the two ranks, wait for both (killing both on a failure or a hang)."""
    port = str(_free_port())
    args = [out.as_posix(), ",".join(map(str, TOKENS)), *map(str, paths)]
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, str(rank), port, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(2)
    ]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"a tensor-parallel rank failed (exit {p.returncode}):\n{log[-4000:]}"
    return [torch.load(out / f"rank{rank}.pt") for rank in range(2)]


CASES = {
    # name: (arch, overrides, per-rank (q heads, kv heads))
    "llama-kv-replicated-tied": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True), (2, 1)),
    "llama-bias-untied-odd-vocab": (
        "llama", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False, vocab_size=301), (2, 1),
    ),
    "qwen3-kv-split": ("qwen3", dict(tie_word_embeddings=False, vocab_size=301), (2, 1)),
}


def test_tp2_model_matches_hf(tiny_checkpoint, tmp_path: Path) -> None:
    paths = {
        name: tiny_checkpoint(arch, norm_std=0.1, bias_std=0.1, lm_head_scale=4.0, **overrides)
        for name, (arch, overrides, _) in CASES.items()
    }
    ranks = run_tp2(list(paths.values()), tmp_path)
    ids = torch.tensor([TOKENS])
    for name, path in paths.items():
        with torch.no_grad():
            reference = hf_model(path)(ids).logits[0]
        for rank in ranks:
            got = rank[str(path)]
            assert got["heads"] == CASES[name][2], name
            assert got["kv_heads_per_rank"] == CASES[name][2][1]
            assert got["logits"].shape == reference.shape, name
            torch.testing.assert_close(got["logits"], reference, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
            assert torch.equal(got["logits"].argmax(-1), reference.argmax(-1)), name



# -- the whole engine: -tp 2 over the mp executor ------------------------------------------------

E2E = {
    # GQA with the kv heads split (Qwen3: q/k norms) and replicated (Llama: 1 kv head for 2 ranks)
    "qwen3": dict(num_key_value_heads=2, tie_word_embeddings=False, vocab_size=301),
    "llama": dict(num_key_value_heads=1, tie_word_embeddings=True),
}
# a shared 20-token prefix (block size 16: one full block served from the prefix cache the
# second time), prompts longer than the 8-token step budget (chunked prefill)
PREFIX = [11, 23, 5, 78, 140, 9, 33, 61, 2, 250, 17, 88, 4, 120, 45, 6, 99, 210, 31, 7]
PROMPTS = [PREFIX + [12, 13], PREFIX + [40], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]


def _generate(path: Path, **engine_kw) -> list[tuple[list[int], list[float]]]:
    from host import LLM, SamplingParams

    llm = LLM(str(path), skip_tokenizer_init=True, max_model_len=96, max_num_batched_tokens=8, max_num_seqs=4,
              enable_prefix_caching=True, enable_chunked_prefill=True, **engine_kw)
    try:
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
        outs = []
        for batch in (PROMPTS[:1], PROMPTS):  # the second batch reuses the first's cached prefix block
            for out in llm.generate([{"prompt_token_ids": p} for p in batch], params):
                comp = out.outputs[0]
                outs.append((list(comp.token_ids), [pos[t].logprob for t, pos in zip(comp.token_ids, comp.logprobs)]))
        return outs
    finally:
        llm.shutdown()


@pytest.mark.parametrize("arch", list(E2E))
def test_tp2_engine_matches_tp1_and_hf_greedy(tiny_checkpoint, arch: str) -> None:
    from helpers import hf_greedy

    path = tiny_checkpoint(arch, seed=3, norm_std=0.1, lm_head_scale=4.0, **E2E[arch])
    tp1 = _generate(path)
    tp2 = _generate(path, tensor_parallel_size=2, distributed_executor_backend="mp")
    hf = hf_model(path)
    for prompt, (tokens1, lps1), (tokens2, lps2) in zip(PROMPTS[:1] + PROMPTS, tp1, tp2):
        assert tokens2 == tokens1 == hf_greedy(hf, prompt, len(tokens1))
        assert lps2 == pytest.approx(lps1, abs=1e-4)
