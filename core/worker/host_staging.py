"""Pinned, double-buffered host staging for the step inputs' host-to-device copies."""

from __future__ import annotations

import numpy as np
import torch


class HostStaging:
    """Host-to-device copies of step inputs without a host wait.

    On an accelerator each named input has a pinned (page-locked) host buffer and the copy to
    the device is asynchronous. Steps alternate between two sets of buffers: with asynchronous
    scheduling step N is prepared while step N-1's copies may still be queued, but step N-2 has
    finished (its sampled ids were waited for), so the set step N writes is free. On a CPU
    device the numpy arrays are used as they are."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pinned = device.type != "cpu"
        self._sets: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] = ({}, {})
        self._buffers = self._sets[0]

    def next_step(self) -> None:
        """Switch to the other buffer set (call once at the start of every step)."""
        self._buffers = self._sets[1] if self._buffers is self._sets[0] else self._sets[0]

    def _host(self, name: str, array: np.ndarray) -> torch.Tensor:
        src = torch.from_numpy(np.ascontiguousarray(array))
        if not self.pinned:
            return src
        n = src.numel()
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < n or buf.dtype != src.dtype:
            buf = torch.empty(max(n, 1024), dtype=src.dtype, pin_memory=True)
            self._buffers[name] = buf
        view = buf[:n].view(src.shape)
        view.copy_(src)
        return view

    def to_device(self, name: str, array: np.ndarray) -> torch.Tensor:
        return self._host(name, array).to(self.device, non_blocking=True)

    def copy_into(self, dst: torch.Tensor, name: str, array: np.ndarray) -> None:
        dst.copy_(self._host(name, array), non_blocking=True)
