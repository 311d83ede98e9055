"""Request values that used to pass the checks and break later: non-finite floats (which
disabled ``allowed_token_ids`` and grammars), integers beyond 64 bits (a 500 when the request
was encoded for the engine) and whole-vocabulary logprobs (hundreds of MB per request), each
refused up front with a ``ValueError`` naming the field."""

from __future__ import annotations

import dataclasses
import math

import pytest

from host.contracts.messages import EngineCoreRequest, encoder, to_engine_decoder
from host.contracts.sampling_params import INT64_MAX, INT64_MIN, SamplingParams
from host.core.frontend.input_processor import InputProcessor

FLOATS = ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"]


@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, float("1e400"), 10**400, 1e300, -1e39])
def test_non_finite_floats_are_refused(name, value):
    with pytest.raises(ValueError, match=f"{name}=.*finite"):
        SamplingParams(**{name: value})


def test_the_largest_float32_values_pass():
    SamplingParams(temperature=3e38, repetition_penalty=3e38)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "inf", "-inf", "nan"])
def test_non_finite_logit_bias_is_refused(value):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={"5": value})


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(seed=INT64_MAX + 1), "seed"),
        (dict(seed=INT64_MIN - 1), "seed"),
        (dict(seed=2**64), "seed"),
        (dict(seed=INT64_MAX, n=2), "seed"),  # sample 1 would draw with seed + 1
        (dict(seed=INT64_MAX - 14, n=16), "seed"),
        (dict(top_k=2**63), "top_k"),
        (dict(n=2**64), "n"),
        (dict(max_tokens=2**64), "max_tokens"),
        (dict(min_tokens=2**64, max_tokens=None), "min_tokens"),
        (dict(logprobs=2**64), "logprobs"),
        (dict(prompt_logprobs=2**64), "prompt_logprobs"),
        (dict(stop_token_ids=[2**64]), "stop_token_ids"),
        (dict(allowed_token_ids=[2**64]), "allowed_token_ids"),
        (dict(logit_bias={str(2**64): 1.0}), "logit_bias"),
    ],
)
def test_integers_beyond_64_bits_are_refused_with_the_range(kwargs, name):
    with pytest.raises(ValueError, match=rf"{name}.*\[-?\d+, {INT64_MAX - kwargs.get('n', 1) + 1 if name == 'seed' else INT64_MAX}\]"):
        SamplingParams(**kwargs)


def test_the_extremes_that_pass_cross_to_the_engine():
    """What validation lets through encodes for the engine process and decodes to the same
    values (the 500 was msgspec refusing an int beyond 64 bits)."""
    params = SamplingParams(n=16, seed=INT64_MAX - 15, top_k=INT64_MAX, max_tokens=INT64_MAX, min_tokens=3,
                            stop_token_ids=[INT64_MAX], logit_bias={INT64_MAX: 1.0})
    for i in range(params.n):
        child = params.clone_for_sample(i)
        request = EngineCoreRequest(f"r-{i}", [1, 2], child, priority=INT64_MIN)
        back = to_engine_decoder.decode(encoder.encode(request))
        assert back.sampling_params.seed == INT64_MAX - 15 + i and back.priority == INT64_MIN
        assert back.sampling_params.top_k == INT64_MAX
    with pytest.raises(OverflowError):  # the failure the checks now prevent
        encoder.encode(EngineCoreRequest("r", [1], SamplingParams(), priority=2**64))


@pytest.fixture(scope="module")
def engine_config(tiny_checkpoint):
    from host.core.engine_args import EngineArgs

    path = tiny_checkpoint("llama", weights=False)
    return EngineArgs(model=str(path), skip_tokenizer_init=True, max_model_len=64).create_engine_config()


def _processor(config, max_logprobs=None):
    if max_logprobs is not None:
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, max_logprobs=max_logprobs))
    return InputProcessor(config, None)


@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
def test_max_logprobs_bounds_logprobs_and_prompt_logprobs(engine_config, name):
    default = _processor(engine_config)
    assert default.max_logprobs == 20  # vLLM's default
    default.validate([1, 2, 3], SamplingParams(**{name: 20}))
    for asked in (21, -1):  # -1: the whole vocabulary
        with pytest.raises(ValueError, match=f"{name}.*--max-logprobs"):
            default.validate([1, 2, 3], SamplingParams(**{name: asked}))
    with pytest.raises(ValueError, match="at most 5 .*--max-logprobs"):
        _processor(engine_config, 5).validate([1, 2, 3], SamplingParams(**{name: 6}))
    unlimited = _processor(engine_config, -1)
    vocab = unlimited.vocab_size
    unlimited.validate([1, 2, 3], SamplingParams(**{name: -1}))
    unlimited.validate([1, 2, 3], SamplingParams(**{name: vocab}))


def test_max_logprobs_is_an_engine_flag():
    from host.core.config import ModelConfig
    from host.core.engine_args import EngineArgs

    assert EngineArgs.from_kwargs(max_logprobs=-1).max_logprobs == -1
    with pytest.raises(ValueError, match="max_logprobs"):
        ModelConfig(max_logprobs=-2)


@pytest.mark.parametrize("priority", [2**63, -(2**63) - 1, 2**100, "1", 1.5, True])
def test_priority_is_a_64_bit_integer(engine_config, priority):
    with pytest.raises(ValueError, match="priority"):
        _processor(engine_config).process("r", [1, 2], SamplingParams(), priority=priority)
    request = _processor(engine_config).process("r", [1, 2], SamplingParams(), priority=INT64_MIN)
    assert to_engine_decoder.decode(encoder.encode(request)).priority == INT64_MIN


def test_vllms_words_for_bad_values(engine_config):
    """The words vLLM's errors carry, which clients and vLLM's tests match: pydantic's type of the
    bound an integer broke, "decoder prompt cannot be empty" (vLLM's LLM test), "out of
    vocabulary" (its prompt-validation test)."""
    with pytest.raises(ValueError, match=r"seed=.*\[type=greater_than_equal\]"):
        SamplingParams(seed=INT64_MIN - 1)
    with pytest.raises(ValueError, match=r"seed=.*\[type=less_than_equal\]"):
        SamplingParams(seed=INT64_MAX + 1)
    processor = _processor(engine_config)
    with pytest.raises(ValueError, match="decoder prompt cannot be empty"):
        processor.normalize_prompts([{"prompt_token_ids": [1]}, {"prompt_token_ids": []}])
    with pytest.raises(ValueError, match="decoder prompt cannot be empty"):
        processor.validate([], SamplingParams())
    with pytest.raises(ValueError, match="out of vocabulary"):
        processor.normalize_prompts({"prompt_token_ids": [999999]})
