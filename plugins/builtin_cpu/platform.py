"""The CPU platform: torch on the host processor, gloo for collectives."""

from __future__ import annotations

import os
from typing import Any

from host.sdk.platform import Platform, PlatformEnum


class CpuPlatform(Platform):
    """Runs models with torch on CPU. Always detected: every machine has a CPU."""

    name = "cpu"
    _enum = PlatformEnum.CPU
    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"
    device_control_env_var = "HOST_CPU_VISIBLE_DEVICES"
    simple_compile_backend = "inductor"
    dist_backend = "gloo"
    supported_dtypes = ["float32", "bfloat16"]
    worker_cls = "host.core.worker.worker:Worker"
    attention_backend_priority = ["cpu_paged"]

    @classmethod
    def detect(cls) -> bool:
        return True

    @classmethod
    def detection_reason(cls) -> str:
        return f"always available ({os.cpu_count()} CPU threads); the fallback when no accelerator platform is detected"

    def check_and_update_config(self, config: Any) -> None:
        dtype = getattr(config, "dtype", None)
        if dtype is not None and str(dtype).replace("torch.", "") not in self.supported_dtypes:
            raise ValueError(
                f"dtype {dtype!r} is not supported on the CPU platform; use one of "
                f"{', '.join(self.supported_dtypes)} (--dtype float32)"
            )

    # a plain copy of the linear weights for the small-batch kernel is kept while it needs at
    # most this share of the machine's memory
    small_m_memory_fraction = 0.1
    # inputs of up to this many rows use the small-batch linear kernel, and decode batches up
    # to this size run the whole layer stack in one compiled call
    small_batch_rows = 8

    def prepare_model(self, model: Any, config: Any) -> None:
        """Repack linear weights for oneDNN (about 1.5-2x faster GEMMs on decode batches) and
        attach the compiled kernels (small-batch linear, norms, rotary, SiLU-and-mul, the fused
        decode step) when they build here; ``-O0`` or ``HOST_CPU_KERNELS=0`` keeps every layer on
        torch."""
        from host.plugins.builtin_cpu.fused_decode import attach_fused_decode
        from host.plugins.builtin_cpu.fused_ops import attach_fused_ops
        from host.plugins.builtin_cpu.kernels import cpu_kernels
        from host.plugins.builtin_cpu.packed_linear import pack_model_linears

        if config.compilation.torch_compile:
            # -O3 / --torch-compile: torch.compile generates the fused code; the repacked oneDNN weights and the
            # hand-written kernels are not traceable, so the model stays plain torch here
            return
        kernels = cpu_kernels() if config.compilation.custom_ops else None  # -O0: eager torch only
        pack_model_linears(
            model,
            batch_hint=config.scheduler.max_num_seqs,
            small_m_kernel=None if kernels is None else kernels.linear_small_m,
            small_m_rows=self.small_batch_rows,
            small_m_budget_bytes=int(self.small_m_memory_fraction * self.get_device_total_memory()),
        )
        if kernels is not None:
            # gguf_linear / int8_linear for "cpu" in the kernel table: platform_plugin's host_offer_kernels
            attach_fused_ops(model)  # the layer kernels the table serves on cpu
            parallel = getattr(config, "parallel", None)
            if parallel is None or parallel.world_size == 1:
                # the fused step runs the whole layer stack with no collectives: one rank only
                attach_fused_decode(model, kernels, max_rows=self.small_batch_rows)

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["threads"] = os.cpu_count()
        return info
