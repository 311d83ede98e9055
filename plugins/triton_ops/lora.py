"""Multi-LoRA on the GPU: a Triton shrink/expand pair for the kernel-table op
``lora_shrink_expand(x, out, a, b, mapping, active) -> out`` (the contract and the torch
reference: ``host/core/lora/punica.py``).

Each token reads its own adapter slot from ``mapping.token_slots`` (``-1``: the base model, the
program returns at once), so one launch serves every adapter of the step with no host-side
grouping:

- shrink, one program per token: ``h[t] = x[t] @ a[slot]`` (``a [slots, K, R]``, ``R`` = the
  slices' ranks side by side, at most a few dozen), ``K`` in blocks of ``BLOCK_K``, float32
  accumulation;
- expand, one program per token and ``BLOCK_N`` output features: ``out[t, n] += h[t] @ b[slot,
  :, n]`` (``b [slots, R, N]``), in place, accumulated in float32 and stored in ``out``'s dtype.

Per-token programs re-read the slot's A and B for every token, which is what a decode step
wants (a few tokens, many adapters); a step of more than :data:`TRITON_MAX_TOKENS` tokens (a
prefill) runs the grouped torch path instead, whose per-adapter GEMMs reuse the weights across
the adapter's rows. Under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors, which is how
``tests/plugins/triton_ops/test_lora.py`` checks them against the torch reference.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton ships with torch on Linux x86_64
    HAS_TRITON = False

OP = "lora_shrink_expand"  # host.core.lora.punica.OP
KERNEL_NAME = "triton"
KERNEL_PRIORITY = 10
TRITON_MAX_TOKENS = 64  # more tokens in a step: the grouped torch path (first choice, not tuned on a GPU)
BLOCK_K = 64
BLOCK_N = 64


if HAS_TRITON:

    @triton.jit
    def _shrink_kernel(x_ptr, a_ptr, slots_ptr, h_ptr, K, R, stride_xm, stride_as, stride_ak, stride_hm,
                       BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
        t = tl.program_id(0)
        slot = tl.load(slots_ptr + t)
        if slot < 0:
            return
        offs_r = tl.arange(0, BLOCK_R)
        acc = tl.zeros([BLOCK_R], dtype=tl.float32)
        a_slot = a_ptr + slot.to(tl.int64) * stride_as
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + t * stride_xm + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            a = tl.load(a_slot + offs_k[:, None] * stride_ak + offs_r[None, :],
                        mask=(offs_k[:, None] < K) & (offs_r[None, :] < R), other=0.0)
            acc += tl.sum(a.to(tl.float32) * x[:, None], axis=0)
        tl.store(h_ptr + t * stride_hm + offs_r, acc, mask=offs_r < R)

    @triton.jit
    def _expand_kernel(h_ptr, b_ptr, slots_ptr, out_ptr, N, R, stride_hm, stride_bs, stride_br, stride_om,
                       BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
        t = tl.program_id(0)
        slot = tl.load(slots_ptr + t)
        if slot < 0:
            return
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_r = tl.arange(0, BLOCK_R)
        h = tl.load(h_ptr + t * stride_hm + offs_r, mask=offs_r < R, other=0.0)
        b = tl.load(b_ptr + slot.to(tl.int64) * stride_bs + offs_r[:, None] * stride_br + offs_n[None, :],
                    mask=(offs_r[:, None] < R) & (offs_n[None, :] < N), other=0.0)
        delta = tl.sum(b.to(tl.float32) * h[:, None], axis=0)
        o_ptrs = out_ptr + t * stride_om + offs_n
        o = tl.load(o_ptrs, mask=offs_n < N, other=0.0).to(tl.float32)
        tl.store(o_ptrs, (o + delta).to(out_ptr.dtype.element_ty), mask=offs_n < N)


def lora_shrink_expand_triton(
    x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, mapping: Any,
    active: Sequence[bool] | None = None, *, max_tokens: int | None = None,
) -> torch.Tensor:
    """``out[t] += (x[t] @ a[slot]) @ b[slot]`` for every token with a slot (see the module
    docstring); returns ``out``. More than ``max_tokens`` tokens (default
    :data:`TRITON_MAX_TOKENS`): the torch reference of the kernel table."""
    from host.sdk.kernels import ANY_DEVICE, kernel_for

    if active is not None and not any(active[slot] for slot, _ in mapping.groups):
        return out  # no adapter of this step targets this module
    m = x.shape[0]
    if m > (TRITON_MAX_TOKENS if max_tokens is None else max_tokens):
        return kernel_for(OP, ANY_DEVICE)(x, out, a, b, mapping, active)
    if x.stride(-1) != 1:
        x = x.contiguous()
    assert out.stride(-1) == 1 and a.stride(-1) == 1 and b.is_contiguous(), "lora_shrink_expand wants contiguous rows"
    _, k, r = a.shape
    n = b.shape[2]
    block_r = max(16, triton.next_power_of_2(r))
    h = torch.empty(m, r, dtype=torch.float32, device=x.device)
    slots = mapping.token_slots
    _shrink_kernel[(m,)](x, a, slots, h, k, r, x.stride(0), a.stride(0), a.stride(1), h.stride(0),
                         BLOCK_R=block_r, BLOCK_K=BLOCK_K)
    _expand_kernel[(m, triton.cdiv(n, BLOCK_N))](h, b, slots, out, n, r, h.stride(0), b.stride(0), b.stride(1),
                                                out.stride(0), BLOCK_N=BLOCK_N, BLOCK_R=block_r)
    return out


def register_lora_kernels(device_type: str = "cuda", register: Callable[..., None] | None = None) -> list[str]:
    """Put :func:`lora_shrink_expand_triton` in the kernel table for ``device_type`` (priority
    10, name ``triton``, over the torch reference) through ``register`` (the
    ``host_offer_kernels`` callback; the table's ``register_kernel`` by default). Returns the ops
    registered."""
    if not HAS_TRITON:
        return []
    if register is None:
        from host.sdk.kernels import register_kernel as register

    register(OP, device_type, lora_shrink_expand_triton, name=KERNEL_NAME, priority=KERNEL_PRIORITY,
             reason=f"Triton shrink/expand, one launch per step up to {TRITON_MAX_TOKENS} tokens (torch reference above)")
    return [OP]
