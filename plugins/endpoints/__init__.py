"""Built-in HTTP routes (entry point ``host.endpoints: builtin_endpoints``): the OpenAI API
(``/v1/completions``, ``/v1/chat/completions``, ``/v1/responses``, ``/v1/models``), Anthropic's
Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) and the server routes
(``/tokenize``, ``/detokenize``, ``/tokenizer_info``, ``/health``, ``/version``, ``/load``, ``/metrics``,
``/v1/plugins``), SageMaker's ``/invocations``, the LoRA adapter registry with its load/unload routes,
the pooling routes (``/v1/embeddings``, ``/pooling``, ``/v1/score``, ``/rerank``; the other runner's
routes a 400 naming the flag), each an :class:`host.sdk.EndpointPlugin` registered exactly as a third-party one would be."""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl


@hookimpl
def host_register_endpoints(register: Callable[..., None]) -> None:
    from host.plugins.endpoints.anthropic_messages import MessagesEndpoint
    from host.plugins.endpoints.chat import ChatCompletionsEndpoint
    from host.plugins.endpoints.completions import CompletionsEndpoint
    from host.plugins.endpoints.embeddings import EmbeddingsEndpoint
    from host.plugins.endpoints.lora_routes import LoRAAdaptersEndpoint
    from host.plugins.endpoints.pooling_routes import PoolingEndpoint
    from host.plugins.endpoints.responses import ResponsesEndpoint
    from host.plugins.endpoints.sagemaker import InvocationsEndpoint
    from host.plugins.endpoints.server_routes import (
        HealthEndpoint,
        LoadEndpoint,
        MetricsEndpoint,
        ModelsEndpoint,
        PluginsEndpoint,
        TokenizeEndpoint,
        TokenizerInfoEndpoint,
    )
    from host.plugins.endpoints.wrong_runner import GenerativeModelRefusals, PoolingModelRefusals

    for plugin in (
        CompletionsEndpoint(),
        ChatCompletionsEndpoint(),
        MessagesEndpoint(),
        ResponsesEndpoint(),
        ModelsEndpoint(),
        InvocationsEndpoint(),
        TokenizeEndpoint(),
        TokenizerInfoEndpoint(),
        HealthEndpoint(),
        LoadEndpoint(),
        MetricsEndpoint(),
        PluginsEndpoint(),
        LoRAAdaptersEndpoint(),
        EmbeddingsEndpoint(),
        PoolingEndpoint(),
        PoolingModelRefusals(),
        GenerativeModelRefusals(),
    ):
        register(plugin)
