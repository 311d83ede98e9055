"""A tiny random Llama written as a real .gguf file with the ``gguf`` package's writer, its
projections in chosen block formats (for the kept-quantized loading tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from quant_blocks import random_blocks

from host.plugins.quantization.gguf_blocks import BLOCKS, Q4_0, Q4_1, Q8_0

SHAPE = dict(hidden=256, inter=512, layers=2, heads=4, kv_heads=2, vocab=384, context=256)


def _tensor(writer: GGUFWriter, name: str, rows: int, cols: int, qtype: int, rng: np.random.Generator, std: float) -> None:
    if qtype == 0:
        writer.add_tensor(name, (rng.standard_normal((rows, cols)) * std).astype(np.float32))
        return
    if qtype in (Q4_0, Q4_1, Q8_0):
        data = quantize((rng.standard_normal((rows, cols)) * std).astype(np.float32), GGMLQuantizationType(qtype))
    else:  # gguf has no quantizer for the k-quants: random valid blocks, super-block scales small
        # enough that weights stay near std (a value is d * sub-scale (up to 63 or 127) * q)
        data = random_blocks(qtype, rows, cols // BLOCKS[qtype][0], seed=int(rng.integers(1 << 30)), scale=std / 2000)
    writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType(qtype))


def write_tiny_gguf(path: Path, qtype: int, *, embed_qtype: int | None = None, mixed_v: int | None = None, seed: int = 0) -> Path:
    """A 2-layer Llama (hidden 256, vocab 384, tied embeddings) with every projection in ``qtype``,
    the embedding in ``embed_qtype`` (default: ``qtype``) and, if given, the v projection and the
    down projection in ``mixed_v`` (a fused q/k/v of two block types)."""
    s = SHAPE
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(s["layers"])
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_feed_forward_length(s["inter"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(s["vocab"])
    hd = s["hidden"] // s["heads"]
    _tensor(writer, "token_embd.weight", s["vocab"], s["hidden"], embed_qtype if embed_qtype is not None else qtype, rng, 0.05)
    writer.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(s["hidden"])).astype(np.float32))
    for i in range(s["layers"]):
        b = f"blk.{i}"
        writer.add_tensor(f"{b}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(s["hidden"])).astype(np.float32))
        writer.add_tensor(f"{b}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(s["hidden"])).astype(np.float32))
        _tensor(writer, f"{b}.attn_q.weight", s["heads"] * hd, s["hidden"], qtype, rng, 0.1)
        _tensor(writer, f"{b}.attn_k.weight", s["kv_heads"] * hd, s["hidden"], qtype, rng, 0.1)
        _tensor(writer, f"{b}.attn_v.weight", s["kv_heads"] * hd, s["hidden"], mixed_v or qtype, rng, 0.1)
        _tensor(writer, f"{b}.attn_output.weight", s["hidden"], s["heads"] * hd, qtype, rng, 0.1)
        _tensor(writer, f"{b}.ffn_gate.weight", s["inter"], s["hidden"], qtype, rng, 0.1)
        _tensor(writer, f"{b}.ffn_up.weight", s["inter"], s["hidden"], qtype, rng, 0.1)
        _tensor(writer, f"{b}.ffn_down.weight", s["hidden"], s["inter"], mixed_v or qtype, rng, 0.1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
