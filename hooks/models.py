"""Hooks of the ``host.models`` family: model architectures.

Loaded on first use in the engine process (which resolves the architecture a checkpoint names,
to size the KV cache and pick the implementation) and in worker processes (which build the model
and load its weights); ``host plugins list`` loads it to show every architecture. Host's own
architectures (Llama, Qwen, Mistral, Gemma, Phi-3, BERT) register through this group exactly as a
third-party package does.
"""

from __future__ import annotations

from typing import Callable

from host.hooks.markers import hookspec

# this family's entry-point group and where it loads (gathered by host.hooks.groups)
GROUP = "host.models"
LOADED_IN = ("api", "engine", "worker")
LAZY_IN: tuple[str, ...] = ("api", "engine", "worker")
SUMMARY = "model architectures (native implementations)"


@hookspec
def host_register_models(register: Callable[..., None]) -> None:
    """Register model architectures with the host's model registry.

    Call ``register(architecture, model_class)`` once per architecture, where ``architecture`` is
    the string found in a Hugging Face ``config.json`` ``architectures`` list (for example
    ``"LlamaForCausalLM"``) and ``model_class`` is the class itself or a lazy
    ``"package.module:ClassName"`` string, imported only when a model of that architecture is
    loaded. The class follows :class:`host.sdk.models.ModelForCausalLM` (built as
    ``Cls(hf_config, dtype, attn_backend)``, ``forward(input_ids, positions)``,
    ``compute_logits``, ``load_weights``). A registered architecture is served natively; any other
    ``*ForCausalLM`` goes to the transformers fallback (``--model-impl``). Registering a name
    that another plugin already registered is an error naming both plugins.
    """


@hookspec
def host_register_eplb_policies(register: Callable[..., None]) -> None:
    """Register expert-load rebalancing policies for mixture-of-experts models (``--enable-eplb``).

    Call ``register(name, policy_class)`` where ``policy_class`` (or a lazy
    ``"package.module:ClassName"`` string) subclasses :class:`host.sdk.EplbPolicy` and is built
    with no arguments; ``--eplb-config '{"policy": NAME}'`` chooses it. The built-in ``greedy``
    policy registers through this hook too.
    """
