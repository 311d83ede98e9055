"""Incremental detokenization and stop strings, token by token as the engine feeds them."""

from __future__ import annotations

import pytest

from host.contracts.sampling_params import SamplingParams
from host.core.frontend.detokenizer import IncrementalDetokenizer, check_stop_strings


@pytest.fixture(scope="module")
def tok():
    from host.core.models.default_model import resolve_model_path
    from host.core.models.tokenizer import get_tokenizer

    return get_tokenizer(resolve_model_path(None))


class SlowOnly:
    """A tokenizer without a Rust backend: forces the prefix / read-offset path."""

    def __init__(self, inner):
        self.inner = inner

    def decode(self, ids, **kwargs):
        kwargs.pop("spaces_between_special_tokens", None)
        return self.inner.decode(ids, **kwargs)


def stream(detok: IncrementalDetokenizer, ids: list[int], stop_at_end: bool = False) -> tuple[list[str], str | None]:
    """Feed ``ids`` one at a time; returns the streamed deltas and the stop string hit."""
    deltas = []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        hit = detok.update([t], stop_terminated=stop_at_end and last)
        finished = hit is not None or last
        deltas.append(detok.get_next_output_text(finished, delta=True))
        if hit is not None:
            return deltas, hit
    return deltas, None


@pytest.mark.parametrize("slow", [False, True])
def test_emoji_and_cjk_never_show_replacement_characters(tok, slow):
    text = "Grüße 😀 日本語のテキスト, 🚀🚀 and ok"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(SlowOnly(tok) if slow else tok, SamplingParams())
    deltas, hit = stream(detok, ids)
    assert hit is None
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text == detok.output_text
    assert any(d == "" for d in deltas), "some tokens end mid-character and must show nothing yet"


def test_byte_fallback_tokens():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "a": 1, "▁": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    ids = [1] + [3 + b for b in "日本".encode()] + [1]
    for t in (tok, SlowOnly(tok)):
        deltas, _ = stream(IncrementalDetokenizer(t, SamplingParams()), ids)
        assert all("\ufffd" not in d for d in deltas)
        assert "".join(deltas) == "a日本a"


def test_stop_string_split_across_tokens(tok):
    text = "The quick brown fox jumps over the lazy dog"
    ids = tok.encode(text, add_special_tokens=False)
    stop = "ps ov"  # straddles the tokens of "jumps" and "over"
    detok = IncrementalDetokenizer(tok, SamplingParams(stop=[stop]))
    deltas, hit = stream(detok, ids)
    assert hit == stop
    assert detok.output_text == "The quick brown fox jum"
    assert "".join(deltas) == detok.output_text
    inc = IncrementalDetokenizer(tok, SamplingParams(stop=[stop], include_stop_str_in_output=True))
    deltas, hit = stream(inc, ids)
    assert inc.output_text == "The quick brown fox jumps ov" == "".join(deltas)


def test_streaming_never_shows_a_stop_string_prefix(tok):
    text = "one two three four five six"
    ids = tok.encode(text, add_special_tokens=False)
    stop = "four fiv"
    detok = IncrementalDetokenizer(tok, SamplingParams(stop=[stop]))
    deltas, hit = stream(detok, ids)
    shown = ""
    for d in deltas:
        shown += d
        assert "four" not in shown or hit is None, "held-back text leaked"
    assert hit == stop and shown == "one two three "
    # a stop string prefix that does not complete is released at the end
    detok = IncrementalDetokenizer(tok, SamplingParams(stop=["six seven"]))
    deltas, hit = stream(detok, ids)
    assert hit is None and "".join(deltas) == text
    assert detok.stop_buffer_length == len("six seven") - 1


def test_earliest_completing_stop_wins():
    assert check_stop_strings("Hello world", 11, ["world", "lo w"], False) == ("lo w", 3)
    assert check_stop_strings("Hello world", 11, ["world", "lo w"], True) == ("lo w", 7)
    assert check_stop_strings("Hello world", 2, ["Hello"], False) is None  # old text is not rescanned
    assert check_stop_strings("Hello world", 11, ["world"], True) == ("world", -1)


def test_no_stop_check_before_min_tokens(tok):
    text = "stop here and stop there"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, SamplingParams(stop=["stop"], min_tokens=2))
    _, hit = stream(detok, ids)
    assert hit == "stop" and detok.output_text == "stop here and "


def test_stop_token_is_left_out_of_the_text_unless_included(tok):
    ids = tok.encode("Hi there", add_special_tokens=False) + [tok.encode(" end", add_special_tokens=False)[0]]
    detok = IncrementalDetokenizer(tok, SamplingParams())
    stream(detok, ids, stop_at_end=True)
    assert detok.output_text == "Hi there" and len(detok.token_ids) == len(ids)
    inc = IncrementalDetokenizer(tok, SamplingParams(include_stop_str_in_output=True))
    stream(inc, ids, stop_at_end=True)
    assert inc.output_text == "Hi there end"


def test_invalid_token_id_does_not_crash(tok):
    detok = IncrementalDetokenizer(tok, SamplingParams())
    detok.update([tok.encode("a", add_special_tokens=False)[0]], False)
    detok.update([10**12], False)
    detok.update(tok.encode(" b", add_special_tokens=False), False)
    assert detok.output_text == "a b"


def test_first_token_spacing_uses_the_prompt(tok):
    prompt = tok.encode("Say:", add_special_tokens=False)
    ids = tok.encode(" hello world", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, SamplingParams(), prompt)
    stream(detok, ids)
    assert detok.output_text == " hello world"
