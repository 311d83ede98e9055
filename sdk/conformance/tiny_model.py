"""A tiny random Llama checkpoint and its greedy reference, for the suites that run an engine."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

_MADE: dict[str, str] = {}

SHAPE = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=300, max_position_embeddings=128, initializer_range=0.1,
)
ENGINE_ARGS = dict(skip_tokenizer_init=True, max_model_len=96, max_num_batched_tokens=32, max_num_seqs=4, block_size=8)


def tiny_llama() -> str:
    """The directory of a tiny random ``LlamaForCausalLM`` (made once per process with transformers'
    own ``save_pretrained``, seed 0); no tokenizer, so engines use ``skip_tokenizer_init``."""
    if "llama" not in _MADE:
        import torch
        import transformers

        state = torch.random.get_rng_state()
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE))
        torch.random.set_rng_state(state)
        path = Path(tempfile.mkdtemp(prefix="host-conformance-")) / "tiny-llama"
        model.save_pretrained(path)
        _MADE["llama"] = str(path)
    return _MADE["llama"]


def prompts(seed: int = 7, lengths: tuple[int, ...] = (5, 16, 29, 50)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, SHAPE["vocab_size"]) for _ in range(n)] for n in lengths]


def greedy_tokens(llm: Any, prompt_ids: list[list[int]], max_tokens: int = 5) -> list[list[int]]:
    from host.sdk.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params)]


def hf_greedy_tokens(path: str, prompt_ids: list[list[int]], max_tokens: int = 5) -> list[list[int]]:
    """transformers' greedy continuation of each prompt: the reference every engine must equal."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype="auto").eval()
    out = []
    with torch.inference_mode():
        for p in prompt_ids:
            ids = model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False, min_new_tokens=max_tokens)
            out.append(ids[0, len(p):].tolist())
    return out


def no_leaked_blocks(llm: Any) -> None:
    """Every request finished and every KV block back in the pool (block 0 is the null block)."""
    engine = llm.engine
    manager = engine.kv_cache_manager
    assert not engine.scheduler.requests, f"requests still held: {list(engine.scheduler.requests)}"
    assert manager.block_pool.get_num_free_blocks() == manager.num_blocks - 1, "KV blocks were not freed"
