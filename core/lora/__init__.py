"""Multi-LoRA serving (docs/lora.md): adapters named by a :class:`~host.contracts.lora_request.LoRARequest`,
read and validated by :mod:`~host.core.lora.adapter`, held in device slots with a CPU tier
(:mod:`~host.core.lora.slots`), applied by the wrapped linears (:mod:`~host.core.lora.layers`)
through one batched shrink/expand per layer (:mod:`~host.core.lora.punica`).

By process: ``adapter`` runs in every process (the front end validates, the worker loads);
``frontend`` (--lora-modules values) in the API process; ``engine`` (start-up refusals) and
``scheduler`` (the feature's seam: the ``max_loras`` cap at admission, the adapters-in-use
stats) in the engine core; ``layers``, ``slots``, ``punica`` and ``worker`` in the workers. The
request type itself is a contract (:mod:`host.contracts.lora_request`)."""
