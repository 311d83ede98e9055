"""``--kv-cache-dtype``: the page size follows the element type, so one budget buys 2x the blocks
of bfloat16 and 4x those of float32 in fp8; the config accepts only auto / fp8 / fp8_e4m3."""

from __future__ import annotations

import pytest

from host.core.config import CacheConfig
from host.core.kv_cache.spec import FullAttentionSpec, kv_cache_element_dtype, num_blocks_from_memory


def test_element_dtype_of_each_flag_value():
    assert kv_cache_element_dtype("auto", "bfloat16") == "bfloat16"
    assert kv_cache_element_dtype("auto", "torch.float32") == "float32"
    assert kv_cache_element_dtype("fp8", "bfloat16") == "float8_e4m3fn"
    assert kv_cache_element_dtype("fp8_e4m3", "float32") == "float8_e4m3fn"
    with pytest.raises(ValueError, match="fp8_e5m2.*auto, fp8, fp8_e4m3"):
        kv_cache_element_dtype("fp8_e5m2", "float32")


def test_the_same_budget_holds_4x_the_fp32_blocks_and_2x_the_bf16_blocks():
    # SmolLM2-135M's attention shape: 30 layers, 3 KV heads of 64
    def specs(cache_dtype: str, model_dtype: str) -> list[FullAttentionSpec]:
        return [FullAttentionSpec(16, 3, 64, kv_cache_element_dtype(cache_dtype, model_dtype))] * 30

    fp8, bf16, fp32 = specs("fp8", "bfloat16"), specs("auto", "bfloat16"), specs("auto", "float32")
    assert fp8[0].page_size_bytes == 2 * 16 * 3 * 64 * 1
    assert 2 * fp8[0].page_size_bytes == bf16[0].page_size_bytes and 4 * fp8[0].page_size_bytes == fp32[0].page_size_bytes
    budget = 512 * 2**20
    n8, n16, n32 = (num_blocks_from_memory(budget, s, max_model_len=2048) for s in (fp8, bf16, fp32))
    assert n8 == 2 * n16 == 4 * n32, (n8, n16, n32)
    assert n8 * sum(s.page_size_bytes for s in fp8) <= budget


def test_cache_config_names_the_accepted_values():
    for value in ("auto", "fp8", "fp8_e4m3"):
        assert CacheConfig(cache_dtype=value).cache_dtype == value
    with pytest.raises(ValueError, match=r"kv_cache_dtype='int4' is not supported; use one of auto, fp8, fp8_e4m3"):
        CacheConfig(cache_dtype="int4")
