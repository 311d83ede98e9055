"""The ROCm platform: AMD GPUs through torch's HIP build (``torch.cuda`` API), RCCL."""

from __future__ import annotations

from typing import Any

from host.sdk.platform import Platform, PlatformEnum


class RocmPlatform(Platform):
    """AMD GPUs. Detected when torch is a HIP build (``torch.version.hip``) and sees a device."""

    name = "rocm"
    _enum = PlatformEnum.ROCM
    device_name = "rocm"
    device_type = "cuda"  # HIP builds of torch expose the torch.cuda namespace
    dispatch_key = "CUDA"
    ray_device_key = "GPU"
    device_control_env_var = "HIP_VISIBLE_DEVICES"
    simple_compile_backend = "inductor"
    dist_backend = "nccl"  # RCCL behind torch's nccl backend name
    supported_dtypes = ["bfloat16", "float16", "float32"]
    worker_cls = "host.core.worker:Worker"
    attention_backend_priority = ["triton_paged", "torch_paged"]

    @classmethod
    def detect(cls) -> bool:
        import torch

        if not getattr(torch.version, "hip", None):
            return False
        return bool(torch.cuda.is_available())

    def get_device_total_memory(self, device_id: int = 0) -> int:
        import torch

        return int(torch.cuda.get_device_properties(device_id).total_memory)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        import torch

        info["hip_version"] = getattr(torch.version, "hip", None)
        return info
