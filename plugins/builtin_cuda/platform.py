"""The CUDA platform: NVIDIA GPUs through torch.cuda, NCCL for collectives."""

from __future__ import annotations

from typing import Any

from host.sdk.platform import Platform, PlatformEnum


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
    worker_cls = "host.core.worker:Worker"
    attention_backend_priority = ["triton_paged", "torch_paged"]

    @classmethod
    def detect(cls) -> bool:
        import torch

        if getattr(torch.version, "hip", None):
            return False
        return bool(torch.cuda.is_available())

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
