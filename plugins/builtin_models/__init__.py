"""Built-in model architectures (entry point ``host.models: builtin_models``).

Registered as lazy ``"module:Class"`` strings so no model code is imported until a model of
that architecture is loaded. The implementation lives in ``host.core.models``.
"""

from __future__ import annotations

from typing import Callable

from host.sdk import hookimpl

ARCHITECTURES = {
    "LlamaForCausalLM": "host.core.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "host.core.models.llama:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "host.core.models.llama:Qwen3ForCausalLM",
    "MistralForCausalLM": "host.core.models.mistral:MistralForCausalLM",
    "MinistralForCausalLM": "host.core.models.mistral:MinistralForCausalLM",
    "Phi3ForCausalLM": "host.core.models.phi3:Phi3ForCausalLM",
    "Gemma2ForCausalLM": "host.core.models.gemma:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "host.core.models.gemma:Gemma3ForCausalLM",
    "Qwen2MoeForCausalLM": "host.core.models.moe_models:Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM": "host.core.models.moe_models:Qwen3MoeForCausalLM",
    "MixtralForCausalLM": "host.core.models.moe_models:MixtralForCausalLM",
    "OlmoeForCausalLM": "host.core.models.moe_models:OlmoeForCausalLM",
    "GptOssForCausalLM": "host.core.models.gpt_oss:GptOssForCausalLM",
    "BertModel": "host.core.models.bert:BertModel",  # an encoder: --runner pooling (docs/pooling.md)
}


@hookimpl
def host_register_models(register: Callable[..., None]) -> None:
    for arch, target in ARCHITECTURES.items():
        register(arch, target)


EPLB_POLICIES = {"greedy": "host.core.moe.eplb.greedy:GreedyPolicy"}


@hookimpl
def host_register_eplb_policies(register: Callable[..., None]) -> None:
    for name, target in EPLB_POLICIES.items():
        register(name, target)
