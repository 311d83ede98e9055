"""fp8 KV pages in the Triton backend (``triton_paged``) against the torch path (``torch_paged``,
itself checked against an e4m3 grid in tests/plugins/torch_paged/test_fp8_kv.py): the same steps —
prompts, then a chunk and decodes after cached context, then decodes only (the split-K kernel) —
must write byte-identical fp8 pages and attend to the same output.

Without a GPU the kernels run under Triton's interpreter on CPU tensors; shapes are tiny.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")
from host.plugins.torch_paged.attention import TorchPagedAttentionBackend  # noqa: E402
from host.plugins.triton_ops.attention import TritonPagedAttentionBackend  # noqa: E402
from host.sdk.attention import AttentionRequirements, CommonAttentionMetadata  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.triton
HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 4, 2, 16, 4


def metadata(steps: list[tuple[int, int]], table: torch.Tensor) -> CommonAttentionMetadata:
    """Request ``r`` has ``steps[r] = (cached, new)`` tokens this step."""
    qlens = torch.tensor([q for _, q in steps])
    seq_lens = torch.tensor([c + q for c, q in steps], dtype=torch.int32)
    slots = [table[r, torch.arange(c, c + q) // BLOCK].long() * BLOCK + torch.arange(c, c + q) % BLOCK
             for r, (c, q) in enumerate(steps)]
    qsl = torch.cat((torch.zeros(1, dtype=torch.int64), qlens.cumsum(0))).to(torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl.to(DEV), seq_lens=seq_lens.to(DEV), block_table=table.to(DEV),
        slot_mapping=torch.cat(slots).to(DEV), num_reqs=len(steps), num_actual_tokens=int(qlens.sum()),
        max_query_len=int(qlens.max()), max_seq_len=int(seq_lens.max()), block_size=BLOCK,
        query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens,
    )


def run(backend, schedule, table, num_blocks, k_scale, v_scale, dtype):
    """Every step of ``schedule`` through ``backend`` over one fp8 cache: (outputs, cache)."""
    gen = torch.Generator().manual_seed(5)
    cache = torch.zeros(backend.get_kv_cache_shape(num_blocks, BLOCK, KV_HEADS, HEAD_SIZE), dtype=torch.float8_e4m3fn, device=DEV)
    impl = backend.get_impl_cls()(HEADS, HEAD_SIZE, HEAD_SIZE**-0.5, KV_HEADS)
    impl.k_scale, impl.v_scale = k_scale, v_scale
    builder = backend.get_builder_cls()(backend, torch.device(DEV))
    outs = []
    for steps in schedule:
        n = sum(q for _, q in steps)
        q = torch.randn(n, HEADS, HEAD_SIZE, generator=gen).to(dtype).to(DEV)
        k = (torch.randn(n, KV_HEADS, HEAD_SIZE, generator=gen) * 3 * k_scale).to(dtype).to(DEV)
        v = (torch.randn(n, KV_HEADS, HEAD_SIZE, generator=gen) * v_scale).to(dtype).to(DEV)
        outs.append(impl.forward(q, k, v, cache, builder.build(metadata(steps, table))).float().cpu())
    return outs, cache


@pytest.mark.parametrize("dtype, k_scale, v_scale", [(torch.float32, 0.05, 2.0), (torch.bfloat16, 1.0, 1.0)])
def test_triton_fp8_pages_match_the_torch_path(dtype, k_scale, v_scale):
    final = [14, 6, 9]
    schedule = [
        [(0, 10), (0, 3), (0, 7)],  # prompts
        [(10, 3), (3, 2), (7, 1)],  # a chunk after cached context, mixed with decodes
        [(13, 1), (5, 1), (8, 1)],  # decodes only: the split-K decode kernel
    ]
    blocks = [math.ceil(n / BLOCK) for n in final]
    num_blocks = sum(blocks) + 2
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(1)).tolist()
    table = torch.zeros(len(final), max(blocks), dtype=torch.int32)
    for r, nb in enumerate(blocks):
        table[r, :nb] = torch.tensor([perm.pop() for _ in range(nb)], dtype=torch.int32)
    got, cache = run(TritonPagedAttentionBackend, schedule, table, num_blocks, k_scale, v_scale, dtype)
    want, ref_cache = run(TorchPagedAttentionBackend, schedule, table, num_blocks, k_scale, v_scale, dtype)
    assert torch.equal(cache.view(torch.uint8).cpu(), ref_cache.view(torch.uint8).cpu())  # the same e4m3 bytes
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for step, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, **tol, msg=lambda m: f"step {step}: {m}")


def test_fp8_needs_compute_capability_8_9_on_cuda(monkeypatch):
    """The capability gate (no GPU needed): below 8.9 triton_paged refuses fp8 naming why, and the
    platform's next backend (torch_paged) takes it; e5m2 is refused by every backend."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    req = AttentionRequirements("cuda", "bfloat16", 64, 16, kv_cache_dtype="fp8")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    reason = TritonPagedAttentionBackend.supports_combination(req)
    assert "compute capability >= 8.9" in reason and "8.0" in reason
    assert TorchPagedAttentionBackend.supports_combination(req) is None
    for capability in ((8, 9), (9, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert TritonPagedAttentionBackend.supports_combination(req) is None
    e5m2 = AttentionRequirements("cuda", "bfloat16", 64, 16, kv_cache_dtype="fp8_e5m2")
    assert "kv cache dtype" in TritonPagedAttentionBackend.supports_combination(e5m2)
