"""The KV cache's flat buffer on the CPU: zeroed, writable, of the asked dtype, and not committed
to memory until written (a 1 GiB buffer leaves the resident set almost unchanged)."""

from __future__ import annotations

import gc

import pytest
import torch

from host.core.worker.kv_buffer import allocate_kv_buffer


def _resident_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_the_buffer_is_zeroed_and_writable(dtype):
    buf = allocate_kv_buffer(3 * 4096 + 5, dtype, torch.device("cpu"))
    assert buf.dtype == dtype and buf.shape == (3 * 4096 + 5,)
    assert not buf.float().any()
    view = buf.view(3 * 4096 + 5)
    gc.collect()  # the mapping lives as long as the tensor
    view[-1] = 2.0
    view[0] = 1.0
    assert buf[0].float().item() == 1.0 and buf[-1].float().item() == 2.0


def test_an_untouched_buffer_is_not_resident():
    before = _resident_bytes()
    buf = allocate_kv_buffer(2**28, torch.float32, torch.device("cpu"))  # 1 GiB
    assert _resident_bytes() - before < 64 * 2**20
    buf[:: 2**20].fill_(1.0)  # one element per 4 MiB: 256 pages
    assert buf[:: 2**20].sum().item() == 256.0
    assert _resident_bytes() - before < 128 * 2**20
    del buf
