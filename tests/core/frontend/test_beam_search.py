"""Beam search (``LLM.beam_search``, ``AsyncLLM.beam_search``) against Hugging Face transformers'
``generate(num_beams=k, do_sample=False, num_return_sequences=k)`` on the same weights: the same
token sequences in the same order, and the same beam scores, for every ``length_penalty`` /
``early_stopping`` rule, with beams ended by EOS, by a stop token and by ``max_tokens``. The beams
of one search share their prompt's KV blocks through the prefix cache (its hit counter shows it)."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from helpers import hf_beams, hf_model
from host import LLM
from host.contracts.sampling_params import SamplingParams
from host.core.engine_args import EngineArgs
from host.core.frontend.async_llm import AsyncLLM
from host.core.frontend.beam_search import BeamSearch, BeamSearchParams
from host.core.models.default_model import default_model_path

BLOCK = 16


def assert_same_beams(got, want) -> None:
    assert [c.token_ids for c in got.outputs] == [tokens for tokens, _ in want]
    assert [c.score for c in got.outputs] == pytest.approx([score for _, score in want], abs=1e-4)


# -- a tiny random model: many cases --------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    # a peaky distribution (lm_head x8) so that no two candidates tie
    path = tiny_checkpoint("llama", seed=7, lm_head_scale=8.0)
    llm = LLM(model=str(path), skip_tokenizer_init=True, block_size=BLOCK, max_model_len=128)
    yield llm, hf_model(path)
    llm.shutdown()


def stop_token_for(model, prompt: list[int], at: int) -> int:
    """The token greedy decoding emits at position ``at``: as a stop token, beams end on it."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=at + 1, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) + at].item()


CASES = [  # width, length_penalty, early_stopping, max_tokens
    (2, 1.0, False, 8),
    (3, 1.0, True, 10),
    (4, 0.5, "never", 10),
    (3, 2.0, "never", 12),
    (3, -1.0, False, 10),
    (5, 0.0, True, 6),
]


@pytest.mark.parametrize("width,length_penalty,early_stopping,max_tokens", CASES)
def test_tiny_model_matches_transformers(tiny, width, length_penalty, early_stopping, max_tokens):
    llm, model = tiny
    rng = random.Random(width * 100 + max_tokens)
    prompt = [rng.randrange(3, 300) for _ in range(rng.randrange(20, 40))]
    stop = stop_token_for(model, prompt, rng.randrange(1, 4))
    stops = sorted({llm.eos_token_id, stop})
    want = hf_beams(model, prompt, width, max_tokens, stops, length_penalty, early_stopping)
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, length_penalty=length_penalty,
                              early_stopping=early_stopping, stop_token_ids=[stop])
    (got,) = llm.beam_search({"prompt_token_ids": prompt}, params)
    assert_same_beams(got, want)
    for c in got.outputs:
        ended = c.token_ids[-1] in stops
        assert c.finish_reason == ("stop" if ended else "length")
        assert ended or len(c.token_ids) == max_tokens
        assert c.stop_reason == (c.token_ids[-1] if ended and c.token_ids[-1] != llm.eos_token_id else None)
    assert not llm.engine.scheduler.requests


def test_ignore_eos_batched_prompts_and_shared_blocks(tiny):
    """Two prompts searched together (their steps batched), EOS ignored (transformers without an
    EOS); every step's beams find the prompt's full blocks in the prefix cache."""
    llm, model = tiny
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (41, 35)]
    before = llm.stats()
    params = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True, num_return_sequences=2)
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    after = llm.stats()
    for prompt, got in zip(prompts, outs):
        assert got.prompt_token_ids == prompt and got.finished
        assert got.num_cached_tokens == 0  # new prompts: nothing cached before the first step
        want = hf_beams(model, prompt, 3, 6, None)[:2]
        assert_same_beams(got, want)
        assert all(c.finish_reason == "length" and len(c.token_ids) == 6 for c in got.outputs)
    # 6 steps: the first computes each prompt, the 5 later ones run 3 beams per prompt, and each of
    # those finds at least the prompt's full blocks cached (2 blocks of 16 tokens)
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    assert hits >= 5 * 3 * 2 * 2 * BLOCK
    manager = llm.engine.kv_cache_manager
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1 and not manager.req_to_blocks


def test_logprobs_and_refusals(tiny):
    llm, model = tiny
    prompt = list(range(10, 30))
    (got,) = llm.beam_search({"prompt_token_ids": prompt}, BeamSearchParams(beam_width=2, max_tokens=4, logprobs=3,
                                                                             ignore_eos=True))
    with torch.inference_mode():
        full = torch.tensor([prompt + got.outputs[0].token_ids])
        ref = torch.log_softmax(model(full).logits[0, len(prompt) - 1:-1].float(), dim=-1)
    for pos, (tok, lps) in enumerate(zip(got.outputs[0].token_ids, got.outputs[0].logprobs)):
        top = torch.topk(ref[pos], 3).indices.tolist()
        assert set(lps) == {tok, *top}
        assert lps[tok].logprob == pytest.approx(ref[pos, tok].item(), abs=1e-4)
        assert lps[tok].rank == int((ref[pos] > ref[pos, tok]).sum()) + 1
    assert sum(lp[t].logprob for t, lp in zip(got.outputs[0].token_ids, got.outputs[0].logprobs)) == pytest.approx(
        got.outputs[0].cumulative_logprob)
    with pytest.raises(ValueError, match="--max-logprobs"):
        llm.beam_search({"prompt_token_ids": prompt}, BeamSearchParams(beam_width=11))
    with pytest.raises(ValueError, match="top_p"):
        BeamSearchParams.from_sampling_params(SamplingParams(n=2, top_p=0.5))
    with pytest.raises(ValueError, match="best_of"):
        BeamSearchParams.from_sampling_params(SamplingParams(n=3), best_of=2)
    with pytest.raises(ValueError, match="early_stopping"):
        BeamSearchParams(beam_width=2, early_stopping="always")
    p = BeamSearchParams.from_sampling_params(SamplingParams(n=2, max_tokens=5, temperature=0.7), best_of=4,
                                              length_penalty=0.5, early_stopping="never")
    assert (p.beam_width, p.num_return_sequences, p.max_tokens, p.length_penalty, p.early_stopping) == (4, 2, 5, 0.5, "never")


def test_abort_ranks_live_beams_with_finished_ones(tiny):
    """A search ended early (a deadline) returns its best hypotheses, the live beams among them
    scored like finished ones and ending with "abort"."""
    llm, model = tiny
    rng = random.Random(21)
    prompt = [rng.randrange(3, 300) for _ in range(24)]
    stop = stop_token_for(model, prompt, 1)
    params = BeamSearchParams(beam_width=3, max_tokens=10, stop_token_ids=[stop])
    search = BeamSearch(prompt, params, llm.eos_token_id, 128)
    for _ in range(4):
        outs = llm.generate([{"prompt_token_ids": ids} for ids in search.pending()], search.step_params())
        search.advance([o.outputs[0].logprobs[0] for o in outs])
    assert not search.done and search.finished  # the greedy path's stop token finished a beam
    live = [(b.tokens, b.cum / len(b.tokens)) for b in search.running]
    done = [(b.tokens, score) for score, b in search.finished]
    search.abort()
    got = search.result("r", None, None)
    want = sorted(done + live, key=lambda item: -item[1])[:3]
    assert [(c.token_ids, c.score) for c in got.outputs] == want
    reasons = [c.finish_reason for c in got.outputs]
    assert reasons == [
        "stop" if any(tokens == t for t, _ in done) else "abort" for tokens, _ in want]
    assert set(reasons) == {"stop", "abort"}


# -- the default model, offline; the async path on the tiny model ---------------------------------

QUESTION = [{"role": "user", "content": "Reply with one word: what color is the sky?"}]


def test_default_model_matches_transformers():
    """SmolLM2 on a chat prompt: its best beam ends with EOS, the others run to max_tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    text = tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    want = hf_beams(model, ids, 3, 8, [tok.eos_token_id])
    llm = LLM(max_model_len=256, max_num_seqs=8)
    try:
        before = llm.stats().prefix_cache_hits
        (got,) = llm.beam_search({"prompt": text, "prompt_token_ids": ids}, BeamSearchParams(beam_width=3, max_tokens=8))
        hits = llm.stats().prefix_cache_hits - before
    finally:
        llm.shutdown()
    assert got.prompt_token_ids == ids and got.prompt == text
    assert_same_beams(got, want)
    assert [c.text for c in got.outputs] == [tok.decode(t, skip_special_tokens=True) for t, _ in want]
    assert {c.finish_reason for c in got.outputs} == {"stop", "length"}
    assert hits >= 7 * 3 * (len(ids) // BLOCK) * BLOCK  # each later step's beams found the prompt's full blocks


def test_async_llm_beam_search(tiny):
    """The server's path: the engine core in its own process (the tiny model; the default
    model's tokenizer only decodes the text)."""
    llm_offline, model = tiny
    rng = random.Random(11)
    prompt = [rng.randrange(3, 300) for _ in range(37)]
    stop = stop_token_for(model, prompt, 2)
    want = hf_beams(model, prompt, 4, 8, sorted({llm_offline.eos_token_id, stop}), 1.0, True)
    params = BeamSearchParams(beam_width=4, max_tokens=8, early_stopping=True, stop_token_ids=[stop])

    async def main() -> None:
        config = EngineArgs(model=llm_offline.config.model.model, tokenizer=default_model_path(), block_size=BLOCK,
                            max_model_len=128).create_engine_config()
        llm = await AsyncLLM.start(config)
        try:
            got = await llm.beam_search(prompt, params, "beams")
            assert got.request_id == "beams" and got.finished and got.num_cached_tokens == 0
            assert_same_beams(got, want)
            again = await llm.beam_search(prompt, params)  # the prompt's full blocks are cached now
            assert again.num_cached_tokens == 2 * BLOCK
            assert_same_beams(again, want)  # (a cached prefix may move the logprobs' last bits)
            assert [c.text for c in got.outputs] == [llm.tokenizer.decode(t, skip_special_tokens=True) for t, _ in want]
            stats = await llm.utility("stats")  # a dict over the wire
            assert stats.get("prefix_cache_hits", 0) >= 3 * 4 * 2 * BLOCK
            assert stats.get("kv_cache_usage", 0.0) == 0.0 and not llm._streams
            with pytest.raises(ValueError, match="max_tokens"):
                await llm.beam_search(prompt, BeamSearchParams(beam_width=2, max_tokens=100))
            # cancelling the caller (a client gone) mid-search aborts the step's engine requests
            task = asyncio.create_task(llm.beam_search(prompt, BeamSearchParams(beam_width=4, max_tokens=90, ignore_eos=True), "gone"))
            while not any(rid.startswith("gone-b3-") for rid in llm._streams):
                assert not task.done()
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not llm._streams
            for _ in range(50):
                stats = await llm.utility("stats")
                if stats.get("num_running_reqs", 0) == 0 and stats.get("num_waiting_reqs", 0) == 0:
                    break
                await asyncio.sleep(0.05)
            assert stats.get("num_running_reqs", 0) == 0 and stats.get("kv_cache_usage", 0.0) == 0.0
            # a deadline passed before the first step ends the search with no beam
            late = await llm.beam_search(prompt, params, deadline=0.0)
            assert late.finished and late.outputs == []
            stats = await llm.utility("stats")
            assert stats.get("num_running_reqs", 0) == 0 and stats.get("kv_cache_usage", 0.0) == 0.0
        finally:
            await llm.shutdown()

    asyncio.run(main())
