"""Tokenizing very large texts in a child process, so the API process's GIL stays free.

A fast tokenizer releases the GIL while it splits a text, but turning two million token ids into
Python ints (``Encoding.ids``), freeing the Rust encoding and rendering the ids as JSON hold it for
~170 ms in one piece: the event loop (``/health`` included) waits that long. A text of at least
:data:`LARGE_TEXT_CHARS` characters is therefore tokenized by a single child process (a
``ProcessPoolExecutor`` of one spawned worker, started at the first such text, that loads the
tokenizer once and dies with the API process). It sends back the count and the ids as packed
int32 bytes or as JSON bytes: copying those is all the API process does, and it makes Python ints
only of prompts the engine accepts (at most ``max_model_len`` of them).

Smaller texts, and tokenizers that cannot be loaded again from a path, are tokenized in the
calling thread. Every call here blocks: run it in :func:`.common.off_loop`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from array import array
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import msgspec

from host.sdk.runtime import die_with_parent, get_tokenizer

logger = logging.getLogger("host.api")

LARGE_TEXT_CHARS = 1 << 20
"""A text this long or longer is tokenized in the child process."""

_CHILD_TOKENIZER: Any = None


def _child_init(path: str, parent_pid: int, death_pipe: Any) -> None:
    global _CHILD_TOKENIZER
    die_with_parent(parent_pid, death_pipe, use_pdeathsig=False)
    _CHILD_TOKENIZER = get_tokenizer(path)


def _child_encode(text: str, add_special_tokens: bool, as_json: bool) -> tuple[int, bytes]:
    ids = _CHILD_TOKENIZER.encode(text, add_special_tokens=add_special_tokens)
    return len(ids), msgspec.json.encode(ids) if as_json else array("i", ids).tobytes()


class TokenizerProcess:
    """The child that tokenizes large texts with the tokenizer at ``path`` (``None``: there is
    no path to load it from, and every text is tokenized in the caller's thread)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._pool: ProcessPoolExecutor | None = None
        self._death_pipe: Any = None
        self._lock = threading.Lock()

    def handles(self, text: str) -> bool:
        """Whether ``text`` goes to the child."""
        return self.path is not None and len(text) >= LARGE_TEXT_CHARS

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                ctx = multiprocessing.get_context("spawn")
                reader, self._death_pipe = ctx.Pipe(duplex=False)
                self._pool = ProcessPoolExecutor(
                    1, mp_context=ctx, initializer=_child_init, initargs=(self.path, os.getpid(), reader),
                )
                logger.info("large texts are tokenized in a child process (%s)", self.path)
            return self._pool

    def encode(self, text: str, add_special_tokens: bool) -> tuple[int, bytes]:
        """``(count, ids as native int32 bytes)`` of ``text``, tokenized in the child."""
        return self._executor().submit(_child_encode, text, add_special_tokens, False).result()

    def encode_json(self, text: str, add_special_tokens: bool) -> tuple[int, bytes]:
        """``(count, the ids as a JSON array)`` of ``text``, tokenized in the child."""
        return self._executor().submit(_child_encode, text, add_special_tokens, True).result()

    def shutdown(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            if self._death_pipe is not None:
                self._death_pipe.close()
                self._death_pipe = None


def ids_from_bytes(raw: bytes) -> list[int]:
    """The ids :meth:`TokenizerProcess.encode` packed."""
    ids = array("i")
    ids.frombytes(raw)
    return ids.tolist()
