"""The ``Platform`` base class: the single translator between host and a kind of hardware.

Engine and model code never branch on ``device == "cuda"``; they ask the current platform.
A platform plugin subclasses :class:`Platform`, sets the class fields, implements ``detect()``
and registers the class through the ``host_register_platforms`` hook.
"""

from __future__ import annotations

import enum
import os
from typing import Any, ClassVar


class PlatformEnum(enum.Enum):
    """Which family a platform belongs to; third-party platforms use ``OOT``."""

    CUDA = "cuda"
    ROCM = "rocm"
    CPU = "cpu"
    OOT = "oot"
    UNSPECIFIED = "unspecified"


class Platform:
    """Describes one kind of hardware: how to find it, its devices, and what runs on it.

    Class fields (override in subclasses):

    - ``name``: what ``HOST_PLATFORM`` / ``--platform`` matches and ``host platform`` prints.
    - ``_enum``: the :class:`PlatformEnum` family; drives ``is_cuda()`` and friends.
    - ``device_name`` / ``device_type``: a human name and the torch device type (``"cuda"``).
    - ``dispatch_key``: the torch dispatch key for custom ops.
    - ``device_control_env_var``: the variable that restricts visible devices
      (``CUDA_VISIBLE_DEVICES`` for CUDA).
    - ``ray_device_key`` / ``ray_noset_device_env_vars``: for a Ray executor.
    - ``simple_compile_backend``: the ``torch.compile`` backend for small helper functions.
    - ``dist_backend``: the ``torch.distributed`` backend (``nccl``, ``gloo``).
    - ``supported_quantization``: quantization method names this platform can run.
    - ``supported_dtypes``: model dtypes this platform can compute in.
    - ``additional_env_vars``: variables forwarded to worker processes.
    - ``worker_cls``: the qualified name of the worker class (``"pkg.module:Class"``).
    - ``attention_backend_priority``: backend names tried in order when selecting one.

    Unknown attributes are forwarded to ``torch.<device_type>`` (so
    ``platform.memory_allocated()`` means ``torch.cuda.memory_allocated()`` on CUDA); dunder
    names are never forwarded, which keeps pickling safe.
    """

    name: ClassVar[str] = "unspecified"
    _enum: ClassVar[PlatformEnum] = PlatformEnum.OOT
    device_name: ClassVar[str] = "unspecified"
    device_type: ClassVar[str] = "cpu"
    dispatch_key: ClassVar[str] = "CPU"
    ray_device_key: ClassVar[str] = ""
    device_control_env_var: ClassVar[str] = "HOST_DEVICE_CONTROL_ENV_VAR_PLACEHOLDER"
    ray_noset_device_env_vars: ClassVar[list[str]] = []
    simple_compile_backend: ClassVar[str] = "inductor"
    dist_backend: ClassVar[str] = ""
    supported_quantization: ClassVar[list[str]] = []
    supported_dtypes: ClassVar[list[str]] = ["float32"]
    additional_env_vars: ClassVar[list[str]] = []
    worker_cls: ClassVar[str] = "host.core.worker.worker:Worker"
    attention_backend_priority: ClassVar[list[str]] = []

    def __init__(self) -> None:
        self._assigned_physical_device_ids: list[int] | None = None

    # -- detection ---------------------------------------------------------------------------

    @classmethod
    def detect(cls) -> bool:
        """Return True when this hardware is usable in the current process.

        Must be cheap and free of side effects: it runs in every process, possibly more than
        once. An exception here is recorded and reported by ``host platform``.
        """
        return False

    @classmethod
    def detection_reason(cls) -> str:
        """One line on why :meth:`detect` answers as it does, for ``host platform`` (``""``:
        nothing to add). Cheap and side-effect free, like ``detect``."""
        return ""

    # -- family checks -----------------------------------------------------------------------

    def is_cuda(self) -> bool:
        return self._enum == PlatformEnum.CUDA

    def is_rocm(self) -> bool:
        return self._enum == PlatformEnum.ROCM

    def is_cuda_alike(self) -> bool:
        return self._enum in (PlatformEnum.CUDA, PlatformEnum.ROCM)

    def is_cpu(self) -> bool:
        return self._enum == PlatformEnum.CPU

    def is_out_of_tree(self) -> bool:
        return self._enum == PlatformEnum.OOT

    # -- configuration -----------------------------------------------------------------------

    def check_and_update_config(self, config: Any) -> None:
        """Validate and adjust the engine config in place for this platform.

        Called early during engine start-up. Set what the platform decides (block size, graph
        mode, ``worker_cls``). Raise ``ValueError`` naming the field and the fix for anything
        this hardware cannot run.
        """

    def get_attn_backend_name(self, requirements: Any, candidates: list[Any]) -> str:
        """Pick an attention backend among ``candidates`` (classes that fit ``requirements``).

        The default takes the first name in ``attention_backend_priority`` that is among the
        candidates, else the first candidate. Raise ``ValueError`` when there is none.
        """
        if not candidates:
            raise ValueError(
                f"no attention backend on platform {self.name!r} supports {requirements}; "
                "install a backend plugin for this hardware or change dtype/block size"
            )
        by_name = {c.name: c for c in candidates}
        for name in self.attention_backend_priority:
            if name in by_name:
                return name
        return candidates[0].name

    def prepare_model(self, model: Any, config: Any) -> None:
        """Optimise a loaded model in place for this hardware (repack weights, fuse layers...).

        Called once by the model runner after the weights are loaded. Must not change results
        beyond floating-point rounding. Default: nothing.
        """

    def sampling_kernel(self, config: Any) -> Any:
        """A device kernel for the sampler's draw, or ``None`` for the torch path. Signature:
        ``(logits [B, V], temperature [B], top_k [B], top_p [B], min_p [B], u [B]) -> int64
        [B]``, greedy rows (temperature < 1e-5) taking the argmax, no host synchronisation
        (see ``host.plugins.triton_ops.sampling.sample``)."""
        return None

    # -- device graphs ------------------------------------------------------------------------

    def can_capture_graphs(self) -> bool:
        """Whether :meth:`capture_graph` works here (CUDA / HIP graphs). ``-O2`` and above turn
        decode graphs on only where this is true."""
        return False

    def graph_pool(self) -> Any:
        """A memory-pool handle shared by every graph one model runner captures."""
        return None

    def capture_graph(self, fn: Any, pool: Any = None) -> tuple[Any, Any]:
        """Run ``fn()`` once under graph capture; return ``(replay, output)``: calling
        ``replay()`` re-runs the recorded kernels on the same input buffers and refreshes the
        tensors in ``output``. The caller warms ``fn`` up before capturing."""
        raise NotImplementedError(f"platform {self.name!r} cannot capture device graphs")

    def get_device_capability(self, device_id: int = 0) -> int | None:
        """The device's compute capability as ``major * 10 + minor`` (89 for sm_89), ``None``
        where the notion does not apply (CPU) or no device is visible."""
        if self.device_type != "cuda":
            return None
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(device_id)
        return major * 10 + minor

    def get_device_communicator_cls(self) -> str | None:
        """The qualified name of the class doing collective communication, if any."""
        return None

    def get_device_total_memory(self, device_id: int = 0) -> int:
        """Total memory of one device in bytes."""
        raise NotImplementedError(f"platform {self.name!r} does not report device memory")

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary printed by ``host platform``."""
        return {
            "name": self.name,
            "family": self._enum.value,
            "device_name": self.device_name,
            "device_type": self.device_type,
            "dist_backend": self.dist_backend,
            "supported_dtypes": list(self.supported_dtypes),
            "worker_cls": self.worker_cls,
        }

    # -- device id namespaces ----------------------------------------------------------------
    # logical: host's local rank; visible: the torch ordinal after the visibility variable;
    # physical: the id the driver's topology tools use, ignoring the environment.

    def set_assigned_physical_device_ids(self, ids: list[int]) -> None:
        """Fix which physical devices this process owns; setting a different value raises."""
        ids = list(ids)
        if self._assigned_physical_device_ids is None:
            self._assigned_physical_device_ids = ids
        elif self._assigned_physical_device_ids != ids:
            raise RuntimeError(
                f"physical device ids already assigned as {self._assigned_physical_device_ids}, "
                f"refusing to change them to {ids}"
            )

    def _visible_ids_from_env(self) -> list[int] | None:
        raw = os.environ.get(self.device_control_env_var)
        if raw is None:
            return None
        raw = raw.strip()
        if raw == "":
            return []
        try:
            return [int(part) for part in raw.split(",") if part.strip() != ""]
        except ValueError:
            raise ValueError(
                f"{self.device_control_env_var}={raw!r} must be a comma-separated list of "
                "integer device ids, for example '0,1'"
            ) from None

    def device_id_to_physical_device_id(self, logical_id: int) -> int:
        """Map host's local rank to a physical device id."""
        if self._assigned_physical_device_ids is not None:
            return self._assigned_physical_device_ids[logical_id]
        visible = self._visible_ids_from_env()
        if visible is None:
            return logical_id
        if not visible:
            raise RuntimeError(
                f"{self.device_control_env_var} is set to an empty string, so no device is "
                "visible; unset it or list the device ids to use"
            )
        return visible[logical_id]

    def logical_device_id_to_visible_device_id(self, logical_id: int) -> int:
        """Map host's local rank to the torch device ordinal in this process."""
        physical = self.device_id_to_physical_device_id(logical_id)
        visible = self._visible_ids_from_env()
        if visible is None:
            return physical
        if physical not in visible:
            raise RuntimeError(
                f"physical device {physical} is not visible in this process "
                f"({self.device_control_env_var}={','.join(map(str, visible))})"
            )
        return visible.index(physical)

    # -- torch forwarding --------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        import torch

        module = getattr(torch, self.device_type, None)
        if module is not None and hasattr(module, name):
            return getattr(module, name)
        raise AttributeError(
            f"{type(self).__name__} has no attribute {name!r} (nor has torch.{self.device_type})"
        )


class UnspecifiedPlatform(Platform):
    """Stand-in when no platform detected itself; engines refuse to start on it."""

    name = "unspecified"
    _enum = PlatformEnum.UNSPECIFIED
