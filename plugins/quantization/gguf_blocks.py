"""GGUF block formats in torch: dequantize Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K rows on any device.

A quantized ``[N, K]`` weight is ``uint8 [N, row_bytes]``: each row holds ``K / block_size``
blocks, stored as the .gguf file stores them. :func:`dequantize_rows` turns such rows back into
floats; it is the reference every GGUF kernel is tested against (itself tested against
``gguf.quants.dequantize``) and the path used on devices without a faster kernel, where it
dequantizes in chunks of rows so a large matrix never exists in full precision at once.

Block layouts (little-endian, ``d``/``dmin``/``m`` are float16):

- Q4_0 (32 values, 18 bytes): ``d``, 16 bytes of nibbles; value ``(q - 8) * d``; the low nibbles
  are values 0-15, the high nibbles 16-31.
- Q4_1 (32, 20): ``d``, ``m``, 16 bytes of nibbles; value ``q * d + m``.
- Q5_0 (32, 22): ``d``, 4 bytes ``qh`` (a little-endian uint32), 16 bytes of nibbles; value ``i``
  is its nibble (as Q4_0's) plus bit ``i`` of ``qh`` as bit 4, value ``(q - 16) * d``.
- Q5_1 (32, 24): ``d``, ``m``, ``qh``, 16 bytes of nibbles; the same 5-bit ``q``, value ``q * d + m``.
- Q8_0 (32, 34): ``d``, 32 int8; value ``q * d``.
- Q4_K (256, 144): ``d``, ``dmin``, 12 bytes holding eight 6-bit scales and eight 6-bit mins,
  128 bytes of nibbles; sub-block ``j`` of 32 values is ``d * scale_j * q - dmin * min_j``.
- Q6_K (256, 210): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales, ``d``;
  value ``d * scale * (q - 32)`` with 16 values per scale.
"""

from __future__ import annotations

import torch

# the format table (gguf.GGMLQuantizationType ids, block geometry) is the SDK's, shared with the
# platforms' kernels
from host.sdk.gguf_formats import BF16, BLOCKS, F16, F32, NAMES, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0  # noqa: F401


def row_bytes(qtype: int, k: int) -> int:
    """Bytes of one quantized row of ``k`` values; ``k`` must be a whole number of blocks."""
    size, nbytes = BLOCKS[qtype]
    if k % size:
        raise ValueError(f"a {NAMES[qtype]} row holds whole blocks of {size} values; {k} is not a multiple")
    return k // size * nbytes


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at byte ``start`` of every block, as float32 [..., 1]."""
    return blocks[..., start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: low nibbles first, then the high nibbles."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return (_nibbles(b[..., 2:18]).float() - 8.0) * _f16(b, 0)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _nibbles(b[..., 4:20]).float() * _f16(b, 0) + _f16(b, 2)


def _q5(b: torch.Tensor, qh_at: int) -> torch.Tensor:
    """The 32 five-bit levels of Q5_0 / Q5_1 blocks whose ``qh`` starts at byte ``qh_at``."""
    qh = b[..., qh_at : qh_at + 4].to(torch.int64)
    bits = qh[..., 0] | (qh[..., 1] << 8) | (qh[..., 2] << 16) | (qh[..., 3] << 24)  # [...]
    shifts = torch.arange(32, dtype=torch.int64, device=b.device)
    high = ((bits.unsqueeze(-1) >> shifts) & 1) << 4  # bit i -> bit 4 of value i
    return _nibbles(b[..., qh_at + 4 : qh_at + 20]).to(torch.int64) | high


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    return (_q5(b, 2).float() - 16.0) * _f16(b, 0)


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _q5(b, 4).float() * _f16(b, 0) + _f16(b, 2)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[..., 2:34].contiguous().view(torch.int8).float() * _f16(b, 0)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 scale bytes -> (scales [..., 8], mins [..., 8]) of 6 bits each."""
    s = s.to(torch.int32)
    low_sc, low_m, high = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([low_sc & 63, (high & 0x0F) | ((low_sc >> 6) << 4)], dim=-1)
    mn = torch.cat([low_m & 63, (high >> 4) | ((low_m >> 6) << 4)], dim=-1)
    return sc.float(), mn.float()


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scales(b[..., 4:16])
    qs = b[..., 16:144].reshape(*b.shape[:-1], 4, 32)  # four chunks of 64 values
    q = torch.stack([qs & 0x0F, qs >> 4], dim=-2).reshape(*b.shape[:-1], 8, 32).float()
    return (d.unsqueeze(-1) * sc.unsqueeze(-1) * q - dmin.unsqueeze(-1) * mn.unsqueeze(-1)).flatten(-2)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    lead = b.shape[:-1]
    ql = b[..., 0:128].reshape(*lead, 2, 64).to(torch.int32)
    qh = b[..., 128:192].reshape(*lead, 2, 1, 32).to(torch.int32)
    sc = b[..., 192:208].contiguous().view(torch.int8).float().reshape(*lead, 2, 8)
    d = _f16(b, 208).unsqueeze(-1).unsqueeze(-1)  # [..., 1, 1, 1]
    low = torch.cat([ql & 0x0F, ql >> 4], dim=-1).reshape(*lead, 2, 4, 32)  # quarters of 32 values
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=b.device).view(4, 1)
    high = (qh >> shifts) & 3
    q = (low | (high << 4)).float() - 32.0  # [..., 2, 4, 32]
    scale = sc.reshape(*lead, 2, 4, 2).repeat_interleave(16, dim=-1)  # 16 values per scale
    return (d * scale * q).flatten(-3)


_DEQUANT = {Q4_0: _q4_0, Q4_1: _q4_1, Q5_0: _q5_0, Q5_1: _q5_1, Q8_0: _q8_0, Q4_K: _q4_k, Q6_K: _q6_k}


def dequantize_rows(qweight: torch.Tensor, qtype: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``uint8 [N, row_bytes]`` -> ``[N, K]`` in ``dtype`` (computed in float32)."""
    if qtype not in _DEQUANT:
        raise ValueError(f"GGUF quantization type {qtype} is not one of {', '.join(NAMES.values())}")
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise ValueError(f"GGUF rows must be uint8 [N, row_bytes], got {qweight.dtype} {tuple(qweight.shape)}")
    size, nbytes = BLOCKS[qtype]
    n, rb = qweight.shape
    if rb % nbytes:
        raise ValueError(f"a {NAMES[qtype]} row is whole blocks of {nbytes} bytes; {rb} bytes is not")
    blocks = qweight.reshape(n, rb // nbytes, nbytes)
    return _DEQUANT[qtype](blocks).reshape(n, rb // nbytes * size).to(dtype)


def linear_reference(
    x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None, chunk_rows: int = 4096
) -> torch.Tensor:
    """``x @ dequantize(qweight)^T + bias`` in torch, dequantizing ``chunk_rows`` rows at a time
    (activations in float32 or x's dtype when wider; the result in x's dtype)."""
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    x2 = x.reshape(-1, x.shape[-1]).to(compute)
    n = qweight.shape[0]
    out = torch.empty(x2.shape[0], n, dtype=compute, device=x.device)
    for start in range(0, n, chunk_rows):
        w = dequantize_rows(qweight[start : start + chunk_rows], qtype, compute)
        torch.matmul(x2, w.t(), out=out[:, start : start + w.shape[0]])
    if bias is not None:
        out += bias.to(compute)
    return out.to(x.dtype).reshape(*x.shape[:-1], n)


def embedding_reference(ids: torch.Tensor, qweight: torch.Tensor, qtype: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` of a quantized embedding table, dequantized: only those rows are touched."""
    flat = ids.reshape(-1)
    return dequantize_rows(qweight.index_select(0, flat), qtype, dtype).reshape(*ids.shape, -1)
