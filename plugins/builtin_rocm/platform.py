"""The ROCm platform: AMD GPUs through torch's HIP build, RCCL for collectives, and the shared
Triton kernels (:mod:`host.plugins.triton_ops`) compiled for AMD.

A HIP build of torch answers through the ``torch.cuda`` API (devices are ``cuda:N``,
``torch.cuda.is_available()`` is true, ``torch.cuda.CUDAGraph`` records HIP graphs), so
:class:`RocmPlatform` subclasses :class:`~host.plugins.builtin_cuda.platform.CudaPlatform` and
changes only what differs on AMD: detection, the device-id namespaces (``devices.py``), the
attention backend (``triton_rocm``, the same kernels under ROCm flags) and the start-up checks
that refuse what ROCm cannot run. docs/rocm.md has the rules and how they were tested.

Importing ``host.plugins.builtin_cuda.platform`` here is the one place a built-in plugin imports
another built-in plugin (an exception ``tests/test_layering.py`` names); everything else the two
GPU platforms share lives in the library package ``host.plugins.triton_ops``.
"""

from __future__ import annotations

import logging
from typing import Any

from host.plugins.builtin_cuda.platform import CudaPlatform
from host.plugins.builtin_rocm.devices import HIP_VAR, RocmVisibility
from host.sdk.platform import PlatformEnum

logger = logging.getLogger("host.rocm")

# GPU architectures Triton's AMD backend targets (MFMA on CDNA 1-4, WMMA on RDNA 3-4); on any
# other the Triton-built features (custom ops, torch.compile, triton_rocm) are not offered
TRITON_ARCH_PREFIXES = ("gfx908", "gfx90a", "gfx942", "gfx950", "gfx11", "gfx12")
TRITON_BACKENDS = ("triton_rocm", "triton_paged")


class RocmPlatform(CudaPlatform):
    """AMD GPUs. Detected when torch is a HIP build (``torch.version.hip``) and sees a device;
    the CUDA platform steps aside on HIP builds, so the two never both claim a machine."""

    name = "rocm"
    _enum = PlatformEnum.ROCM
    device_name = "rocm"
    device_type = "cuda"  # HIP builds of torch expose the torch.cuda namespace and "cuda" devices
    dispatch_key = "CUDA"
    ray_device_key = "GPU"
    device_control_env_var = HIP_VAR
    ray_noset_device_env_vars = [
        "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",
        "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    ]
    simple_compile_backend = "inductor"
    dist_backend = "nccl"  # torch's name for the NCCL-API backend; a HIP build links RCCL behind it
    # no quantization method is implemented for ROCm yet; quantized checkpoints are refused
    supported_quantization = []
    supported_dtypes = ["bfloat16", "float16", "float32"]
    worker_cls = "host.core.worker.worker:Worker"
    attention_backend_priority = ["triton_rocm", "torch_paged"]

    # -- detection ---------------------------------------------------------------------------

    @classmethod
    def probe(cls) -> tuple[bool, str]:
        """``(detected, why)``. Cheap: reads ``torch.version.hip``, the visibility variables and
        ``torch.cuda.is_available()`` / ``device_count()``; no device properties."""
        import torch

        hip = getattr(torch.version, "hip", None)
        if not hip:
            return False, "torch is not a ROCm build (torch.version.hip is None)"
        try:
            visibility = RocmVisibility.from_env()
        except ValueError as exc:
            # still a ROCm machine: claim it, so start-up fails with this error instead of
            # silently running on the CPU
            available = bool(torch.cuda.is_available())
            return available, f"ROCm build (HIP {hip}) but the device variables are invalid: {exc}"
        hidden = visibility.hidden_by()
        if hidden:
            return False, f"ROCm build (HIP {hip}) but {hidden} hides every device"
        if not torch.cuda.is_available():
            return False, (
                f"ROCm build (HIP {hip}) but no visible device (torch.cuda.is_available() is False; "
                f"check the amdgpu driver, access to /dev/kfd and /dev/dri, and {visibility.describe()})"
            )
        count = torch.cuda.device_count()
        return True, (
            f"ROCm build (HIP {hip}) sees {count} device(s) ({visibility.describe()}); "
            "the cuda platform steps aside on HIP builds"
        )

    @classmethod
    def detect(cls) -> bool:
        return cls.probe()[0]

    @classmethod
    def detection_reason(cls) -> str:
        """Why :meth:`detect` answers as it does; ``host platform`` prints it."""
        return cls.probe()[1]

    # -- devices -----------------------------------------------------------------------------

    @staticmethod
    def gpu_archs() -> list[str]:
        """The architecture of each visible device (``gfx942``...), from ``gcnArchName`` with
        its feature suffixes (``:sramecc+:xnack-``) dropped; ``""`` where torch does not say."""
        import torch

        archs = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            archs.append(str(getattr(props, "gcnArchName", "") or "").split(":", 1)[0])
        return archs

    @classmethod
    def triton_problem(cls) -> str:
        """Why Triton cannot be used on the visible devices, or ``""`` when it can."""
        archs = cls.gpu_archs()
        if not archs:
            return "no visible device"
        unknown = sorted({a or "an unknown architecture" for a in archs if not a.startswith(TRITON_ARCH_PREFIXES)})
        if unknown:
            return (
                f"Triton's AMD backend does not target {', '.join(unknown)} "
                f"(host uses Triton on {', '.join(TRITON_ARCH_PREFIXES)}*)"
            )
        return ""

    def _visible_ids_from_env(self) -> list[int] | None:
        """Physical id of each torch ordinal: ``ROCR_VISIBLE_DEVICES`` composed with
        ``HIP_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES`` (``None``: no filtering)."""
        return RocmVisibility.from_env().physical_ids()

    def device_id_to_physical_device_id(self, logical_id: int) -> int:
        """Local rank -> physical id (what amd-smi calls the GPU)."""
        if self._assigned_physical_device_ids is not None:
            assigned = self._assigned_physical_device_ids
            if not 0 <= logical_id < len(assigned):
                raise RuntimeError(f"logical device {logical_id} is not among the assigned physical devices {assigned}")
            return assigned[logical_id]
        visibility = RocmVisibility.from_env()
        hidden = visibility.hidden_by()
        if hidden:
            raise RuntimeError(f"{hidden} hides every device; unset it or list the device ids to use")
        ids = visibility.physical_ids()
        if ids is None:
            return logical_id
        if not 0 <= logical_id < len(ids):
            raise RuntimeError(
                f"logical device {logical_id} does not exist: {visibility.describe()} leaves "
                f"{len(ids)} device(s) visible"
            )
        return ids[logical_id]

    def logical_device_id_to_visible_device_id(self, logical_id: int) -> int:
        """Local rank -> torch ordinal (``cuda:N``) in this process."""
        physical = self.device_id_to_physical_device_id(logical_id)
        visibility = RocmVisibility.from_env()
        ids = visibility.physical_ids()
        if ids is None:
            return physical
        if physical not in ids:
            raise RuntimeError(
                f"physical device {physical} is not visible in this process ({visibility.describe()} "
                f"leaves physical devices {ids})"
            )
        return ids.index(physical)

    # -- configuration -----------------------------------------------------------------------

    def check_and_update_config(self, config: Any) -> None:
        """Refuse at start-up what ROCm cannot run, and adjust what the platform decides."""
        detected, why = self.probe()
        if not detected:
            raise ValueError(
                f"the ROCm platform cannot start here: {why}. Unset HOST_PLATFORM / --platform to run "
                "on the hardware host detects (`host platform` shows it), or use a ROCm build of "
                "torch on a machine with an AMD GPU"
            )
        RocmVisibility.from_env()  # malformed / conflicting device variables: a ValueError now
        self._check_dtype(config)
        self._check_kv_cache_dtype(config)
        self._check_quantization(config)
        triton_problem = self.triton_problem()
        if triton_problem:
            self._drop_triton_features(config, triton_problem)
        if config.attention_backend == "triton_paged":
            config.attention_backend = "triton_rocm"
            logger.info("--attention-backend triton_paged runs as triton_rocm on ROCm (the same kernels, ROCm's capability flags)")
        self._check_block_size(config, triton_problem)
        logger.info("ROCm (HIP %s, %s): %s", self._hip_version(), ", ".join(self.gpu_archs()), config.compilation.describe())

    def _check_dtype(self, config: Any) -> None:
        dtype = str(getattr(config, "dtype", "auto")).replace("torch.", "")
        if dtype not in ("auto", *self.supported_dtypes):
            raise ValueError(
                f"dtype {dtype!r} is not supported on ROCm; use one of {', '.join(self.supported_dtypes)}"
            )

    def _check_kv_cache_dtype(self, config: Any) -> None:
        cache_dtype = str(config.cache.cache_dtype)
        if cache_dtype.startswith("fp8"):
            raise ValueError(
                f"kv cache dtype {cache_dtype!r} is not supported on ROCm: host's fp8 pages are OCP e4m3fn, "
                "and ROCm's fp8 differs by GPU (e4m3fnuz on gfx942, OCP e4m3fn on gfx950), which no ROCm "
                "backend in host declares yet; use kv cache dtype 'auto' (the model dtype)"
            )

    def _check_quantization(self, config: Any) -> None:
        hf_config = getattr(getattr(config, "model", None), "hf_config", None)
        quant = getattr(hf_config, "quantization_config", None)
        if not quant:
            return
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
        if method in self.supported_quantization:
            return
        note = ""
        if method and "fp8" in str(method).lower():
            note = (
                " (fp8 checkpoints store OCP e4m3fn, which MI300-class GPUs (gfx942) compute as "
                "e4m3fnuz after a conversion host does not do)"
            )
        raise ValueError(
            f"the checkpoint is quantized with {method!r}, which the ROCm platform cannot run{note}; "
            f"supported quantization on ROCm: {', '.join(self.supported_quantization) or 'none yet'}. "
            "Use an unquantized (bfloat16 / float16) checkpoint"
        )

    def _drop_triton_features(self, config: Any, problem: str) -> None:
        """Triton-built features on a GPU Triton does not target: refused when asked for by
        name, switched off (with a warning) when only the -O level implied them."""
        comp = config.compilation
        asked = []
        if comp.custom_ops and "custom_ops" in comp.explicit:
            asked.append("--custom-ops")
        if comp.torch_compile and "torch_compile" in comp.explicit:
            asked.append("--torch-compile")
        if config.attention_backend in TRITON_BACKENDS:
            asked.append(f"--attention-backend {config.attention_backend}")
        if asked:
            raise ValueError(
                f"{', '.join(asked)} need Triton, but {problem}; drop the flag (the platform then "
                "uses eager torch ops and the torch_paged attention backend)"
            )
        dropped = [name for name in ("custom_ops", "torch_compile") if getattr(comp, name)]
        for name in dropped:
            setattr(comp, name, False)
        if dropped:
            logger.warning("ROCm: %s off because %s", " and ".join(dropped), problem)

    def _check_block_size(self, config: Any, triton_problem: str) -> None:
        """The block size must suit the backend the platform will pick: triton_rocm's
        pages are a multiple of 16 tokens. Forcing another backend takes its own check."""
        from host.plugins.builtin_rocm.attention import RocmTritonAttentionBackend as primary

        if config.attention_backend not in (None, primary.name) or triton_problem:
            return
        block_size = config.cache.block_size
        if not primary.block_size_constraint.accepts(block_size):
            base = primary.block_size_constraint.base
            raise ValueError(
                f"block_size={block_size} does not suit ROCm's attention backend {primary.name} (pages must "
                f"be {primary.block_size_constraint}); use --block-size {base} (the default), or "
                f"--attention-backend torch_paged to keep {block_size}"
            )

    def get_attn_backend_name(self, requirements: Any, candidates: list[Any]) -> str:
        """The priority order, without ``triton_paged`` (ROCm runs those kernels as
        ``triton_rocm``) and without any Triton backend on a GPU Triton does not target."""
        excluded = {"triton_paged"}
        problem = self.triton_problem()
        if problem:
            excluded.add("triton_rocm")
            logger.info("ROCm: no Triton attention because %s", problem)
        return super().get_attn_backend_name(requirements, [c for c in candidates if c.name not in excluded])

    # -- description -------------------------------------------------------------------------

    @staticmethod
    def _hip_version() -> str | None:
        import torch

        return getattr(torch.version, "hip", None)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["hip_version"] = self._hip_version()
        info["collectives"] = "RCCL (torch.distributed backend 'nccl')"
        info["attention_backends"] = list(self.attention_backend_priority)
        info["supported_quantization"] = list(self.supported_quantization)
        try:
            info["visibility"] = RocmVisibility.from_env().describe()
        except ValueError as exc:
            info["visibility_error"] = str(exc)
        if "devices" in info:
            try:
                info["archs"] = self.gpu_archs()
                info["triton"] = self.triton_problem() or "available"
            except Exception as exc:  # noqa: BLE001 - description only
                info["archs_error"] = str(exc)
        return info

