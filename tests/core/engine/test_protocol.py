"""The engine messages are one type each, in-process and on the wire: what the front end
encodes is what the engine core decodes, field for field, and back."""

from __future__ import annotations

import msgspec
import pytest

from host.contracts.messages import (
    AbortRequests,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    SchedulerStats,
    Shutdown,
    TokenLogprobs,
    UtilityCall,
    UtilityResult,
    encoder,
    from_engine_decoder,
    to_engine_decoder,
)
from host.contracts.sampling_params import SamplingParams, StructuredOutputsParams


def test_request_round_trip_rebuilds_sampling_params():
    params = SamplingParams(
        n=2, temperature=0.7, top_k=5, stop="END", logit_bias={3: 1.5, 7: -2.0}, seed=11,
        structured_outputs={"regex": "a+b"}, bad_words=["x"], max_tokens=9,
    )
    params.bad_words_token_ids = [[4, 5]]
    request = EngineCoreRequest("r1", [1, 2, 3], params, eos_token_id=2, arrival_time=12.5, priority=-1, cache_salt="s")
    back = to_engine_decoder.decode(encoder.encode(request))
    assert isinstance(back, EngineCoreRequest) and isinstance(back.sampling_params, SamplingParams)
    assert back.sampling_params == params
    assert isinstance(back.sampling_params.structured_outputs, StructuredOutputsParams)
    assert back.sampling_params.logit_bias == {3: 1.5, 7: -2.0}
    assert (back.request_id, back.prompt_token_ids, back.eos_token_id, back.arrival_time, back.priority, back.cache_salt) == (
        "r1", [1, 2, 3], 2, 12.5, -1, "s"
    )


def test_params_are_revalidated_when_decoded():
    raw = encoder.encode({"type": "add", "request_id": "r", "prompt_token_ids": [1], "sampling_params": {"temperature": -1.0}})
    with pytest.raises(msgspec.ValidationError, match="temperature"):
        to_engine_decoder.decode(raw)


@pytest.mark.parametrize("msg", [AbortRequests(["a", "b"]), UtilityCall(3, "plugins", [1, "x"]), Shutdown()])
def test_control_messages_share_one_decoder(msg):
    assert to_engine_decoder.decode(encoder.encode(msg)) == msg


def test_outputs_round_trip():
    lp = TokenLogprobs([5, 6], [-0.1, -2.3], 1)
    out = EngineCoreOutputs(
        outputs=[
            EngineCoreOutput("a", [5], new_logprobs=[lp]),
            EngineCoreOutput("b", [], finish_reason="abort", error="bad grammar"),
            EngineCoreOutput("c", [9, 10], finish_reason="stop", stop_reason=10, num_cached_tokens=16),
        ],
        scheduler_stats=SchedulerStats(num_running_reqs=2, kv_cache_usage=0.25, prefix_cache_hit_rate=0.5),
        utility=UtilityResult(1, result={"pid": 1}),
        timestamp=3.0,
    )
    back = from_engine_decoder.decode(encoder.encode(out))
    assert back == out
    assert [o.finished for o in back.outputs] == [False, True, True]


def test_only_protocol_types_are_encoded():
    with pytest.raises(NotImplementedError, match="object"):
        encoder.encode(UtilityResult(1, result=object()))
