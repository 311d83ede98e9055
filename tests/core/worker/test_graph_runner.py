"""Decode graphs: padded dispatch over persistent buffers, checked on CPU.

CI has no GPU, so nothing records a CUDA graph here. The CPU platform is given
``eager_replay_capture`` as its capture function: a "graph" whose replay re-runs the forward on
the same persistent buffers and refreshes the same output tensor, which is what a replay does.
Everything else is the real path: the ladder of sizes, the buffers, padding rows that write no
KV, the attention metadata built once per size with ``max_seq_len = max_model_len`` (so the
Triton backend's split-K launch is fixed at capture), and the fallback to the eager forward for
prefill steps and batches larger than the largest graph. Tokens must equal transformers'.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from helpers import hf_greedy, hf_model  # noqa: E402
from host import LLM, SamplingParams  # noqa: E402
from host.core.worker.graph_runner import eager_replay_capture  # noqa: E402
from host.plugins.builtin_cpu.platform import CpuPlatform  # noqa: E402

pytestmark = pytest.mark.triton


@pytest.fixture
def capturing_cpu(monkeypatch):
    monkeypatch.setattr(CpuPlatform, "can_capture_graphs", lambda self: True)
    monkeypatch.setattr(CpuPlatform, "capture_graph", lambda self, fn, pool=None: eager_replay_capture(fn, pool))


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    path = tiny_checkpoint("qwen3", head_dim=16, max_position_embeddings=1024, tie_word_embeddings=True)
    return str(path), hf_model(path)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_padded_decode_graphs_match_transformers(tiny, capturing_cpu, async_scheduling):
    """With asynchronous scheduling the replayed inputs also take the previous step's tokens
    from the device (written into the persistent buffer before the replay)."""
    path, hf = tiny
    # max_model_len 640 >= 512: the captured attention is the split-K decode kernel with its
    # number of spans fixed from max_model_len, replayed for sequences of any length below it
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=640, attention_backend="triton_paged", block_size=8,
              max_num_batched_tokens=32, max_num_seqs=5, cuda_graph_sizes=[1, 2, 4], async_scheduling=async_scheduling)
    runner = llm.engine.executor.worker.model_runner
    graphs = runner.decode_graphs
    assert graphs is not None and graphs.sizes == [1, 2, 4]
    assert llm.engine.config.compilation.cuda_graphs
    rng = random.Random(3)
    # 5 requests: decode steps of 5 (> 4: eager), then 3 (padded to 4), 2, 1 as they finish
    lengths = [(7, 3), (19, 5), (2, 8), (11, 10), (26, 12)]
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n, _ in lengths]
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for _, m in lengths]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for p, (_, m), o in zip(prompts, lengths, outs):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, m)
    assert graphs.replays.get(4, 0) > 0 and graphs.replays.get(1, 0) > 0  # 3 decodes ran padded to 4
    assert (runner.num_in_flight_tokens > 0) == async_scheduling
    manager = llm.engine.kv_cache_manager
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1


def test_graphs_replay_buffers_exactly(tiny, capturing_cpu):
    """One replay against the eager forward on the same inputs, with padding rows present."""
    path, _ = tiny
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, attention_backend="triton_paged", block_size=8,
              max_num_seqs=4, cuda_graph_sizes=[4])
    runner = llm.engine.executor.worker.model_runner
    outs = llm.generate([{"prompt_token_ids": [5, 6, 7, 8, 9]}, {"prompt_token_ids": [10, 11]}],
                        SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert runner.decode_graphs.num_replays >= 3  # steps 2..4 of two requests, padded to 4
    assert all(len(o.outputs[0].token_ids) == 4 for o in outs)


def test_backend_without_graph_support(tiny, capturing_cpu):
    path, _ = tiny
    with pytest.raises(ValueError, match="cannot run inside device graphs"):
        LLM(path, skip_tokenizer_init=True, max_model_len=64, attention_backend="torch_paged", cuda_graph_sizes=[1, 2])
    # at the level's default the graphs step aside instead
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, attention_backend="torch_paged", optimization_level=2)
    assert llm.engine.executor.worker.model_runner.decode_graphs is None
    assert not llm.engine.config.compilation.cuda_graphs


def test_cpu_platform_refuses_explicit_graphs(tiny):
    path, _ = tiny
    with pytest.raises(ValueError, match="cannot capture device graphs"):
        LLM(path, skip_tokenizer_init=True, max_model_len=64, cuda_graph_sizes=[1, 2])
