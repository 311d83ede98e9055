"""A sync-free Triton sampling kernel: temperature, min-p, top-k, top-p and the draw, on the GPU.

:func:`sample` picks one token per row of ``logits`` [B, V] from ``softmax(logits / T)``
restricted, in this order, by min-p (drop tokens whose probability is below ``min_p`` times the
best one's; 0 = off), top-k (keep the ``k`` best; ``k <= 0`` = off) and top-p over what is left,
renormalised (keep the smallest set of best tokens holding at least ``top_p`` of the mass;
``>= 1`` = off) — the order and definitions of ``draw()`` in :mod:`host.core.worker.sampler`. The token
is drawn by inverse CDF with the caller's uniform ``u`` per row (or ``S`` uniforms per row: ``S``
draws from the same restricted distribution). :func:`sample_ref` is the plain torch reference,
:func:`kept_mask_ref` / :func:`probs_ref` the kept set and distribution it draws from.

No host synchronisation: every per-row decision happens on the device and the grid (one
program per row) depends only on the shapes, so the launch can be captured in a CUDA graph.

How a row is processed (all passes walk the row's vocabulary in tiles of ``BLOCK``):

1. the maximum raw logit and the maximum of the scaled logits ``s = logit / T``;
2. top-k (only when ``0 < k < V``): the ``k``-th largest raw logit, found by searching the
   integer keys of the float32 bit patterns (a monotone map of the values). Each pass counts
   the tokens at or above ``PIVOTS`` thresholds at once and narrows the key range
   ``PIVOTS + 1``-fold, so 32 bits take at most 8 passes; it stops early when a threshold
   holds exactly ``k`` tokens. Searching raw logits (not ``s``) keeps ties created by the
   division out of it, as ``torch.topk`` on the raw logits does;
3. the mass of the min-p and top-k survivors (min-p threshold: ``max(s) + log(min_p)``);
4. top-p (only when ``top_p < 1``): the same search for the largest key whose survivors at or
   above it hold at least ``top_p`` of that mass;
5. the draw: the kept tokens are walked in vocabulary order with ``tl.cumsum``; the first whose
   running mass exceeds ``u * kept_mass`` is the token.

Differences from ``draw()``, none of which change the distribution of untied logits:

- the inverse CDF runs over the kept tokens in vocabulary order, not best first, so the same
  ``u`` can pick a different token than ``draw()`` (same distribution, different coupling);
- ties at a threshold are kept: tokens whose logit equals the ``k``-th best are all kept (so a
  tie can keep more than ``k``), and tokens tied with the last token of the nucleus are all kept
  (``draw()`` keeps an arbitrary subset of such ties, in ``topk`` / ``sort`` order);
- temperature below ``1e-5`` means greedy (as in the sampler): the first index of the
  maximum, like ``argmax``, whatever ``u``, ``top_k``, ``top_p`` and ``min_p`` say;
- ``min_p`` above 1 acts as 1 (the best tokens only); ``top_p <= 0`` keeps the best tokens only
  (``draw()`` has no sensible result for either);
- a row whose logits are all ``-inf`` returns token 0; ``+inf`` and NaN logits are not supported;
- ``u`` is used in float32 (``draw()``: float64), so draws resolve probabilities down to about
  ``2**-24`` of the kept mass (a ``u`` within ``2**-25`` of 1 rounds to 1 and still yields a
  kept token, one of the last in vocabulary order).

The masses are float32 sums (the reference's cumulative sums are float32 too); a token whose
threshold decision sits within float32 rounding of ``top_p`` may fall the other way.
"""

from __future__ import annotations

import torch

from host.plugins.triton_ops.kernels import HAS_TRITON, _interpreting, _next_pow2, _require_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

_GREEDY_EPS = 1e-5  # as host.core.worker.sampler: a lower temperature means greedy
_MAX_BLOCK = 1024
_PIVOTS = 16

if HAS_TRITON:
    # The kernel is one function on purpose: each call of a nested @triton.jit function
    # (reductions included) costs milliseconds under the interpreter, which is how CI runs it.

    @triton.jit
    def _sample_kernel(
        logits_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, u_ptr, out_ptr,
        stride, u_stride, V, draws,
        BLOCK: tl.constexpr, PIVOTS: tl.constexpr, DRAWS_BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride
        t = tl.load(temp_ptr + row).to(tl.float32)
        k = tl.load(top_k_ptr + row).to(tl.int64)
        top_p = tl.load(top_p_ptr + row).to(tl.float32)
        min_p = tl.load(min_p_ptr + row).to(tl.float32)
        greedy = t < 1e-5
        # greedy: the first best token, i.e. keep the maximum (min-p 1) and draw with u = 0
        t = tl.where(greedy, 1.0, t)
        k = tl.where(greedy, 0, k)
        top_p = tl.where(greedy, 1.0, top_p)
        min_p = tl.where(greedy, 1.0, tl.minimum(min_p, 1.0))

        # 1. maxima of the raw and of the scaled logits
        m_raw = tl.full([], float("-inf"), tl.float32)
        m_s = tl.full([], float("-inf"), tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            m_raw = tl.maximum(m_raw, tl.max(x, axis=0))
            m_s = tl.maximum(m_s, tl.max(x / t, axis=0))
        t_mp = tl.where(min_p > 0.0, m_s + tl.log(tl.where(min_p > 0.0, min_p, 1.0)), float("-inf"))
        m_s = tl.where(m_s == float("-inf"), 0.0, m_s)  # a row all -inf: no NaN from -inf - -inf
        # keys: the float32 bit patterns as integers, in the order of the values (-0.0 as 0.0)
        top_bits = tl.where(m_raw == 0.0, 0.0, m_raw).to(tl.int32, bitcast=True)
        top_key = tl.where(top_bits < 0, top_bits ^ 0x7FFFFFFF, top_bits).to(tl.int64)
        j = tl.arange(0, PIVOTS).to(tl.int64)

        # 2. phase 0, top-k: the largest key with at least k tokens at or above it.
        #    phase 1, top-p: the mass of the survivors (min-p, top-k), then the largest key whose
        #    survivors at or above it hold top_p of it.
        #    Both search [lo, hi) with PIVOTS thresholds a pass (pred(lo) holds, pred(hi) not).
        floor_key = tl.full([], -2147483648, tl.int64)  # the tokens below it are cut
        kept = tl.zeros([], tl.float32)  # the mass of the kept tokens
        for phase in tl.static_range(2):
            if phase == 1:
                for start in range(0, V, BLOCK):
                    offs = start + tl.arange(0, BLOCK)
                    mask = offs < V
                    x = tl.load(base + offs, mask=mask, other=float("-inf")).to(tl.float32)
                    s = x / t
                    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
                    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
                    keep = mask & (s >= t_mp) & (key >= floor_key) & (s > float("-inf"))
                    kept += tl.sum(tl.where(keep, tl.exp(s - m_s), 0.0), axis=0)
            if phase == 0:
                active = (k > 0) & (k < V)
            else:
                active = top_p < 1.0
            if active:
                target = top_p * kept
                lo = floor_key
                lo_mass = kept
                hi = top_key + 1
                while hi - lo > 1:
                    step = (hi - lo + PIVOTS) // (PIVOTS + 1)
                    piv = lo + step * (j + 1)
                    count = tl.zeros([PIVOTS], dtype=tl.int32)  # tokens at or above each pivot
                    mass = tl.zeros([PIVOTS], dtype=tl.float32)  # their survivors' mass
                    for start in range(0, V, BLOCK):
                        offs = start + tl.arange(0, BLOCK)
                        mask = offs < V
                        x = tl.load(base + offs, mask=mask, other=float("-inf")).to(tl.float32)
                        s = x / t
                        bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
                        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
                        above = (key[:, None] >= piv[None, :]) & mask[:, None]
                        if phase == 0:
                            count += tl.sum(above.to(tl.int32), axis=0)
                        else:
                            keep = mask & (s >= t_mp) & (key >= floor_key) & (s > float("-inf"))
                            prob = tl.where(keep, tl.exp(s - m_s), 0.0)
                            mass += tl.sum(tl.where(above, prob[:, None], 0.0), axis=0)
                    if phase == 0:
                        ok = (piv < hi) & (count >= k)
                        # a pivot with exactly k tokens at or above it: that set is the top-k
                        done = tl.sum(tl.where(ok & (count == k), 1, 0), axis=0) > 0
                    else:
                        ok = (piv < hi) & (mass >= target)
                        done = False
                    n_ok = tl.sum(ok.to(tl.int64), axis=0)
                    if phase == 1:
                        lo_mass = tl.where(n_ok > 0, tl.sum(tl.where(j == n_ok - 1, mass, 0.0), axis=0), lo_mass)
                    hi = tl.minimum(hi, lo + step * (n_ok + 1))
                    lo = lo + step * n_ok
                    hi = tl.where(done, lo + 1, hi)
                floor_key = lo
                if phase == 1:
                    kept = lo_mass

        # 3. inverse CDF over the kept tokens in vocabulary order, DRAWS_BLOCK uniforms a pass
        for d0 in range(0, draws, DRAWS_BLOCK):
            d = d0 + tl.arange(0, DRAWS_BLOCK)
            d_mask = d < draws
            u = tl.load(u_ptr + row * u_stride + d, mask=d_mask, other=0.0).to(tl.float32)
            u_mass = tl.where(greedy, 0.0, u) * kept
            run = tl.zeros([], tl.float32)
            found = tl.full([DRAWS_BLOCK], -1, tl.int32)
            last = tl.zeros([], tl.int32)  # the last kept token, for u * kept rounding up to it all
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < V
                x = tl.load(base + offs, mask=mask, other=float("-inf")).to(tl.float32)
                s = x / t
                bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
                key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
                keep = mask & (s >= t_mp) & (key >= floor_key) & (s > float("-inf"))
                prob = tl.where(keep, tl.exp(s - m_s), 0.0)
                cdf = run + tl.cumsum(prob, axis=0)
                hit = (cdf[:, None] > u_mass[None, :]) & (prob > 0.0)[:, None]
                first = tl.min(tl.where(hit, offs[:, None], V), axis=0)
                found = tl.where((found < 0) & (first < V), first, found)
                last = tl.maximum(last, tl.max(tl.where(prob > 0.0, offs, 0), axis=0))
                run += tl.sum(prob, axis=0)
            token = tl.where(found >= 0, found, last).to(tl.int64)
            tl.store(out_ptr + row * draws + d, token, mask=d_mask)


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    u: torch.Tensor,
    *,
    block: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row of ``logits`` [B, V] (float32 / bfloat16 / float16), int64 [B].

    Per row: ``temperature`` float32 (``< 1e-5``: greedy), ``top_k`` int32/int64 (``<= 0``:
    off), ``top_p`` float32 (``>= 1``: off), ``min_p`` float32 (0: off) and ``u`` a uniform in
    [0, 1) (float32 or float64). ``u`` may also be [B, S]: S independent draws per row from
    the same restricted distribution (the thresholds are found once), returned as [B, S].
    Everything stays on the device; ``block`` (a power of two) overrides the vocabulary tile."""
    _require_triton()
    B, V = logits.shape
    assert out is None or out.is_contiguous()
    draws = 1 if u.dim() == 1 else u.shape[1]
    shape = (B,) if u.dim() == 1 else (B, draws)
    out = torch.empty(shape, dtype=torch.int64, device=logits.device) if out is None else out
    if B == 0 or draws == 0:
        return out
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    u2 = u.reshape(B, draws).contiguous()
    params = [p.contiguous() for p in (temperature, top_k, top_p, min_p)]
    block = block or min(_MAX_BLOCK, _next_pow2(V))
    # on a GPU a [block, draws_block] tile must fit in registers; the interpreter wants few passes
    draws_block = min(_next_pow2(draws), 4096 if _interpreting() else max(1, 4096 // block))
    _sample_kernel[(B,)](
        logits, *params, u2, out, logits.stride(0), u2.stride(0), V, draws,
        BLOCK=block, PIVOTS=_PIVOTS, DRAWS_BLOCK=draws_block, num_warps=4 if block <= 256 else 8,
    )
    return out


# -- torch reference ----------------------------------------------------------------------------


def kept_mask_ref(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """bool [B, V]: the tokens a row may draw (positive probability after min-p, top-k, top-p),
    computed by sorting, with the kernel's conventions (ties at a threshold kept, greedy rows
    keep their best tokens). Float64 probabilities."""
    x = logits.double()
    greedy = temperature < _GREEDY_EPS
    t = torch.where(greedy, torch.ones_like(temperature), temperature).double()
    s = x / t[:, None]
    m = s.max(dim=-1, keepdim=True).values
    mp = torch.where(greedy, torch.ones_like(min_p), min_p.clamp(max=1.0)).double()
    keep = s >= torch.where(mp > 0, m.squeeze(1) + torch.log(mp.clamp(min=1e-300)), float("-inf"))[:, None]
    keep &= s > float("-inf")
    vocab = logits.shape[-1]
    k = torch.where(greedy, torch.zeros_like(top_k), top_k).long()
    sorted_x = x.sort(dim=-1, descending=True).values
    kth = sorted_x.gather(1, (k.clamp(1, vocab) - 1)[:, None])
    keep &= (x >= kth) | (k <= 0)[:, None] | (k >= vocab)[:, None]
    probs = torch.where(keep, (s - m).exp(), 0.0)
    order = x.argsort(dim=-1, descending=True)
    sp = probs.gather(1, order)
    # mass of the strictly better tokens, ties counted as one block (so ties are kept together)
    sv = x.gather(1, order)
    better = sp.cumsum(dim=-1) - sp
    tie_start = torch.searchsorted(-sv, -sv, side="left")  # first position of each value
    better = better.gather(1, tie_start)
    p = torch.where(greedy, torch.ones_like(top_p), top_p).double()
    nucleus = (better < p[:, None] * sp.sum(dim=-1, keepdim=True)) | (p >= 1)[:, None]
    nucleus |= tie_start == 0  # the best tokens always stay
    keep_sorted = nucleus & (sp > 0)
    return torch.zeros_like(keep).scatter(1, order, keep_sorted)


def probs_ref(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """float64 [B, V]: each row's restricted, renormalised distribution (greedy rows: uniform
    over their best tokens, of which the kernel picks the first)."""
    keep = kept_mask_ref(logits, temperature, top_k, top_p, min_p)
    greedy = temperature < _GREEDY_EPS
    t = torch.where(greedy, torch.ones_like(temperature), temperature).double()
    s = logits.double() / t[:, None]
    w = torch.where(keep, (s - s.max(dim=-1, keepdim=True).values).exp(), 0.0)
    return w / w.sum(dim=-1, keepdim=True)


def sample_ref(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    u: torch.Tensor,
) -> torch.Tensor:
    """What :func:`sample` computes, in torch (inverse CDF over the kept tokens sorted best
    first, so the token for a given ``u`` may differ; the distribution is the same). Greedy
    rows take the argmax. ``u`` [B] or [B, S], like :func:`sample`."""
    B = logits.shape[0]
    probs = probs_ref(logits, temperature, top_k, top_p, min_p)
    order = logits.float().argsort(dim=-1, descending=True, stable=True)
    sp = probs.gather(1, order)
    cdf = sp.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, u.double().reshape(B, -1) * cdf[:, -1:], right=True)
    last = sp.shape[-1] - 1 - (sp.flip(-1) > 0).int().argmax(dim=-1)
    idx = torch.minimum(idx.clamp(max=sp.shape[-1] - 1), last[:, None])
    picked = order.gather(1, idx)
    greedy = (temperature < _GREEDY_EPS)[:, None]
    return torch.where(greedy, logits.argmax(dim=-1, keepdim=True), picked).reshape(u.shape)
