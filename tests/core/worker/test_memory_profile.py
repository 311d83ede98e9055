"""KV-cache sizing on an accelerator: a profiling run of the largest step, then the budget.

CI has no GPU: the profiling run itself runs on CPU for every backend, and the worker's
accounting is driven through ``torch.cuda``'s memory functions monkeypatched with fixed figures.
"""

from __future__ import annotations

import pytest
import torch

from host import LLM
from host.core.worker.worker import GRAPH_MEMORY_RESERVE, kv_budget


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return str(tiny_checkpoint("llama"))


def test_kv_budget_arithmetic():
    gib = 2**30
    assert kv_budget(100 * gib, 0.9, 20 * gib, 1 * gib) == 69 * gib
    assert kv_budget(100 * gib, 0.9, 20 * gib, 1 * gib, reserve=gib) == 68 * gib
    assert kv_budget(10 * gib, 0.5, 6 * gib, 0) == 0  # never negative


@pytest.mark.parametrize("backend", ["cpu_paged", "torch_paged", "triton_paged"])
def test_profile_run_leaves_the_kv_cache_alone(tiny, backend, monkeypatch):
    if backend == "triton_paged":
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    llm = LLM(tiny, skip_tokenizer_init=True, max_model_len=64, max_num_batched_tokens=48, max_num_seqs=4,
              attention_backend=backend, optimization_level=1)
    runner = llm.engine.executor.worker.model_runner
    runner.kv_buffer.normal_()
    before = runner.kv_buffer.clone()
    runner.profile_run()
    assert torch.equal(runner.kv_buffer, before)


def test_worker_sizes_kv_from_the_profile(tiny, monkeypatch):
    llm = LLM(tiny, skip_tokenizer_init=True, max_model_len=64, max_num_batched_tokens=48, max_num_seqs=4)
    worker = llm.engine.executor.worker
    calls = []
    gib = 2**30
    monkeypatch.setattr(worker.model_runner, "profile_run", lambda: calls.append("profile"))
    fake = {
        "empty_cache": lambda: calls.append("empty"),
        "reset_peak_memory_stats": lambda device=None: calls.append("reset"),
        "synchronize": lambda device=None: None,
        "max_memory_allocated": lambda device=None: 3 * gib,
        "mem_get_info": lambda device=None: (70 * gib, 80 * gib),  # 10 GiB in use ...
        "memory_reserved": lambda device=None: 8 * gib,  # ... 8 of it torch's: 2 GiB non-torch
    }
    for name, fn in fake.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    worker.device = torch.device("cuda", 0)
    worker.config.compilation.cuda_graphs = True
    budget = worker.determine_available_memory()
    assert calls[:3] == ["empty", "reset", "profile"]
    assert budget == int(80 * gib * 0.9) - 3 * gib - 2 * gib - GRAPH_MEMORY_RESERVE
    worker.device = torch.device("cpu")
