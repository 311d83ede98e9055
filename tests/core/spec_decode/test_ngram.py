"""The ngram proposer (prompt lookup) and the auto-off that stops drafting for a request whose
drafts are mostly rejected."""

from __future__ import annotations

import numpy as np

from host import SamplingParams
from host.contracts.request import Request
from host.core.config import SpeculativeConfig
from host.core.spec_decode.scheduler import SpecDecodeFeature
from host.core.spec_decode.worker.ngram import propose_ngram


def ngram(tokens: list[int], k: int = 3, lo: int = 1, hi: int = 3) -> list[int]:
    return propose_ngram(np.array(tokens, dtype=np.int64), k, lo, hi)


def test_the_tokens_after_the_last_ngram_seen_before():
    assert ngram([1, 2, 3, 4, 5, 1, 2, 3]) == [4, 5, 1]
    # the longest n wins: [9, 2] occurred once (followed by 7); [2] alone last by 5
    assert ngram([9, 2, 7, 7, 2, 5, 0, 9, 2], k=2, lo=1, hi=2) == [7, 7]
    assert ngram([9, 2, 7, 7, 2, 5, 0, 3, 2], k=2, lo=1, hi=2) == [5, 0]  # only [2] matches: its latest
    # of several matches, the latest followed by k tokens
    assert ngram([1, 2, 8, 8, 8, 1, 2, 6, 6, 6, 1, 2], k=3, lo=2, hi=2) == [6, 6, 6]
    # a match near the end gives what follows it
    assert ngram([5, 5, 5], k=4, lo=1, hi=2) == [5]


def test_no_match_no_drafts():
    assert ngram([1, 2, 3, 4]) == []
    assert ngram([7]) == []
    assert ngram([1, 2, 3, 1], lo=2, hi=3) == []  # only a 1-gram repeats, below prompt_lookup_min


def test_k_caps_the_drafts():
    tokens = list(range(10)) * 3
    assert ngram(tokens, k=5) == [0, 1, 2, 3, 4]
    assert ngram(tokens, k=2) == [0, 1]


def _decoding(req_id: str = "a", max_tokens: int = 100, **sp) -> Request:
    r = Request(req_id, [1, 2, 3, 4], SamplingParams(max_tokens=max_tokens, **sp), eos_token_id=0)
    r.append_output_token_ids(5)
    r.num_computed_tokens = r.num_tokens - 1
    r.spec_token_ids = [6, 7, 8, 9]
    return r


def test_drafts_are_trimmed_to_the_budget_max_tokens_and_max_model_len():
    sched = SpecDecodeFeature(SpeculativeConfig(num_speculative_tokens=4), max_model_len=64)
    assert sched.contribute(_decoding(), budget=100, num_running=1) == [6, 7, 8, 9]
    assert sched.contribute(_decoding(), budget=3, num_running=1) == [6, 7]  # 1 + 2 tokens
    assert sched.contribute(_decoding(), budget=1, num_running=1) == []
    # one output so far, max_tokens 3: two more tokens at most, so one draft
    assert sched.contribute(_decoding(max_tokens=3), budget=100, num_running=1) == [6]
    assert sched.contribute(_decoding(max_tokens=2), budget=100, num_running=1) == []
    # 5 tokens, max_model_len 8: three more tokens at most, so two drafts
    short = SpecDecodeFeature(SpeculativeConfig(num_speculative_tokens=4), max_model_len=8)
    assert short.contribute(_decoding(), budget=100, num_running=1) == [6, 7]
    # a batch at disable_by_batch_size drafts nothing
    capped = SpecDecodeFeature(SpeculativeConfig(disable_by_batch_size=4), max_model_len=64)
    assert capped.contribute(_decoding(), budget=100, num_running=3) == [6, 7, 8, 9]
    assert capped.contribute(_decoding(), budget=100, num_running=4) == []
    # (a constrained request's drafts are cut to what its grammar accepts: test_spec_structured.py)


def test_auto_off_after_a_window_of_low_acceptance_then_a_probe():
    spec = SpeculativeConfig(num_speculative_tokens=4, auto_off_threshold=0.3, auto_off_window=4, auto_off_probe_steps=5)
    sched = SpecDecodeFeature(spec, max_model_len=64)
    r = _decoding()
    for _ in range(3):
        sched.record("a", 4, 0)  # nothing accepted, but the window is not full yet
        assert not sched.is_off("a")
    sched.record("a", 4, 1)  # window mean 1/16 < 0.3: off
    assert sched.is_off("a")
    assert [sched.contribute(r, 100, 1) for _ in range(5)] == [[]] * 5
    assert sched.contribute(r, 100, 1) == [6, 7, 8, 9]  # the probe
    for _ in range(10):  # good acceptance keeps it on
        sched.record("a", 4, 3)
        assert not sched.is_off("a")
    assert sched.counts.num_drafts == 14 and sched.counts.num_draft_tokens == 56
    assert sched.counts.num_accepted_tokens == 31
    assert sched.counts.num_accepted_tokens_per_pos == [11, 10, 10, 0]


def test_failed_probes_back_off():
    spec = SpeculativeConfig(auto_off_threshold=0.5, auto_off_window=8, auto_off_probe_steps=3)
    sched = SpecDecodeFeature(spec, max_model_len=64)
    r = _decoding()
    offs = []
    for _ in range(5):
        while not sched.is_off("a"):
            sched.record("a", 4, 0)
        n = 0
        while sched.contribute(r, 100, 1) == []:
            n += 1
        offs.append(n)
    # off for 3, 6, 12, 24, 24 steps; each probe judged on 2 drafted steps
    assert offs == [3, 6, 12, 24, 24]
    assert sched.counts.num_drafts == 8 + 4 * 2


def test_auto_off_threshold_zero_never_turns_off():
    sched = SpecDecodeFeature(SpeculativeConfig(auto_off_threshold=0.0, auto_off_window=2), max_model_len=64)
    for _ in range(20):
        sched.record("a", 4, 0)
    assert not sched.is_off("a")
