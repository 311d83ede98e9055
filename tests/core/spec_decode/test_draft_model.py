"""The ``draft_model`` proposer in the engine, on a tiny llama target.

- A smaller draft (one layer, other weights, the same vocabulary) and the target as its own
  draft: greedy tokens over 32 prompts equal those of the same engine without speculation
  (itself checked against transformers on a few of them) with prefix caching and chunked
  prefill on, and no block is leaked afterwards;
- every proposal the engine made equals transformers' greedy continuation of the draft model on
  the same tokens (the paged catch-up-then-draft path computes what the draft model says);
- with the target as its own draft nearly every draft is accepted (the drafts are the target's
  own greedy tokens: a real check that they are computed on the right tokens and positions);
- the draft's KV layers are counted in the block size: the same KV budget holds fewer blocks,
  exactly budget // (target's + draft's bytes per block);
- a draft of another vocabulary is refused at start, naming both sizes.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams

K = 3
MAX_NEW = 8
VOCAB = 300
SHAPE = dict(vocab_size=VOCAB, max_position_embeddings=256)
BUDGET = 2**20  # KV bytes: the same for every engine here, so block counts compare
ENGINE = dict(skip_tokenizer_init=True, max_num_batched_tokens=64, max_num_seqs=16, kv_cache_memory=BUDGET,
              enable_prefix_caching=True)


def prompts_of(n: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of 3-40 tokens; a third share a 20-token prefix (prefix-cache hits)."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, VOCAB) for _ in range(20)]
    out = []
    for i in range(n):
        tail = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 21))]
        out.append(shared + tail if i % 3 == 0 else tail)
    return out


PROMPTS = prompts_of(32)


def generate(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [list(o.outputs[0].token_ids) for o in outs]


def assert_no_leaked_blocks(llm: LLM) -> None:
    manager = llm.engine.kv_cache_manager
    assert not llm.engine.scheduler.requests
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1
    assert not manager.req_to_blocks


def proposer_of(llm: LLM) -> Any:
    from host.core.spec_decode.worker.proposer import Proposer

    runner = llm.engine.executor.worker.model_runner
    holders = [runner] + [v for v in vars(runner).values() if hasattr(v, "__dict__") and not isinstance(v, type)]
    found = list({id(v): v for h in holders for v in vars(h).values() if isinstance(v, Proposer)}.values())
    assert len(found) == 1, f"the model runner holds {len(found)} proposers"
    return found[0]


def record_proposals(proposer: Any) -> list[tuple[list[int], list[int]]]:
    """Keep (the request's known tokens, its drafts) of every non-empty proposal the real
    proposer makes from now on."""
    seen: list[tuple[list[int], list[int]]] = []
    propose = proposer.propose

    def recording(batch):
        drafts = propose(batch)
        for tokens, d in zip(batch.token_ids, drafts):
            if d:
                seen.append(([int(t) for t in tokens], list(d)))
        return drafts

    proposer.propose = recording
    return seen


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoint) -> dict[str, str]:
    return {
        "target": str(tiny_checkpoint("llama", seed=11, **SHAPE)),
        "small": str(tiny_checkpoint("llama", seed=1, num_hidden_layers=1, **SHAPE)),
    }


@pytest.fixture(scope="module")
def base(checkpoints) -> LLM:
    """The same engine without speculation."""
    return LLM(model=checkpoints["target"], **ENGINE)


@pytest.fixture(scope="module")
def reference(checkpoints, base) -> list[list[int]]:
    """Greedy tokens without speculation, the first four equal to transformers'."""
    tokens = generate(base, PROMPTS)
    hf = hf_model(checkpoints["target"])
    assert [hf_greedy(hf, p, MAX_NEW) for p in PROMPTS[:4]] == tokens[:4]
    return tokens


def greedy_continuation(model: Any, tokens: list[int], n: int) -> list[int]:
    """``n`` greedy tokens of a transformers model after ``tokens`` (full forwards, no cache)."""
    import torch

    ids = list(tokens)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(tokens):]


def spec_llm(target: str, draft: str, **extra: Any) -> LLM:
    return LLM(model=target, speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": K},
               **{**ENGINE, **extra})


# 15 usable blocks of 4 tokens for 6 running requests of up to 48 tokens: preemptions, and
# lookahead slots that do not always fit (the proposer then drafts fewer tokens)
PREEMPTING = dict(block_size=4, num_gpu_blocks_override=16, max_num_seqs=6, max_num_batched_tokens=32)


@pytest.mark.parametrize("draft, settings", [("small", {}), ("target", {}), ("target", PREEMPTING)],
                         ids=["small", "target", "target-preempting"])
def test_greedy_equals_transformers(checkpoints, reference, draft, settings):
    llm = spec_llm(checkpoints["target"], checkpoints[draft], **settings)
    seen = record_proposals(proposer_of(llm))
    n = 12 if settings else len(PROMPTS)
    assert generate(llm, PROMPTS[:n]) == reference[:n]
    assert_no_leaked_blocks(llm)
    if settings:
        assert llm.engine.scheduler.num_preemptions > 0
    assert len(seen) > n, "the draft proposed too rarely"
    assert all(len(d) <= K for _, d in seen)
    # the proposals are the draft model's own greedy continuations of the tokens it was shown
    hf_draft = hf_model(checkpoints[draft])
    for tokens, drafts in random.Random(0).sample(seen, min(32, len(seen))):
        assert drafts == greedy_continuation(hf_draft, tokens, len(drafts)), f"after {len(tokens)} tokens"
    if draft == "target":
        # the target drafting for itself: a draft is wrong only where the final output differs
        outputs = {tuple(p): r for p, r in zip(PROMPTS, reference)}
        proposed = accepted = 0
        for tokens, drafts in seen:
            prompt = max((p for p in outputs if tokens[: len(p)] == list(p)), key=len)
            truth = list(prompt) + outputs[prompt]
            follow = truth[len(tokens): len(tokens) + len(drafts)]
            proposed += len(follow)
            for a, b in zip(follow, drafts):  # what the rejection sampler accepts: the matching prefix
                if a != b:
                    break
                accepted += 1
        assert accepted >= 0.98 * proposed, f"{accepted}/{proposed} self-drafts match the target's tokens"
        full = sum(1 for _, d in seen if len(d) == K)
        if not settings:  # the scheduler's lookahead slots leave room for every draft
            assert full == len(seen), f"only {full}/{len(seen)} proposals have all {K} drafts"
        else:  # short of blocks: some proposals stop at the request's last block
            assert full < len(seen)


def test_draft_kv_counted_in_blocks(checkpoints, base):
    """The draft's pages share the block budget: the same KV budget, fewer blocks."""
    from host.core.kv_cache.spec import num_blocks_from_memory

    with_draft = spec_llm(checkpoints["target"], checkpoints["small"])
    target_specs = base.engine.kv_cache_config.kv_cache_specs
    all_specs = with_draft.engine.kv_cache_config.kv_cache_specs
    assert len(all_specs) == len(target_specs) + 1  # one draft layer, after the target's
    assert all_specs[: len(target_specs)] == target_specs
    n_base, n_draft = base.engine.kv_cache_manager.num_blocks, with_draft.engine.kv_cache_manager.num_blocks
    assert n_base == num_blocks_from_memory(BUDGET, target_specs)
    assert n_draft == BUDGET // sum(s.page_size_bytes for s in all_specs) < n_base


def test_other_vocabulary_refused(checkpoints, tiny_checkpoint):
    other = str(tiny_checkpoint("llama", seed=1, num_hidden_layers=1, vocab_size=320, max_position_embeddings=256))
    with pytest.raises(ValueError, match="vocab_size=320.*vocab_size=300"):
        spec_llm(checkpoints["target"], other)
