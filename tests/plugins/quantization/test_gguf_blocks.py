"""The torch GGUF block decoder against the gguf package's own dequantizer (the reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from quant_blocks import random_blocks

from host.plugins.quantization.gguf_blocks import BLOCKS, Q4_0, Q4_1, Q4_K, dequantize_rows, linear_reference, row_bytes


@pytest.mark.parametrize("qtype", sorted(BLOCKS))
def test_dequantize_rows_equals_the_gguf_package(qtype):
    raw = random_blocks(qtype, rows=7, blocks=3)
    expected = dequantize(raw, GGMLQuantizationType(qtype))
    got = dequantize_rows(torch.from_numpy(raw), qtype)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got.numpy(), expected)


@pytest.mark.parametrize("qtype", sorted(BLOCKS))
def test_linear_reference_matches_float64_matmul(qtype):
    size, _ = BLOCKS[qtype]
    raw = random_blocks(qtype, rows=9, blocks=2, seed=1)
    w = torch.from_numpy(dequantize(raw, GGMLQuantizationType(qtype))).double()
    gen = torch.Generator().manual_seed(qtype)
    x = torch.randn(3, 2 * size, dtype=torch.float32, generator=gen)
    bias = torch.randn(9, generator=gen)
    y = linear_reference(x, torch.from_numpy(raw), qtype, bias, chunk_rows=4)  # chunks of rows
    ref = x.double() @ w.T + bias.double()
    # float32 summation of 2 blocks: a few ulps of the largest output (Q6_K's reach ~100)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6 * float(ref.abs().max()) + 1e-5)
    y16 = linear_reference(x.bfloat16(), torch.from_numpy(raw), qtype, None)
    assert y16.dtype == torch.bfloat16


def test_row_bytes_and_bad_input():
    assert row_bytes(Q4_1, 576) == 18 * 20
    with pytest.raises(ValueError, match="multiple"):
        row_bytes(Q4_K, 576)
    with pytest.raises(ValueError, match="uint8"):
        dequantize_rows(torch.zeros(2, 18), Q4_0)
    with pytest.raises(ValueError, match="not one of"):
        dequantize_rows(torch.zeros(2, 18, dtype=torch.uint8), 99)
