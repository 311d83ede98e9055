"""The expert-parallel load balancer (seed §8.3): the maps and their invariants, the load window,
rearrangements that move weights without changing outputs, sync and async modes, the skip rule,
the policy registry; then for real, -tp 2 expert parallel with EPLB over the mp executor."""

from __future__ import annotations

import pytest
import torch

from helpers import tiny_moe
from host.core.config import EPLBConfig
from host.core.distributed.group import GroupCoordinator
from host.core.moe.eplb.greedy import GreedyPolicy
from host.core.moe.eplb.maps import balancedness, check_maps, logical_load
from host.core.moe.eplb.rearrange import transfer_plan
from host.core.moe.eplb.state import EplbState
from host.core.moe.layer import FusedMoE, maps_from_physical

E, K, H, INTER = 4, 2, 16, 8


def _layers(n: int = 2, redundant: int = 4, seed: int = 0) -> list[FusedMoE]:
    g = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(n):
        layer = FusedMoE(E, K, H, INTER, torch.float32, router={"scoring": "softmax", "renormalize": True}, num_redundant=redundant)
        for e in range(E):
            layer.load_expert(e, "gate_up", torch.randn(2 * INTER, H, generator=g))
            layer.load_expert(e, "down", torch.randn(H, INTER, generator=g))
        layers.append(layer)
    return layers


def _maps(layers: list[FusedMoE]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.stack([m.physical_to_logical for m in layers]), torch.stack([m.logical_to_physical for m in layers]),
            torch.stack([m.replica_count for m in layers]))


def test_initial_and_rebalanced_maps_keep_the_invariants() -> None:
    layers = _layers()
    check_maps(*_maps(layers))
    assert layers[0].physical_to_logical.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    # expert 0 (layer 0) and 3 (layer 1) are hot and each sits twice on one rank: the greedy policy
    # gives them most of the redundant slots and spreads them
    load = torch.tensor([[100.0, 10, 10, 10], [5, 5, 5, 50]])
    lopsided = torch.tensor([[0, 0, 1, 1, 2, 2, 3, 3]] * 2)
    new = GreedyPolicy().rebalance(load, 8, 2, lopsided)
    l2p, counts = maps_from_physical(new, E, 5)
    check_maps(new, l2p, counts)
    assert counts[0].tolist()[0] >= 3 and counts[1].tolist()[3] >= 3
    assert balancedness(load, lopsided, 2) < 0.65 < 0.9 < balancedness(load, new, 2)
    broken = l2p.clone()
    broken[0, 0, 0] = int((new[0] != 0).nonzero()[0])  # a slot that does not serve expert 0
    with pytest.raises(ValueError, match="disagree"):
        check_maps(new, broken, counts)


def test_logical_load_folds_replicas_and_drops_empty_slots() -> None:
    p2l = torch.tensor([[0, 1, 0, -1]])
    assert logical_load(torch.tensor([[3, 4, 5, 100]]), p2l, 2).tolist() == [[8.0, 4.0]]


def test_transfer_plan_prefers_a_source_on_the_same_rank() -> None:
    # two ranks of 2 slots: slot 1 gets expert 2 (held by slot 2 on rank 1 and slot 0... no: slot 3)
    assert transfer_plan([0, 1, 2, 2], [0, 2, 2, 1], 2) == [(1, 2), (3, 1)]
    assert transfer_plan([0, 1, 2, 0], [0, 0, 2, 1], 2) == [(1, 0), (3, 1)]


def _run(state: EplbState, layers: list[FusedMoE], steps: int, seed: int = 1) -> list[torch.Tensor]:
    """``steps`` forward steps (token batches routed mostly to expert 0), each followed by state.step()."""
    g = torch.Generator().manual_seed(seed)
    outs = []
    for _ in range(steps):
        x = torch.randn(6, H, generator=g)
        logits = torch.randn(6, E, generator=g)
        logits[:, 0] += 4.0
        outs.append(torch.stack([layer(x, logits) for layer in layers]))
        state.step()
    return outs


def test_load_is_recorded_only_in_the_window_before_each_rearrangement() -> None:
    layers = _layers()
    state = EplbState(layers, EPLBConfig(window_size=2, step_interval=5, min_improvement=0.99), GroupCoordinator.single("eplb"), GreedyPolicy())
    pattern = []
    for _ in range(10):
        pattern.append(layers[0].record_load)
        _run(state, layers, 1)
    assert pattern == [False, False, False, True, True] * 2
    assert state.skipped == 2  # a 99% gain is never reached


def test_rearrangement_moves_weights_and_keeps_outputs() -> None:
    layers = _layers()
    state = EplbState(layers, EPLBConfig(window_size=3, step_interval=3, min_improvement=0.0),
                      GroupCoordinator.single("eplb"), GreedyPolicy())
    x, logits = torch.randn(5, H), torch.randn(5, E)
    before = [layer(x, logits) for layer in layers]
    experts = [layer.w13[:E].clone() for layer in layers]  # slots 0-3 start as experts 0-3
    old = _maps(layers)[0].clone()
    _run(state, layers, 3)
    assert state.rearrangements == 1 and not torch.equal(old, _maps(layers)[0])
    check_maps(*_maps(layers))
    for layer, original in zip(layers, experts):  # each slot holds the weights of the expert it serves now
        for slot, logical in enumerate(layer.physical_to_logical.tolist()):
            assert torch.equal(layer.w13[slot], original[logical])
    after = [layer(x, logits) for layer in layers]
    for a, b in zip(before, after):
        assert torch.allclose(a, b, atol=1e-6)


def test_sync_and_async_give_the_same_maps_and_weights() -> None:
    results = []
    for use_async in (False, True):
        layers = _layers(seed=3)
        state = EplbState(layers, EPLBConfig(window_size=2, step_interval=4, min_improvement=0.0, use_async=use_async),
                          GroupCoordinator.single("eplb"), GreedyPolicy())
        _run(state, layers, 4)
        state.finish()
        assert state.rearrangements == 1
        results.append((_maps(layers)[0], [layer.w13.clone() for layer in layers], [layer.w2.clone() for layer in layers]))
    (m1, w13_1, w2_1), (m2, w13_2, w2_2) = results
    assert torch.equal(m1, m2)
    assert all(torch.equal(a, b) for a, b in zip(w13_1 + w2_1, w13_2 + w2_2))


def test_eplb_config_is_checked() -> None:
    with pytest.raises(ValueError, match="window_size=10 is longer than step_interval=5"):
        EPLBConfig(window_size=10, step_interval=5)
    with pytest.raises(ValueError, match="unknown keys"):
        EPLBConfig.from_value({"windowsize": 3})


def test_unknown_policy_names_the_registered_ones() -> None:
    from host.core.models.registry import eplb_policy

    assert isinstance(eplb_policy("greedy"), GreedyPolicy)
    with pytest.raises(ValueError, match="registered: greedy"):
        eplb_policy("nope")


def test_tp2_expert_parallel_with_eplb_matches_one_rank(tmp_path) -> None:
    """Two ranks, 8 experts + 2 redundant: every 3 steps the experts are rearranged across the
    ranks (weights sent over gloo), and the greedy tokens and logprobs stay those of one rank."""
    from host import LLM, SamplingParams

    path = tiny_moe(tmp_path, "qwen3_moe", seed=4)
    prompts = [[5 + i, 17, 33, 2 * i + 40, 9, 61, 3, 8] for i in range(4)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=1)

    def run(**kw):
        llm = LLM(path, skip_tokenizer_init=True, max_model_len=64, max_num_seqs=4, **kw)
        try:
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
            stats = llm.engine.scheduler.make_stats() if hasattr(llm.engine, "scheduler") else None
            return [(o.outputs[0].token_ids, [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
                    for o in outs], stats
        finally:
            llm.shutdown()

    ref, _ = run()
    got, stats = run(tensor_parallel_size=2, distributed_executor_backend="mp", enable_expert_parallel=True, enable_eplb=True,
                     eplb_config={"window_size": 2, "step_interval": 3, "num_redundant_experts": 2, "min_improvement": 0.0})
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, ref):
        assert tokens == ref_tokens
        assert max(abs(a - b) for a, b in zip(logprobs, ref_logprobs)) < 1e-4
    assert stats is not None and stats.eplb_stats.rearrangements >= 2 and stats.eplb_stats.balancedness is not None
