"""The ``shared_storage`` KV connector: blocks saved by one engine are loaded by a new engine on
the same directory (a restart) with greedy tokens equal to an engine without a connector (and
that one equal to transformers); the files themselves (atomic writes, the size cap, a corrupt
file, the compatibility fingerprint) through the real engines' worker-role connector.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams

COMMON = dict(skip_tokenizer_init=True, max_model_len=96, max_num_batched_tokens=32, max_num_seqs=4, block_size=8)
GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)


def prompts(seed, lengths):
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(n)] for n in lengths]


PROMPTS = prompts(11, [5, 16, 29, 50])


def run(llm, ps):
    return llm.generate([{"prompt_token_ids": p} for p in ps], GREEDY)


def storage_llm(model, path, policy="recompute", **extra):
    return LLM(model, kv_transfer_config={"kv_connector": "shared_storage", "kv_load_failure_policy": policy,
                                          "kv_connector_extra_config": {"path": str(path), **extra}}, **COMMON)


def no_leaks(llm):
    manager = llm.engine.kv_cache_manager
    assert not llm.engine.scheduler.requests
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1


def worker_connector(llm):
    return llm.engine.executor.worker.model_runner.kv_connector.connector


def files(directory):
    return sorted(n for n in os.listdir(directory))


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    path = tiny_checkpoint("llama", initializer_range=0.1, tie_word_embeddings=True)
    return str(path), hf_model(path)


@pytest.fixture(scope="module")
def want(tiny):
    model, hf = tiny
    got = [o.outputs[0].token_ids for o in run(LLM(model, **COMMON), PROMPTS)]
    assert got == [hf_greedy(hf, p, 5) for p in PROMPTS]
    return got


@pytest.fixture(scope="module")
def stored(tiny, want, tmp_path_factory):
    """One engine ran PROMPTS with the connector: its directory and the engine."""
    path = tmp_path_factory.mktemp("kv")
    llm = storage_llm(tiny[0], path)
    assert [o.outputs[0].token_ids for o in run(llm, PROMPTS)] == want
    no_leaks(llm)
    return path, llm


def test_a_restarted_engine_loads_the_saved_blocks_and_keeps_the_tokens(tiny, want, stored):
    path, first = stored
    conn = worker_connector(first)
    # one file per full block computed (prompt and output, the last sampled token excluded)
    full = {h.hex() for p, w in zip(PROMPTS, want) for h in _hashes(first, p + w[:-1])}
    names = files(conn.dir)
    assert not [n for n in names if n.startswith(".tmp-")]  # atomic: no temporary file left
    assert {n.split(".")[0] for n in names} == full
    llm = storage_llm(tiny[0], path)  # a new engine on the same directory: a restart
    got = run(llm, PROMPTS)
    assert [o.outputs[0].token_ids for o in got] == want
    prompt_blocks = [len(p) // 8 * 8 for p in PROMPTS]
    assert [o.num_cached_tokens for o in got] == [min(n, len(p) - 1) for n, p in zip(prompt_blocks, PROMPTS)]
    stats = llm.engine.scheduler.make_stats().kv_connector_stats
    assert stats["external_hit_tokens"] == sum(prompt_blocks)
    assert stats["load_bytes"] > 0
    no_leaks(llm)


def _hashes(llm, tokens):
    """The engine's chained block hashes of ``tokens`` (a real Request with the scheduler's hasher)."""
    from host.contracts.request import Request
    from host.core.kv_cache.hashing import make_block_hasher

    return Request("h", list(tokens), GREEDY, block_hasher=make_block_hasher(8)).block_hashes


def test_saved_bytes_equal_the_engine_kv_and_a_corrupt_file_recomputes(tiny, want, stored, tmp_path):
    path, first = stored
    conn = worker_connector(first)
    # every stored block holds exactly the engine's K/V of that block, every layer
    pool = first.engine.kv_cache_manager.block_pool
    checked = 0
    for block in pool.blocks:
        if block.block_hash is None or not os.path.exists(conn.file(block.block_hash.hex(), 0)):
            continue
        saved = torch.load(conn.file(block.block_hash.hex(), 0), weights_only=True)
        assert torch.equal(saved, torch.stack([kv[:, block.block_id].cpu() for kv in conn.layers]))
        checked += 1
    assert checked >= 5
    # a copy of the directory with one prompt's second block corrupted: recomputed, same tokens
    copy = tmp_path / "copy"
    (copy / os.path.basename(conn.dir)).mkdir(parents=True)
    for n in files(conn.dir):
        with open(os.path.join(conn.dir, n), "rb") as f:
            (copy / os.path.basename(conn.dir) / n).write_bytes(f.read())
    llm = storage_llm(tiny[0], copy)
    bad = _hashes(llm, PROMPTS[3])[1].hex()
    (copy / os.path.basename(conn.dir) / f"{bad}.r0.pt").write_bytes(b"not a tensor")
    got = run(llm, PROMPTS[3:])
    assert got[0].outputs[0].token_ids == want[3]
    stats = llm.engine.scheduler.make_stats().kv_connector_stats
    assert stats["failed_transfers"] == 1
    no_leaks(llm)


def test_the_fingerprint_separates_incompatible_engines(tiny, want, stored):
    path, first = stored
    other = LLM(tiny[0], kv_transfer_config={"kv_connector": "shared_storage",
                                             "kv_connector_extra_config": {"path": str(path)}},
                **{**COMMON, "block_size": 16})
    assert worker_connector(other).dir != worker_connector(first).dir
    got = run(other, PROMPTS)
    assert [o.outputs[0].token_ids for o in got] == want
    assert [o.num_cached_tokens for o in got] == [0, 0, 0, 0]


def test_the_size_cap_evicts_the_least_recently_used_files(tiny, want, tmp_path):
    llm = storage_llm(tiny[0], tmp_path, max_bytes=10**9)
    conn = worker_connector(llm)
    run(llm, PROMPTS[3:])
    names = files(conn.dir)
    size = os.path.getsize(os.path.join(conn.dir, names[0]))
    # oldest first by mtime; keep room for three files
    for i, n in enumerate(names):
        os.utime(os.path.join(conn.dir, n), ns=(i * 10**9, i * 10**9))
    conn.max_bytes = 3 * size
    conn.evict()
    assert files(conn.dir) == names[-3:]
    with pytest.raises(ValueError, match="max_bytes"):
        storage_llm(tiny[0], tmp_path, max_bytes=-1)


FLAKY = r'''
import json, sys
from host import LLM, SamplingParams
model, path = sys.argv[1], sys.argv[2]
common = dict(skip_tokenizer_init=True, max_model_len=96, max_num_batched_tokens=32, max_num_seqs=4, block_size=8)
params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
prompts = json.loads(sys.argv[3])

def flaky(rate, policy="recompute"):
    return LLM(model, kv_transfer_config={"kv_connector": "flaky_storage", "kv_load_failure_policy": policy,
               "kv_connector_extra_config": {"path": path, "drop_rate": rate, "seed": 1}}, **common)

def free(llm):
    m = llm.engine.kv_cache_manager
    return m.block_pool.get_num_free_blocks() == m.num_blocks - 1 and not llm.engine.scheduler.requests

def gen(llm, ps):
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in ps], params)]

out = {}
saver = flaky(0.0)
out["saved"] = gen(saver, prompts)
del saver
llm = flaky(0.5)
out["recompute"] = gen(llm, prompts)
out["recompute_stats"] = llm.engine.scheduler.make_stats().kv_connector_stats
out["recompute_free"] = free(llm)
del llm
llm = flaky(1.0, "fail")
try:
    gen(llm, prompts[3:])
    out["fail"] = None
except Exception as e:
    out["fail"] = f"{type(e).__name__}: {e}"
out["fail_free"] = free(llm)
out["after_fail"] = gen(llm, [[7, 8, 9]])
print(json.dumps(out))
'''


def test_a_third_party_connector_dropping_loads_recomputes_or_fails(tiny, want, fixture_sites, tmp_path):
    """The ``kvflaky`` fixture package (``flaky_storage``, host.sdk only), installed as a third
    party would be: half its loads dropped recompute to the tokens of an engine without a
    connector; with every load dropped and ``kv_load_failure_policy=fail`` the request fails
    naming the policy; no blocks are held afterwards."""
    import json
    import subprocess
    import sys

    from helpers import subprocess_env

    proc = subprocess.run([sys.executable, "-c", FLAKY, tiny[0], str(tmp_path), json.dumps(PROMPTS)],
                          capture_output=True, text=True, env=subprocess_env([fixture_sites["kvflaky"]]), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["saved"] == want
    assert out["recompute"] == want
    stats = out["recompute_stats"]
    assert stats["dropped_loads"] >= 1 and stats["load_bytes"] > 0, stats
    assert stats["external_hit_tokens"] == sum(len(p) // 8 * 8 for p in PROMPTS)
    assert out["recompute_free"] and out["fail_free"]
    assert out["fail"] is not None and "kv_load_failure_policy=fail" in out["fail"], out["fail"]
    assert out["after_fail"] == [hf_greedy(tiny[1], [7, 8, 9], 5)]


def test_a_server_on_the_same_directory_reports_the_blocks_as_cached(tiny, want, stored, tmp_path):
    """``host serve`` with the connector on the directory the offline engine filled (another
    process: a restart): the openai client's usage counts the stored full blocks as cached and
    the tokens are the no-connector greedy output."""
    import json

    import openai

    from helpers import run_server
    from host.core.models.default_model import resolve_model_path

    path, _ = stored
    tokenizer = resolve_model_path("default")  # ids < 300 decode with any larger vocabulary
    config = {"kv_connector": "shared_storage", "kv_connector_extra_config": {"path": str(path)}}
    args = ["--model", tiny[0], "--tokenizer", tokenizer, "--max-model-len", "96", "--block-size", "8",
            "--enable-prompt-tokens-details", "--kv-transfer-config", json.dumps(config)]
    with run_server(tmp_path, args) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        done = client.completions.create(model=tiny[0], prompt=PROMPTS[3], max_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True, "return_token_ids": True})
    assert done.usage.prompt_tokens == len(PROMPTS[3])
    assert done.usage.prompt_tokens_details.cached_tokens == len(PROMPTS[3]) // 8 * 8
    assert done.choices[0].model_extra["token_ids"] == want[3]
