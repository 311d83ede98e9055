"""Attention backend selection through the plugin host, seen from a running engine."""

from __future__ import annotations

import pytest
import torch

from host import LLM, SamplingParams
from host.plugins.builtin_cpu.attention import CpuPagedAttentionBackend
from host.sdk import MultipleOf, hookimpl


@pytest.fixture(scope="module")
def tiny_llama(tiny_checkpoint) -> str:
    return str(tiny_checkpoint("llama", intermediate_size=128, vocab_size=256, initializer_range=0.1))


class CountingBackend(CpuPagedAttentionBackend):
    """The CPU kernel under another name, counting how often its impl runs."""

    name = "counting_cpu"
    calls = 0

    @classmethod
    def get_impl_cls(cls):
        base = super().get_impl_cls()

        class Impl(base):
            def forward(self, *args, **kwargs):
                CountingBackend.calls += 1
                return super().forward(*args, **kwargs)

        return Impl


class BackendPlugin:
    @hookimpl
    def host_register_attention_backends(self, register):
        register(CountingBackend)


class Chooser:
    @hookimpl
    def host_select_attention_backend(self, platform, requirements, candidates):
        names = [c.name for c in candidates]
        assert "cpu_paged" in names and requirements.device_type == "cpu"
        return "counting_cpu"


def generate(llm: LLM) -> list[int]:
    out = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    return out[0].outputs[0].token_ids


def test_platform_priority_picks_cpu_paged(plugin_host, tiny_llama):
    llm = LLM(tiny_llama, skip_tokenizer_init=True, max_model_len=64)
    assert llm.engine.executor.worker.model_runner.attn_backend.name == "cpu_paged"


def test_a_plugin_can_choose_the_backend(plugin_host, register_plugin, tiny_llama):
    register_plugin(BackendPlugin(), name="counting", group="host.attention_backends")
    baseline = generate(LLM(tiny_llama, skip_tokenizer_init=True, max_model_len=64))
    register_plugin(Chooser(), name="chooser", group="host.attention_backends")
    CountingBackend.calls = 0
    llm = LLM(tiny_llama, skip_tokenizer_init=True, max_model_len=64)
    assert llm.engine.executor.worker.model_runner.attn_backend is CountingBackend
    assert generate(llm) == baseline
    assert CountingBackend.calls > 0


class Wide(CpuPagedAttentionBackend):
    name = "wide_blocks"
    block_size_constraint = MultipleOf(64)


class WidePlugin:
    @hookimpl
    def host_register_attention_backends(self, register):
        register(Wide)


def test_forced_backend_must_exist_and_fit(plugin_host, register_plugin, tiny_llama):
    with pytest.raises(ValueError, match="'nope' is not registered.*cpu_paged"):
        LLM(tiny_llama, skip_tokenizer_init=True, max_model_len=64, attention_backend="nope")
    register_plugin(WidePlugin(), name="wide", group="host.attention_backends")
    with pytest.raises(ValueError, match="wide_blocks: block size 16 is not a multiple of 64"):
        LLM(tiny_llama, skip_tokenizer_init=True, max_model_len=64, attention_backend="wide_blocks")
    llm = LLM(tiny_llama, skip_tokenizer_init=True, max_model_len=64, attention_backend="wide_blocks", block_size=64)
    assert llm.engine.executor.worker.model_runner.attn_backend is Wide


def test_bfloat16_engine_runs_and_frees_blocks(plugin_host, tiny_llama):
    llm = LLM(tiny_llama, skip_tokenizer_init=True, max_model_len=64, dtype="bfloat16")
    assert llm.engine.executor.worker.model_runner.kv_buffer.dtype == torch.bfloat16
    tokens = generate(llm)
    assert len(tokens) == 4 and all(0 <= t < 256 for t in tokens)
    manager = llm.engine.kv_cache_manager
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1
