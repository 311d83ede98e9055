"""Structured outputs: JSON schema, any JSON object, regex, choice and EBNF grammar constraints,
enforced as a token bitmask in the sampler. The grammar engine is xgrammar.

The :class:`StructuredOutputManager` lives in the engine core. A constrained request is
compiled in a thread pool (half the CPU cores) while it waits in
``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR``; the scheduler skips it until the grammar is ready
(a compile error finishes it with the error). Every step, the manager fills one bitmask row
(one bit per token, 32 tokens per int32 word, ``-1`` = all allowed) for each constrained
request that samples a token this step; the model runner turns the rows into a ``-inf`` mask
before any other logits processor. Sampled tokens are then fed back to the request's grammar
matcher.

With ``reasoning_end_token_ids`` (a reasoning parser's end tag) the constraint waits: until the
output has generated those tokens in a row, the request's bitmask row stays all-allowed and its
tokens are not fed to the matcher; the tokens after the end tag are the grammar's first. A prompt that already holds the end tag
(a template's closed, empty reasoning) starts the grammar at once, as vLLM does.

JSON schemas are compiled without free whitespace between tokens (``any_whitespace=False``):
small models otherwise tend to emit whitespace until ``max_tokens`` runs out, which is never
valid JSON.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

import torch

from host.contracts.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    from host.contracts.request import Request

logger = logging.getLogger("host.structured_output")


class StructuredOutputRequest:
    """A request's constraint and, once compiled, its grammar matcher."""

    def __init__(self, params: StructuredOutputsParams, future: Future) -> None:
        self.params = params
        self.future = future
        self.matcher: Any = None
        self.error: str | None = None
        self.reasoning_end = list(params.reasoning_end_token_ids or [])
        self.active = not self.reasoning_end  # the grammar constrains from this token on
        self._tail: list[int] = []  # the last generated tokens, to spot the end tag

    def _tail_after(self, tail: list[int], token: int) -> list[int]:
        """The last generated tokens after ``token``, as many as the end tag has."""
        return (tail + [token])[-len(self.reasoning_end):]

    def see_reasoning_token(self, token: int) -> None:
        """One token generated while the reasoning runs; it activates the grammar when it
        completes the end tag."""
        self._tail = self._tail_after(self._tail, token)
        if self._tail == self.reasoning_end:
            self.active = True

    def walk_drafts(self, drafts: list[int], fill: Callable[[int], None] | None = None) -> int:
        """How many of ``drafts`` (a prefix) the constraint accepts after the tokens seen so far;
        the request's state is as before when this returns. ``fill(j)``, when given, is called
        for each position ``j`` (0 .. the accepted count) at which the grammar constrains the
        token (active, not terminated), while the matcher stands after drafts ``0..j-1``: it
        fills that position's bitmask row. Drafts inside the reasoning are not checked, and
        one that completes the end tag activates the grammar for the drafts after it."""
        active, tail = self.active, list(self._tail)
        advanced = 0
        try:
            for j in range(len(drafts) + 1):
                if active and fill is not None and not self.matcher.is_terminated():
                    fill(j)
                if j == len(drafts):
                    return j
                token = drafts[j]
                if not active:
                    tail = self._tail_after(tail, token)
                    active = tail == self.reasoning_end
                elif not self.matcher.is_terminated():
                    if not self.matcher.accept_token(token):
                        return j
                    advanced += 1
            return len(drafts)
        finally:
            if advanced:
                self.matcher.rollback(advanced)

    def ready(self) -> bool:
        """Whether compilation finished (successfully or with ``error`` set)."""
        if self.matcher is not None or self.error is not None:
            return True
        if not self.future.done():
            return False
        exc = self.future.exception()
        if exc is not None:
            self.error = f"structured_outputs.{self.params.kind} could not be compiled: {exc}"
        else:
            self.matcher = self.future.result()
        return True


def contains(ids: list[int], seq: list[int]) -> bool:
    """Whether ``seq`` occurs in ``ids`` as consecutive tokens."""
    n = len(seq)
    first = seq[0]
    return any(ids[i] == first and list(ids[i:i + n]) == seq for i in range(len(ids) - n + 1))


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar accepting exactly one of ``choices`` (string literals JSON-escaped)."""
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


class StructuredOutputManager:
    """Compiles constraints off the scheduling thread and fills the per-step bitmask."""

    def __init__(self, tokenizer_path: str, vocab_size: int, max_workers: int | None = None) -> None:
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        workers = max_workers or max(1, (os.cpu_count() or 2) // 2)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="host-grammar")
        self._compiler: Any = None
        self._lock = threading.Lock()
        self.words = (vocab_size + 31) // 32

    # -- compilation ----------------------------------------------------------------------------
    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                from host.core.models.tokenizer import get_tokenizer

                tokenizer = get_tokenizer(self.tokenizer_path)
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def _compile(self, params: StructuredOutputsParams) -> Any:
        import xgrammar as xgr

        compiler = self._get_compiler()
        kind = params.kind
        if kind == "json":
            schema = params.json if not isinstance(params.json, bool) else {}
            compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        elif kind == "json_object":
            compiled = compiler.compile_builtin_json_grammar()
        elif kind == "regex":
            compiled = compiler.compile_regex(params.regex)
        elif kind == "choice":
            compiled = compiler.compile_grammar(choice_grammar(params.choice or []))
        else:
            compiled = compiler.compile_grammar(params.grammar)
        return xgr.GrammarMatcher(compiled)

    def grammar_init(self, request: "Request") -> None:
        """Start compiling the request's constraint (the request waits until it is done)."""
        params = request.sampling_params.structured_outputs
        assert params is not None
        so = StructuredOutputRequest(params, self._executor.submit(self._compile, params))
        if so.reasoning_end and contains(request.prompt_token_ids, so.reasoning_end):
            so.active = True  # the prompt already closed the reasoning (a template's "no thinking" turn)
        request.structured_output = so

    # -- every step -----------------------------------------------------------------------------
    def grammar_bitmask(self, requests: list["Request"], drafts: list[list[int]] | None = None) -> torch.Tensor:
        """int32 ``[sum(1 + len(drafts[i])), ceil(vocab / 32)]``, request by request: request
        ``i``'s row ``j`` allows the tokens its grammar accepts after its tokens so far plus its
        scheduled drafts ``0..j-1`` (speculative decoding; one row per request without drafts).
        A row is all set where the grammar does not constrain (terminated, reasoning not over)."""
        drafts = drafts if drafts is not None else [[] for _ in requests]
        bitmask = torch.full((sum(1 + len(d) for d in drafts), self.words), -1, dtype=torch.int32)
        row = 0
        for request, request_drafts in zip(requests, drafts):
            so = request.structured_output
            if so is not None and so.matcher is not None:
                first = row
                so.walk_drafts(request_drafts, lambda j: so.matcher.fill_next_token_bitmask(bitmask, first + j))
            row += 1 + len(request_drafts)
        return bitmask

    @staticmethod
    def valid_drafts(request: "Request", drafts: list[int]) -> list[int]:
        """The longest prefix of ``drafts`` that the request's constraint accepts (all of them
        for an unconstrained request): a draft the grammar refuses could never be emitted."""
        so = request.structured_output
        if so is None or so.matcher is None or not drafts:
            return drafts
        return drafts[: so.walk_drafts(drafts)]

    @staticmethod
    def accept_tokens(request: "Request", token_ids: list[int]) -> bool:
        """Advance the request's grammar; False if a token is not allowed (it then stays put)."""
        so = request.structured_output
        if so is None or so.matcher is None:
            return True
        for tok in token_ids:
            if not so.active:
                so.see_reasoning_token(tok)
                continue
            if so.matcher.is_terminated():
                return True
            if not so.matcher.accept_token(tok):
                return False
        return True

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
