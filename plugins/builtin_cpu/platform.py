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
    worker_cls = "host.core.worker:Worker"
    attention_backend_priority = ["cpu_paged"]

    @classmethod
    def detect(cls) -> bool:
        return True

    def check_and_update_config(self, config: Any) -> None:
        dtype = getattr(config, "dtype", None)
        if dtype is not None and str(dtype).replace("torch.", "") not in self.supported_dtypes:
            raise ValueError(
                f"dtype {dtype!r} is not supported on the CPU platform; use one of "
                f"{', '.join(self.supported_dtypes)} (--dtype float32)"
            )

    def prepare_model(self, model: Any, config: Any) -> None:
        """Repack linear weights for oneDNN (about 1.5-2x faster GEMMs on decode batches)."""
        from host.plugins.builtin_cpu.packed_linear import pack_model_linears

        pack_model_linears(model, batch_hint=config.scheduler.max_num_seqs)

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["threads"] = os.cpu_count()
        return info
