"""Expert parallelism: the experts split over two ranks, outputs equal to one rank's.

In one process (no collectives): two ranks' :class:`FusedMoE` shards, each holding half the
experts (EP) or half of every expert (TP), sum to the unsplit layer. Then for real: a tiny
Qwen3-MoE through the whole engine with ``-tp 2`` over the mp executor, the experts split by
tensor parallelism and by ``--enable-expert-parallel``, and with the Ray executor: greedy tokens
equal and logprobs within 1e-4 of the one-rank engine (fp32), with prefix caching and chunked
prefill on.
"""

from __future__ import annotations

import pytest
import torch

from helpers import tiny_moe
from host.core.moe.layer import FusedMoE

PREFIX = [11, 23, 5, 78, 140, 9, 33, 61, 2, 250, 17, 88, 4, 120, 45, 6, 99, 210, 31, 7]
PROMPTS = [PREFIX + [12, 13], PREFIX + [40], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]


def _layer(**kw) -> FusedMoE:
    return FusedMoE(8, 3, 32, 24, torch.float32, router={"scoring": "softmax", "renormalize": True}, **kw)


def _fill(layer: FusedMoE, experts: list[dict[str, torch.Tensor]]) -> None:
    for e, parts in enumerate(experts):
        for part, tensor in parts.items():
            layer.load_expert(e, part, tensor)


@pytest.mark.parametrize("split", ["ep", "tp"])
def test_two_shards_sum_to_the_whole_layer(split: str) -> None:
    g = torch.Generator().manual_seed(0)
    experts = [
        {"gate": torch.randn(24, 32, generator=g), "up": torch.randn(24, 32, generator=g), "down": torch.randn(32, 24, generator=g)}
        for _ in range(8)
    ]
    whole = _layer()
    _fill(whole, experts)
    x, logits = torch.randn(10, 32, generator=g), torch.randn(10, 8, generator=g)
    ref = whole(x, logits)
    parts = []
    for rank in range(2):
        kw = {"ep_rank": rank, "ep_size": 2} if split == "ep" else {"tp_rank": rank, "tp_size": 2}
        shard = _layer(**kw)
        _fill(shard, experts)
        held = shard.w13.shape
        assert held == ((4, 48, 32) if split == "ep" else (8, 24, 32))
        parts.append(shard(x, logits))
    assert torch.allclose(parts[0] + parts[1], ref, atol=1e-5)
    if split == "ep":  # each rank computed only the token-choices of its own experts
        assert not torch.allclose(parts[0], ref, atol=1e-3) and not torch.allclose(parts[1], ref, atol=1e-3)


def test_experts_that_do_not_split_evenly_are_refused() -> None:
    with pytest.raises(ValueError, match="do not split evenly over 3 expert-parallel ranks"):
        _layer(ep_rank=0, ep_size=3)
    with pytest.raises(ValueError, match="enable-expert-parallel"):
        FusedMoE(8, 2, 32, 25, torch.float32, tp_rank=0, tp_size=2)


def _generate(path: str, **engine_kw) -> list[tuple[list[int], list[float]]]:
    from host import LLM, SamplingParams

    llm = LLM(path, skip_tokenizer_init=True, max_model_len=96, max_num_batched_tokens=8, max_num_seqs=4,
              enable_prefix_caching=True, enable_chunked_prefill=True, **engine_kw)
    try:
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
        outs = []
        for batch in (PROMPTS[:1], PROMPTS):
            for out in llm.generate([{"prompt_token_ids": p} for p in batch], params):
                comp = out.outputs[0]
                outs.append((list(comp.token_ids), [pos[t].logprob for t, pos in zip(comp.token_ids, comp.logprobs)]))
        return outs
    finally:
        llm.shutdown()


def _assert_same(got: list, want: list) -> None:
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, want):
        assert tokens == ref_tokens
        assert max(abs(a - b) for a, b in zip(logprobs, ref_logprobs)) < 1e-4


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory) -> tuple[str, list]:
    path = tiny_moe(tmp_path_factory.mktemp("qwen3_moe"), "qwen3_moe", seed=2, vocab_size=301)
    return path, _generate(path)


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["experts_split_by_tp", "expert_parallel"])
def test_tp2_mp_matches_one_rank(qwen3_moe, expert_parallel: bool) -> None:
    path, one_rank = qwen3_moe
    _assert_same(_generate(path, tensor_parallel_size=2, distributed_executor_backend="mp",
                           enable_expert_parallel=expert_parallel), one_rank)


def test_expert_parallel_over_ray_matches_one_rank(qwen3_moe) -> None:
    ray = pytest.importorskip("ray")
    path, one_rank = qwen3_moe
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    try:
        _assert_same(_generate(path, tensor_parallel_size=2, distributed_executor_backend="ray",
                               enable_expert_parallel=True), one_rank)
    finally:
        ray.shutdown()


def test_dp2_expert_parallel_spreads_experts_over_the_engines(qwen3_moe) -> None:
    """-dp 2 --enable-expert-parallel: each engine's worker holds half the experts and the two
    engines step together (an engine without requests runs one-token dummy forwards while the
    other steps); every request's greedy tokens and logprobs equal the one-rank engine's."""
    path, one_rank = qwen3_moe
    from host import LLM, SamplingParams

    llm = LLM(path, skip_tokenizer_init=True, max_model_len=96, max_num_seqs=4, enable_prefix_caching=True,
              data_parallel_size=2, enable_expert_parallel=True)
    try:
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
        got = []
        for batch in (PROMPTS[:1], PROMPTS):  # one request: the other engine only runs dummy forwards
            for out in llm.generate([{"prompt_token_ids": p} for p in batch], params):
                comp = out.outputs[0]
                got.append((list(comp.token_ids), [pos[t].logprob for t, pos in zip(comp.token_ids, comp.logprobs)]))
    finally:
        llm.shutdown()
    _assert_same(got, one_rank)
