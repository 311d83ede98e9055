"""The fused experts on the GPU: Triton grouped GEMMs for the kernel-table op ``fused_moe`` (the
contract and the torch reference: ``host_moe::fused_experts`` in :mod:`host.sdk.moe`).

Three steps per call, nothing read back to the host (the grid depends only on the shapes):

1. **align** (torch ops on the device): the ``T * k`` token-choices sorted by expert, each
   expert's list padded to a multiple of ``BLOCK_M`` (the ``moe_align`` layout):
   ``sorted_ids [num_blocks * BLOCK_M]`` holds the flat choice index ``t * k + j`` (padding: ``T *
   k``), ``block_expert [num_blocks]`` the expert of each block of ``BLOCK_M`` (``-1``: an unused
   block, its programs return at once). Choices with id ``-1`` (the expert lives on another rank)
   are left out; an expert without tokens has no block. ``num_blocks = ceil(T*k / BLOCK_M) + E``
   bounds the padded length, so no count is read back.
2. **w13 + activation**, one program per (block, ``BLOCK_N`` intermediate columns): the block's
   token rows of ``x`` times expert ``e``'s gate rows and up rows (``w13 [E, 2I, H]``), float32
   accumulation, bias, then ``silu(g) * u``, ``gelu(g) * u`` or gpt-oss's clamped swiglu, stored
   per choice in ``inter [T*k, I]`` (x's dtype).
3. **w2, weighted**, one program per (block, ``BLOCK_N`` hidden columns): ``inter`` rows times
   ``w2 [E, H, I]``, plus bias, times the choice's routing weight, stored per choice in ``y
   [T*k, H]`` (zeros where a choice was skipped); the sum over the ``k`` choices of each token is
   one ``y.view(T, k, H).sum(1)``.

``tl.dot`` runs in IEEE precision (no TF32), so float32 results equal the reference up to
summation order. Under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors, which is how
``tests/plugins/triton_ops/test_fused_moe.py`` checks them against the torch reference.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton ships with torch on Linux x86_64
    HAS_TRITON = False

OP = "fused_moe"  # host.sdk.moe.OP
KERNEL_NAME = "triton"
KERNEL_PRIORITY = 10
BLOCK_N = 64
BLOCK_K = 64
_ACT_CODES = {"silu": 0, "gelu": 1, "swigluoai": 2}


if HAS_TRITON:

    @triton.jit
    def _w13_act_kernel(
        x_ptr, w_ptr, b_ptr, sorted_ptr, block_expert_ptr, inter_ptr,
        hidden, inter, num_choices, top_k, alpha, limit,
        stride_xm, stride_we, stride_wn, stride_be, stride_im,
        HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        expert = tl.load(block_expert_ptr + pid_m)
        if expert < 0:
            return
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        choice = tl.load(sorted_ptr + offs_m)
        row_ok = choice < num_choices
        token = choice // top_k
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < inter
        w_e = w_ptr + expert.to(tl.int64) * stride_we
        gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < hidden
            a = tl.load(x_ptr + token[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(w_e + offs_n[None, :] * stride_wn + offs_k[:, None],
                         mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            wu = tl.load(w_e + (offs_n[None, :] + inter) * stride_wn + offs_k[:, None],
                         mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            gate += tl.dot(a, wg, input_precision="ieee")
            up += tl.dot(a, wu, input_precision="ieee")
        if HAS_BIAS:
            b_e = b_ptr + expert.to(tl.int64) * stride_be
            gate += tl.load(b_e + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            up += tl.load(b_e + inter + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if ACT == 0:
            act = gate * tl.sigmoid(gate) * up
        elif ACT == 1:
            act = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476)) * up
        else:
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
            act = (up + 1.0) * gate * tl.sigmoid(gate * alpha)
        tl.store(inter_ptr + choice[:, None].to(tl.int64) * stride_im + offs_n[None, :],
                 act.to(inter_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _w2_weighted_kernel(
        inter_ptr, w_ptr, b_ptr, sorted_ptr, block_expert_ptr, weights_ptr, y_ptr,
        hidden, inter, num_choices,
        stride_im, stride_we, stride_wn, stride_be, stride_ym,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        expert = tl.load(block_expert_ptr + pid_m)
        if expert < 0:
            return
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        choice = tl.load(sorted_ptr + offs_m)
        row_ok = choice < num_choices
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hidden
        w_e = w_ptr + expert.to(tl.int64) * stride_we
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < inter
            a = tl.load(inter_ptr + choice[:, None].to(tl.int64) * stride_im + offs_k[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_e + offs_n[None, :] * stride_wn + offs_k[:, None],
                        mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            acc += tl.dot(a, w, input_precision="ieee")
        if HAS_BIAS:
            acc += tl.load(b_ptr + expert.to(tl.int64) * stride_be + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        weight = tl.load(weights_ptr + choice, mask=row_ok, other=0.0)
        acc = acc * weight[:, None]
        tl.store(y_ptr + choice[:, None].to(tl.int64) * stride_ym + offs_n[None, :],
                 acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


def block_m_for(num_choices: int) -> int:
    """Rows per block: 16 for decode-sized steps, 64 once the experts' lists are long."""
    return 16 if num_choices <= 512 else 64


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sorted_ids, block_expert)``: the token-choices sorted by expert, each expert's list
    padded to a multiple of ``block_m`` (see the module docstring). Device ops only."""
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    device = flat.device
    key = torch.where(flat >= 0, flat, torch.full_like(flat, num_experts))  # skipped choices last
    counts = torch.bincount(key, minlength=num_experts + 1)[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    valid = sorted_key < num_experts
    expert = sorted_key.clamp(max=num_experts - 1)
    start_unpadded = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n, device=device) - start_unpadded[expert]
    dest = (padded_end - padded)[expert] + rank
    num_blocks = (n + block_m - 1) // block_m + num_experts
    sorted_ids = torch.full((num_blocks * block_m,), n, dtype=torch.int32, device=device)
    sorted_ids[dest[valid]] = order[valid].to(torch.int32)
    block_start = torch.arange(num_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, torch.full_like(block_expert, -1))
    return sorted_ids, block_expert.to(torch.int32)


def fused_experts_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    w13_bias: Optional[torch.Tensor],
    w2_bias: Optional[torch.Tensor],
    alpha: float,
    limit: float,
) -> torch.Tensor:
    """``host_moe::fused_experts`` with the Triton grouped GEMMs (see the module docstring)."""
    if activation not in _ACT_CODES:
        raise ValueError(f"expert activation {activation!r} is not supported; the Triton experts compute {tuple(_ACT_CODES)}")
    num_tokens, top_k = topk_ids.shape
    hidden = x.shape[1]
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    if num_tokens == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    w13, w2 = w13.contiguous(), w2.contiguous()
    num_choices = num_tokens * top_k
    block_m = block_m_for(num_choices)
    sorted_ids, block_expert = align_by_expert(topk_ids, num_experts, block_m)
    num_blocks = block_expert.numel()
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    inter_cache = torch.empty(num_choices, inter, dtype=x.dtype, device=x.device)
    y = torch.zeros(num_choices, hidden, dtype=x.dtype, device=x.device)
    b13 = w13_bias.contiguous() if w13_bias is not None else w13
    b2 = w2_bias.contiguous() if w2_bias is not None else w2
    _w13_act_kernel[(num_blocks, triton.cdiv(inter, BLOCK_N))](
        x, w13, b13, sorted_ids, block_expert, inter_cache,
        hidden, inter, num_choices, top_k, float(alpha), float(limit),
        x.stride(0), w13.stride(0), w13.stride(1), b13.stride(0), inter_cache.stride(0),
        HAS_BIAS=w13_bias is not None, ACT=_ACT_CODES[activation],
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )
    _w2_weighted_kernel[(num_blocks, triton.cdiv(hidden, BLOCK_N))](
        inter_cache, w2, b2, sorted_ids, block_expert, weights, y,
        hidden, inter, num_choices,
        inter_cache.stride(0), w2.stride(0), w2.stride(1), b2.stride(0), y.stride(0),
        HAS_BIAS=w2_bias is not None, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )
    return y.view(num_tokens, top_k, hidden).sum(dim=1)


def register_fused_moe_kernels(device_type: str = "cuda", register: Callable[..., None] | None = None) -> list[str]:
    """Put :func:`fused_experts_triton` in the kernel table for ``device_type`` (priority 10, name
    ``triton``, over the core's torch reference) through ``register`` (the ``host_offer_kernels``
    callback; the table's ``register_kernel`` by default). Returns the ops registered."""
    if not HAS_TRITON:
        return []
    if register is None:
        from host.sdk.kernels import register_kernel as register

    register(OP, device_type, fused_experts_triton, name=KERNEL_NAME, priority=KERNEL_PRIORITY,
             reason="Triton: token-choices aligned by expert, grouped GEMMs (w13 + activation, w2 weighted)")
    return [OP]
