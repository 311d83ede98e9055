"""The adapter in the prefix-cache hash: by name and by content (issue 18, deliverable 3).

Real requests, a real block hasher and a real KV cache manager: a request's prefix hit is
what another request with the same prompt left in the cache, and the adapter decides whether
it may be reused.
"""

from __future__ import annotations

import json

import pytest

from host.contracts.lora_request import LoRARequest
from host.contracts.request import Request
from host.core.kv_cache.hashing import block_extra_keys, hash_token_blocks, make_block_hasher
from host.core.kv_cache.manager import KVCacheManager
from host.core.lora.adapter import adapter_digest

BS = 4
PROMPT = list(range(100, 118))  # 4 full blocks and 2 tokens


def write_adapter(path, weights: bytes) -> str:
    """An adapter directory's two files (only their bytes matter to the digest)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}))
    (path / "adapter_model.safetensors").write_bytes(weights)
    return str(path)


@pytest.fixture
def adapters(tmp_path):
    x = write_adapter(tmp_path / "x", b"weights of x")
    y = write_adapter(tmp_path / "y", b"weights of y")
    x2 = write_adapter(tmp_path / "x-retrained", b"weights of x, retrained")
    return {
        "x": LoRARequest("x", 1, x, adapter_digest(x)),
        "y": LoRARequest("y", 2, y, adapter_digest(y)),
        # the same name and id, reloaded from changed files: only the digest differs
        "x-changed": LoRARequest("x", 1, x2, adapter_digest(x2)),
    }


def request(req_id: str, lora: LoRARequest | None, salt: str | None = None) -> Request:
    return Request(req_id, PROMPT, cache_salt=salt, lora_request=lora, block_hasher=make_block_hasher(BS))


def prefix_hit_after(first: Request, second: Request) -> int:
    """Tokens of ``second``'s prompt served from the cache once ``first`` ran and was freed."""
    m = KVCacheManager(num_blocks=16, block_size=BS)
    hit, num_hit = m.get_computed_blocks(first)
    assert num_hit == 0
    assert m.allocate_slots(first, first.num_tokens, hit, num_hit) is not None
    first.num_computed_tokens = first.num_tokens
    m.free(first)
    hit, num_hit = m.get_computed_blocks(second)
    assert m.allocate_slots(second, second.num_tokens - num_hit, hit, num_hit) is not None
    m.free(second)
    assert m.block_pool.get_num_free_blocks() == m.block_pool.num_blocks - 1  # nothing leaked
    return num_hit


def test_every_block_of_a_lora_request_starts_with_its_adapter(adapters):
    x = adapters["x"]
    key = ("lora", "x", x.digest)
    assert block_extra_keys(0, None, x) == key
    assert block_extra_keys(8, None, x) == key
    assert block_extra_keys(0, "tenant", x) == key + ("tenant",)  # the salt follows, on block 0
    assert block_extra_keys(8, "tenant", x) == key
    assert block_extra_keys(0, "tenant") == ("tenant",) and block_extra_keys(8) is None  # base: unchanged
    assert request("r", x).block_hashes == hash_token_blocks(PROMPT, BS, lora_request=x)
    assert len(request("r", x).block_hashes) == 4


def test_the_same_adapter_shares_every_full_block(adapters):
    # 4 full blocks are cached; the last full block is recomputed only when the prompt ends on it
    assert prefix_hit_after(request("a", adapters["x"]), request("b", adapters["x"])) == 16
    assert prefix_hit_after(request("a", None), request("b", None)) == 16


@pytest.mark.parametrize("first,second", [
    ("x", "y"),            # two adapters
    ("x", "x-changed"),    # the same name and id, changed weights: a new digest
    (None, "x"),           # base model, then an adapter
    ("x", None),           # an adapter, then the base model
])
def test_different_adapters_share_no_block(adapters, first, second):
    a = request("a", adapters.get(first))
    b = request("b", adapters.get(second))
    assert not set(a.block_hashes) & set(b.block_hashes)
    assert prefix_hit_after(a, b) == 0


def test_a_changed_adapter_file_changes_the_digest(tmp_path):
    path = write_adapter(tmp_path / "z", b"old weights")
    old = adapter_digest(path)
    write_adapter(tmp_path / "z", b"new weights!")
    new = adapter_digest(path)
    assert old != new
    before = request("a", LoRARequest("z", 3, path, old))
    after = request("b", LoRARequest("z", 3, path, new))
    assert prefix_hit_after(before, after) == 0


def test_salt_and_adapter_both_separate(adapters):
    x = adapters["x"]
    assert prefix_hit_after(request("a", x, "t1"), request("b", x, "t2")) == 0
    assert prefix_hit_after(request("a", x, "t1"), request("b", x, "t1")) == 16
