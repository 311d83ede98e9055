"""Multi-LoRA serving (docs/lora.md): adapters named by a :class:`~host.contracts.lora_request.LoRARequest`,
read and validated by :mod:`~host.core.lora.adapter`, held in device slots with a CPU tier
(:mod:`~host.core.lora.slots`), applied by the wrapped linears (:mod:`~host.core.lora.layers`)
through one batched shrink/expand per layer (:mod:`~host.core.lora.punica`).

``request`` and ``adapter`` run in every process (the front end validates, the worker loads);
``layers``, ``slots`` and ``punica`` run in the worker."""
