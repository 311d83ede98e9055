"""The IO-processor suite: payload -> prompts -> outputs -> response, with bad payloads refused clearly."""

from __future__ import annotations

from typing import Any, ClassVar

from host.sdk.conformance.base import RegistrationCheck
from host.sdk.io_processor import IOProcessor


class IOProcessorConformance(RegistrationCheck):
    """Set ``processor`` (the :class:`IOProcessor` subclass), ``payload`` (a valid request
    payload), ``bad_payloads`` (payloads ``parse_data`` must refuse with a ``ValueError``) and
    :meth:`model_outputs` (what the engine would return for the prompts ``pre_process`` made)."""

    processor: ClassVar[type[IOProcessor] | None] = None
    payload: ClassVar[Any] = None
    bad_payloads: ClassVar[list[Any]] = []
    registry_kind = "io_processors"
    group = "host.io_processors"

    def registered_name(self) -> str:
        return self.processor.name

    def make_processor(self) -> IOProcessor:
        """The instance under test (override to pass the ``config`` / ``tokenizer`` it needs)."""
        return self.processor()

    def model_outputs(self, prompts: list[Any]) -> list[Any]:
        raise NotImplementedError("return one engine output per prompt (what the engine gives back for each)")

    def test_a_payload_round_trips(self) -> None:
        assert self.processor is not None and self.processor.name, "set `processor` to your IOProcessor subclass (with a name)"
        proc = self.make_processor()
        data = proc.parse_data(self.payload)
        prompts = proc.pre_process(data, request_id="conformance-0")
        prompts = list(prompts) if isinstance(prompts, (list, tuple)) else [prompts]
        assert prompts, "pre_process made no prompt"
        for p in prompts:
            assert isinstance(p, (str, dict, list)), f"a prompt is a string, token ids or a prompt dict, not {type(p).__name__}"
        assert proc.runner in (None, "pooling", "generate"), f"runner is {proc.runner!r}; use None, 'pooling' or 'generate'"
        if proc.runner == "pooling":
            assert proc.merge_pooling_params(None, data) is not None
        else:
            assert proc.merge_sampling_params(None, data) is not None
        response = proc.post_process(self.model_outputs(prompts), request_id="conformance-0")
        assert response is not None

    def test_bad_payloads_are_value_errors(self) -> None:
        proc = self.make_processor()
        for bad in self.bad_payloads:
            try:
                proc.parse_data(bad)
            except ValueError as exc:
                assert str(exc), "the ValueError must name the bad field"
            else:
                raise AssertionError(f"parse_data accepted the bad payload {bad!r}")
