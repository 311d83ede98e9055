"""Random but valid GGUF block rows for kernel tests (finite float16 scales, random quant bytes)."""

from __future__ import annotations

import numpy as np

from host.plugins.quantization.gguf_blocks import BLOCKS, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0

# byte offsets of each format's float16 fields (random bytes there could be inf/NaN)
F16_FIELDS = {Q4_0: (0,), Q4_1: (0, 2), Q5_0: (0,), Q5_1: (0, 2), Q8_0: (0,), Q4_K: (0, 2), Q6_K: (208,)}


def random_blocks(qtype: int, rows: int, blocks: int, seed: int = 0, scale: float = 0.05) -> np.ndarray:
    """``uint8 [rows, blocks * block_bytes]`` of ``qtype``, float16 fields uniform in ±``scale``."""
    rng = np.random.default_rng(seed)
    _, nbytes = BLOCKS[qtype]
    raw = rng.integers(0, 256, size=(rows, blocks, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        scales = rng.uniform(-scale, scale, size=(rows, blocks)).astype(np.float16)
        raw[:, :, off : off + 2] = scales.view(np.uint8).reshape(rows, blocks, 2)
    return raw.reshape(rows, blocks * nbytes)
