"""IO processor base class: turns a custom request payload into prompts and model output back
into a custom response. Runs in the API process only."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence


class IOProcessor:
    """Base class for request/response translation; ``name`` is what a model asks for."""

    name: ClassVar[str] = ""

    def __init__(self, config: Any = None, tokenizer: Any = None) -> None:
        self.config = config
        self.tokenizer = tokenizer

    def parse_data(self, data: Any) -> Any:
        """Validate the raw request payload; raise ``ValueError`` naming the bad field."""
        return data

    def merge_sampling_params(self, params: Any = None) -> Any:
        """Sampling parameters to use for this request (default: the caller's, or defaults)."""
        if params is not None:
            return params
        from host.core.sampling_params import SamplingParams

        return SamplingParams()

    def pre_process(self, prompt: Any, request_id: str | None = None, **kwargs: Any) -> Any | Sequence[Any]:
        """Payload -> one prompt or a list of prompts."""
        raise NotImplementedError

    def post_process(self, model_output: Sequence[Any], request_id: str | None = None, **kwargs: Any) -> Any:
        """Model outputs -> the response object."""
        raise NotImplementedError

    async def pre_process_async(self, prompt: Any, request_id: str | None = None, **kwargs: Any) -> Any:
        return self.pre_process(prompt, request_id, **kwargs)

    async def post_process_async(self, model_output: Sequence[Any], request_id: str | None = None, **kwargs: Any) -> Any:
        return self.post_process(model_output, request_id, **kwargs)
