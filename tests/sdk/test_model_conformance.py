"""The model-architecture conformance suite run on host's own architectures (registered through
the ``host.models`` group like any plugin's), each on a tiny random transformers config."""

from __future__ import annotations

import transformers

from host.sdk.testing import ModelConformance

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=320, max_position_embeddings=128, initializer_range=0.1)


class TestLlama(ModelConformance):
    architecture = "LlamaForCausalLM"

    def config(self):
        return transformers.LlamaConfig(**SHAPE)


class TestQwen2(ModelConformance):
    architecture = "Qwen2ForCausalLM"
    tensor_parallel_size = 0  # the Llama class's tensor-parallel path is checked once, above

    def config(self):
        return transformers.Qwen2Config(**SHAPE)


class TestQwen3(ModelConformance):
    architecture = "Qwen3ForCausalLM"
    tensor_parallel_size = 0

    def config(self):
        return transformers.Qwen3Config(**SHAPE, head_dim=16)


class TestMistral(ModelConformance):
    architecture = "MistralForCausalLM"
    tensor_parallel_size = 0

    def config(self):
        return transformers.MistralConfig(**SHAPE, sliding_window=16)  # the prompts (25-41 tokens) outrun it


class TestPhi3(ModelConformance):
    architecture = "Phi3ForCausalLM"
    tensor_parallel_size = 0  # tests/core/models/test_phi3.py runs it under -tp 2

    def config(self):
        return transformers.Phi3Config(**SHAPE, partial_rotary_factor=0.75, pad_token_id=0)
