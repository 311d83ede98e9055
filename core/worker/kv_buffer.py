"""The KV cache's one flat buffer, allocated zeroed without touching it on the host.

``torch.zeros`` of a 2 GiB CPU buffer writes every page before the engine can serve (about 4 s on
a small machine: half a cold start). Anonymous memory from the kernel is zero by definition and
is faulted in on first write, so on the CPU the buffer is an anonymous ``mmap`` viewed as a
tensor: the cost of each page moves to the step that first writes a block into it, and memory
that no request ever reaches is never committed. Device buffers are ``torch.zeros`` (a device
memset is fast).
"""

from __future__ import annotations

import mmap

import torch


def allocate_kv_buffer(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed 1-D tensor of ``numel`` elements of ``dtype`` on ``device``."""
    if device.type != "cpu" or numel == 0:
        return torch.zeros(numel, dtype=dtype, device=device)
    nbytes = numel * dtype.itemsize
    # the tensor holds a reference to the mapping, which is unmapped when the tensor is freed
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8).view(dtype)
