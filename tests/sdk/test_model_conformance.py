"""The model-architecture conformance suite run on host's own architectures (registered through
the ``host.models`` group like any plugin's), each on a tiny random transformers config: Llama
(under -tp 2 too) and Mistral (a window shorter than the prompts). The other native
architectures have their own modules against transformers (test_llm_vs_hf.py, test_phi3.py,
test_gemma.py); the suite also runs on the third-party fixture (tests/models/)."""

from __future__ import annotations

import transformers

from host.sdk.testing import ModelConformance

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=320, max_position_embeddings=128, initializer_range=0.1)


class TestLlama(ModelConformance):
    architecture = "LlamaForCausalLM"

    def config(self):
        return transformers.LlamaConfig(**SHAPE)


class TestMistral(ModelConformance):
    architecture = "MistralForCausalLM"
    tensor_parallel_size = 0

    def config(self):
        return transformers.MistralConfig(**SHAPE, sliding_window=16)  # the prompts (25-41 tokens) outrun it
