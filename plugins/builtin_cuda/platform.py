"""The CUDA platform: NVIDIA GPUs through torch.cuda, NCCL for collectives."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Callable

from host.sdk.platform import Platform, PlatformEnum

logger = logging.getLogger("host.cuda")


class CudaPlatform(Platform):
    """NVIDIA GPUs. Detected when torch sees a CUDA device and is not a ROCm (HIP) build."""

    name = "cuda"
    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"
    ray_device_key = "GPU"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"
    simple_compile_backend = "inductor"
    dist_backend = "nccl"
    supported_dtypes = ["bfloat16", "float16", "float32"]
    worker_cls = "host.core.worker.worker:Worker"
    attention_backend_priority = ["triton_paged", "torch_paged"]

    @classmethod
    def detect(cls) -> bool:
        import torch

        if getattr(torch.version, "hip", None):
            return False
        return bool(torch.cuda.is_available())

    @classmethod
    def detection_reason(cls) -> str:
        import torch

        if getattr(torch.version, "hip", None):
            return "torch is a ROCm (HIP) build: the rocm platform serves it"
        if not torch.cuda.is_available():
            cuda = getattr(torch.version, "cuda", None)
            if cuda is None:
                return "torch is a CPU-only build (torch.version.cuda is None)"
            return f"torch {torch.__version__} (CUDA {cuda}) sees no GPU (check the driver and CUDA_VISIBLE_DEVICES)"
        return f"{torch.cuda.device_count()} CUDA device(s): {torch.cuda.get_device_name(0)}"

    def check_and_update_config(self, config: Any) -> None:
        import torch

        dtype = str(getattr(config, "dtype", "auto")).replace("torch.", "")
        if dtype not in ("auto", *self.supported_dtypes):
            raise ValueError(
                f"dtype {dtype!r} is not supported on CUDA; use one of {', '.join(self.supported_dtypes)}"
            )
        if dtype == "bfloat16" and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
            raise ValueError(
                "this GPU has no bfloat16 support (compute capability < 8.0); use --dtype float16"
            )
        logger.info("CUDA %s", config.compilation.describe())

    def prepare_model(self, model: Any, config: Any) -> None:
        """With custom ops on (``-O1`` and above, or ``--custom-ops``), the model's norms, rotary
        embedding and SiLU-and-mul run as Triton custom ops (``host::*``, traceable by
        torch.compile). Quantized linears and LoRA run the Triton kernels of the kernel table, at
        every ``-O`` level (:meth:`offer_kernels`, through the ``host_offer_kernels`` hook)."""
        if config.compilation.custom_ops:
            from host.plugins.triton_ops.custom_ops import offer_triton_layer_ops
            from host.sdk.kernels import register_kernel
            from host.sdk.models import attach_layer_kernels

            # the layer ops this platform offers through host_offer_kernels, offered again under
            # the same name and source: a model may be prepared outside this platform's own process
            offer_triton_layer_ops(self.device_type, partial(register_kernel, source=self.name))
            count = attach_layer_kernels(model, self.device_type)
            logger.info("Attached layer kernels to %d norm / activation / rotary modules", count)

    def offer_kernels(self, register: Callable[..., None]) -> list[str]:
        """The Triton kernels for ``host_offer_kernels`` (the cuda and rocm platform plugins call
        this for their platform): :meth:`register_quant_kernels`, the layer ops
        (``rms_norm``, ``silu_and_mul``, ``rotary_embedding``), the LoRA shrink/expand
        (:func:`host.plugins.triton_ops.lora.register_lora_kernels`, used with
        ``--enable-lora``) and the fused MoE experts
        (:func:`host.plugins.triton_ops.fused_moe.register_fused_moe_kernels`), none where
        Triton does not target the GPU. Returns the ops registered."""
        from host.plugins.triton_ops.custom_ops import offer_triton_layer_ops

        ops = self.register_quant_kernels(register)
        offer_triton_layer_ops(self.device_type, register)  # (the norms, rotary, SiLU-and-mul)
        ops += ["rms_norm", "silu_and_mul", "rotary_embedding"]
        triton_problem = getattr(self, "triton_problem", None)
        if triton_problem is None or not triton_problem():
            from host.plugins.triton_ops.fused_moe import register_fused_moe_kernels
            from host.plugins.triton_ops.lora import register_lora_kernels

            ops += register_lora_kernels(self.device_type, register)
            ops += register_fused_moe_kernels(self.device_type, register)
        return ops

    def register_quant_kernels(self, register: Callable[..., None] | None = None) -> list[str]:
        """Put the Triton kernels of :mod:`host.plugins.triton_ops.quant_linear` in the kernel
        table for device type ``cuda`` (priority 10, over the torch references): ``gguf_linear``
        and ``int8_linear``, and on NVIDIA ``fp8_linear`` (``torch._scaled_mm`` on compute
        capability >= 8.9, a Triton kernel below). ROCm inherits this without ``fp8_linear``
        (its gfx942 computes e4m3fnuz, not the checkpoints' e4m3fn) and registers nothing when
        Triton does not target its GPU. ``register`` is the ``host_offer_kernels`` callback (the
        table's ``register_kernel`` by default). Returns the ops registered."""
        triton_problem = getattr(self, "triton_problem", None)  # RocmPlatform's check
        if triton_problem is not None and triton_problem():
            return []
        from host.plugins.triton_ops.quant_linear import register_quant_kernels

        return register_quant_kernels(self.device_type, fp8=self.is_cuda(), register=register)

    def sampling_kernel(self, config: Any) -> Any:
        """With custom ops on, the sampler draws with the Triton kernel (temperature, min-p,
        top-k, top-p and the inverse-CDF draw in one launch per step, nothing read back)."""
        if not config.compilation.custom_ops:
            return None
        from host.plugins.triton_ops.sampling import sample

        return sample

    def can_capture_graphs(self) -> bool:
        import torch

        return bool(torch.cuda.is_available())

    def graph_pool(self) -> Any:
        import torch

        return torch.cuda.graph_pool_handle()

    def capture_graph(self, fn: Any, pool: Any = None) -> tuple[Any, Any]:
        import torch

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            output = fn()
        return graph.replay, output

    def get_device_total_memory(self, device_id: int = 0) -> int:
        import torch

        return int(torch.cuda.get_device_properties(device_id).total_memory)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        try:
            import torch

            if torch.cuda.is_available():
                info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception as exc:  # noqa: BLE001 - description only
            info["devices_error"] = str(exc)
        return info
