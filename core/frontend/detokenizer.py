"""Incremental detokenization and stop strings.

Text is built one token at a time, never by re-decoding the whole output. With a fast
(Rust) tokenizer this uses ``tokenizers.decoders.DecodeStream``, which holds back the bytes of
a character split across tokens (multi-byte UTF-8, byte-fallback tokens) until it is
complete, so no replacement character ever appears mid-stream. Other tokenizers use the
prefix / read offset method: decode a short window of tokens twice and emit the difference
once it no longer ends in an incomplete character.

Stop strings are searched only in the new characters plus the ``len(stop) - 1`` characters
before them (a stop string can straddle tokens), the earliest-completing match wins, and no
search runs while fewer than ``min_tokens`` tokens exist. While a request runs, the last
``max_stop_len - 1`` characters are held back from what is streamed: they could be the
start of a stop string that must not be shown.
"""

from __future__ import annotations

import logging
from typing import Any

from host.contracts.sampling_params import SamplingParams

logger = logging.getLogger("host.detokenizer")

_PRIME_TOKENS = 6  # prompt tokens fed to the decoder first, so the first output token's spacing is right


def check_stop_strings(text: str, new_char_count: int, stop: list[str], include_in_output: bool) -> tuple[str, int] | None:
    """Find a stop string completed by the last ``new_char_count`` characters of ``text``.

    Returns ``(stop_string, truncate_at)`` for the earliest-completing match, where
    ``truncate_at`` is the length the text keeps (``-1``: keep it all), or ``None``."""
    if not new_char_count or not stop:
        return None
    best: tuple[int, str, int] | None = None  # (end of match, stop, truncate_at)
    for stop_str in stop:
        start = max(0, len(text) - new_char_count - len(stop_str) + 1)
        idx = text.find(stop_str, start)
        if idx == -1:
            continue
        end = idx + len(stop_str)
        if best is None or end < best[0]:
            cut = end if include_in_output else idx
            best = (end, stop_str, -1 if cut >= len(text) else cut)
    if best is None:
        return None
    return best[1], best[2]


class IncrementalDetokenizer:
    """Text of one sequence, grown token by token, with stop-string handling.

    ``update`` feeds new tokens and returns the stop string that ended the sequence, if any;
    ``get_next_output_text`` gives what may be shown so far (all of it once finished).
    """

    def __init__(self, tokenizer: Any, params: SamplingParams, prompt_token_ids: list[int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop = list(params.stop)
        self.include_stop_str_in_output = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        self.skip_special_tokens = params.skip_special_tokens
        self.spaces_between_special_tokens = params.spaces_between_special_tokens
        self.stop_buffer_length = (
            max(len(s) for s in self.stop) - 1 if self.stop and not self.include_stop_str_in_output else 0
        )
        self.token_ids: list[int] = []
        self.num_dropped = 0  # new tokens of the last update after the stop string that ended it
        self.output_text = ""
        self._last_output_text_offset = 0
        self._stop_check_offset = 0
        self._prime = list(prompt_token_ids or [])[-_PRIME_TOKENS:]
        self._backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        self._stream: Any = None
        if self._backend is not None:
            self._stream = self._new_stream()
        # slow path state: decode window [prefix_offset, ...) of prime + output tokens
        self._all = list(self._prime)
        self._prefix_offset = 0
        self._read_offset = len(self._all)

    # -- decoding -------------------------------------------------------------------------------
    def _new_stream(self) -> Any:
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
        for tok in self._prime:  # prime with prompt context (output discarded)
            try:
                stream.step(self._backend, tok)
            except Exception:  # noqa: BLE001 - a bad prime only costs spacing of the first token
                return DecodeStream(skip_special_tokens=self.skip_special_tokens)
        return stream

    def _decode_next(self, token_id: int) -> str:
        if self._stream is None:
            return self._slow_step(token_id)
        try:
            piece = self._stream.step(self._backend, token_id)
        except (OverflowError, TypeError) as exc:
            logger.warning("cannot detokenize token id %r: %s", token_id, exc)
            return ""
        except Exception as exc:  # noqa: BLE001
            if str(exc).startswith("Invalid prefix"):
                # the stream lost UTF-8 monotonicity: rebuild it from the tokens so far
                self._prime = (self._prime + self.token_ids[:-1])[-_PRIME_TOKENS:]
                self._stream = self._new_stream()
                piece = self._stream.step(self._backend, token_id)
            else:
                raise
        return piece or ""

    def _slow_step(self, token_id: int) -> str:
        self._all.append(token_id)
        kwargs = {"skip_special_tokens": self.skip_special_tokens}
        if not self.spaces_between_special_tokens:
            kwargs["spaces_between_special_tokens"] = False
        try:
            prefix = self.tokenizer.decode(self._all[self._prefix_offset : self._read_offset], **kwargs)
            full = self.tokenizer.decode(self._all[self._prefix_offset :], **kwargs)
        except (OverflowError, TypeError, IndexError) as exc:
            logger.warning("cannot detokenize token id %r: %s", token_id, exc)
            self._all.pop()
            return ""
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._all)
            return full[len(prefix) :]
        return ""

    # -- the sequence -------------------------------------------------------------------------
    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Append tokens; ``stop_terminated``: the last one is EOS or a stop token id, which is
        kept out of the text unless ``include_stop_str_in_output``. Returns the stop string
        that finished the sequence (the text is already truncated), or ``None``.

        Several tokens at once (speculative decoding) are checked one by one: a stop string ends
        the sequence at the token that completes it, and ``num_dropped`` says how many of the
        new tokens came after it (the caller drops them, as if they had never been sampled)."""
        self.num_dropped = 0
        if self.stop and len(new_token_ids) > 1:
            for n, tok in enumerate(new_token_ids):
                last = n == len(new_token_ids) - 1
                hit = self.update([tok], stop_terminated and last)
                if hit is not None:
                    self.num_dropped = len(new_token_ids) - n - 1
                    return hit
            return None
        shown = new_token_ids
        if stop_terminated and not self.include_stop_str_in_output and new_token_ids:
            shown = new_token_ids[:-1]
        checked_from = max(len(self.output_text), self._stop_check_offset)
        for tok in shown:
            self.token_ids.append(tok)
            self.output_text += self._decode_next(tok)
            if len(self.token_ids) <= self.min_tokens:
                self._stop_check_offset = len(self.output_text)  # text of the first min_tokens is never checked
        if len(shown) < len(new_token_ids):
            self.token_ids.append(new_token_ids[-1])  # counted, not shown
        checked_from = max(checked_from, self._stop_check_offset)
        if stop_terminated or not self.stop:
            return None
        hit = check_stop_strings(self.output_text, len(self.output_text) - checked_from, self.stop, self.include_stop_str_in_output)
        if hit is None:
            return None
        stop_str, cut = hit
        if cut != -1:
            self.output_text = self.output_text[:cut]
        return stop_str

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to show: everything once finished; while running, all but the last
        ``stop_buffer_length`` characters. ``delta``: only what was not returned before."""
        end = len(self.output_text) if finished else max(0, len(self.output_text) - self.stop_buffer_length)
        if not delta:
            return self.output_text[:end]
        start = self._last_output_text_offset
        if end <= start:
            return ""
        self._last_output_text_offset = end
        return self.output_text[start:end]
