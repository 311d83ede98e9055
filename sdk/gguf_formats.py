"""The GGUF block formats kept quantized: one table, fixed by the file format.

Every GGUF kernel (the torch reference in the ``gguf`` quantization method, the CPU kernels, the
Triton kernels) reads its block geometry from here, so a format is described once. The ids are
``gguf.GGMLQuantizationType`` values; each block is ``values`` weights stored in ``bytes`` bytes
(the layouts are documented in ``host.plugins.quantization.gguf_blocks``).
"""

from __future__ import annotations

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K = 2, 3, 6, 7, 8, 12, 14
F32, F16, BF16 = 0, 1, 30

BLOCKS: dict[int, tuple[int, int]] = {
    Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q8_0: (32, 34), Q4_K: (256, 144), Q6_K: (256, 210),
}
"""qtype -> (values per block, bytes per block) of the formats kept quantized."""

NAMES: dict[int, str] = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q6_K: "Q6_K"}
"""qtype -> the format's name as llama.cpp and the gguf package spell it."""
