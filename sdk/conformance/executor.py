"""The executor suite: an engine driven by the executor generates transformers' greedy tokens."""

from __future__ import annotations

from typing import Any, ClassVar

from host.sdk.conformance import tiny_model
from host.sdk.conformance.base import RegistrationCheck
from host.sdk.executor import Executor


class ExecutorConformance(RegistrationCheck):
    """Set ``executor`` (the :class:`Executor` subclass, registered in this process). Optional:
    ``engine_args`` (extra ``LLM`` arguments, e.g. ``{"tensor_parallel_size": 2}``)."""

    executor: ClassVar[type[Executor] | None] = None
    engine_args: ClassVar[dict[str, Any]] = {}
    registry_kind = "executors"
    group = "host.executors"

    def registered_name(self) -> str:
        return self.executor.name

    def test_has_a_name(self) -> None:
        assert self.executor is not None, "set `executor` to your Executor subclass"
        assert isinstance(self.executor.name, str) and self.executor.name

    def test_an_engine_on_it_matches_transformers_and_shuts_down(self) -> None:
        from host import LLM

        path, ps = tiny_model.tiny_llama(), tiny_model.prompts()
        want = tiny_model.hf_greedy_tokens(path, ps)
        llm = LLM(path, distributed_executor_backend=self.executor.name, **{**tiny_model.ENGINE_ARGS, **self.engine_args})
        try:
            assert tiny_model.greedy_tokens(llm, ps) == want, f"{self.executor.name}: tokens differ from transformers'"
            llm.engine.executor.check_health()
        finally:
            llm.shutdown()
        llm.shutdown()  # a second shutdown is harmless
