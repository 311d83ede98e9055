"""IO processor base class: turns a custom request payload into prompts and model output back
into a custom response. Runs in the API process only."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence


class IOProcessor:
    """Base class for request/response translation; ``name`` is what a model asks for."""

    name: ClassVar[str] = ""
    runner: ClassVar[str | None] = None
    """What the engine must run for it: ``"pooling"`` (its prompts are pooled; the outputs are
    :class:`host.sdk.pooling_params.PoolingRequestOutput`), ``"generate"`` (they are generated;
    request outputs with ``.outputs[0].text``) or ``None`` (whatever the served model does)."""

    def __init__(self, config: Any = None, tokenizer: Any = None) -> None:
        self.config = config
        self.tokenizer = tokenizer

    def parse_data(self, data: Any) -> Any:
        """Validate the raw request payload; raise ``ValueError`` naming the bad field."""
        return data

    def merge_sampling_params(self, params: Any = None, data: Any = None) -> Any:
        """Sampling parameters to use for this request (default: the caller's, or defaults);
        ``data`` is what :meth:`parse_data` returned for it."""
        if params is not None:
            return params
        from host.contracts.sampling_params import SamplingParams

        return SamplingParams()

    def merge_pooling_params(self, params: Any = None, data: Any = None) -> Any:
        """Pooling parameters to use for this request on a pooling model (default: the
        caller's, or the raw pooled vector, ``PoolingParams(task="encode")``)."""
        if params is not None:
            return params
        from host.contracts.pooling_params import PoolingParams

        return PoolingParams(task="encode")

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
