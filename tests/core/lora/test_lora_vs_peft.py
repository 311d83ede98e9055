"""Multi-LoRA end to end against transformers + PEFT on the same weights.

One engine (``max_loras=2`` so slots evict, prefix caching on, chunked prefill with a 24-token
budget, asynchronous scheduling as on a GPU) serves a mixed batch of base-model requests and three PEFT adapters of ranks 4, 8 and 16
with different target sets (one with ``lora_alpha != r``, one with rsLoRA). Every request's
greedy tokens must equal ``PeftModel.generate``'s, and the logprob of each token must be within
1e-4 of PEFT's (fp32). The prompts share their first block, so KV computed for one adapter
(or the base) reused for another would show. Then a changed adapter at the same path, under the
same name, must give the new weights' output; and the adapter crosses the engine wire (the
multiprocess clients' msgpack) unchanged.
"""

from __future__ import annotations

import random

import pytest
import torch

from helpers import hf_model
from host import LLM, LoRARequest, SamplingParams

N = 8  # tokens generated per request
TINY = dict(vocab_size=300, initializer_range=0.1, tie_word_embeddings=True)
# name -> (r, lora_alpha, target modules, use_rslora)
ADAPTERS = {
    "attn4": (4, 8, ["q_proj", "v_proj"], False),
    "all8": (8, 8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], False),
    "mlp16": (16, 32, ["o_proj", "gate_proj", "down_proj"], True),
}


def save_adapter(base_path, out_dir, r: int, alpha: int, targets: list[str], rslora: bool, seed: int) -> str:
    """A PEFT adapter with random non-zero A and B, saved with ``save_pretrained``."""
    import peft

    torch.manual_seed(seed)
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
                             init_lora_weights=False, lora_dropout=0.0)
    model = peft.get_peft_model(hf_model(base_path), config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out_dir)
    return str(out_dir)


def reference_model(base_path, adapter: str | None):
    """transformers' model of the base checkpoint, with the PEFT adapter on it unless ``None``."""
    import peft

    model = hf_model(base_path)
    return model if adapter is None else peft.PeftModel.from_pretrained(model, adapter).eval()


def peft_reference(model, prompt: list[int], n: int = N) -> tuple[list[int], list[float]]:
    """Greedy tokens from transformers (+ PEFT) and the logprob of each under the model."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        tokens = out[0, len(prompt):].tolist()
        logits = model(out).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
    return tokens, [float(logits[i, t]) for i, t in enumerate(tokens)]


@pytest.fixture(scope="module")
def setup(tiny_checkpoint, tmp_path_factory):
    base = str(tiny_checkpoint("llama", seed=7, **TINY))
    root = tmp_path_factory.mktemp("adapters")
    paths = {name: save_adapter(base, root / name, *spec, seed=i) for i, (name, spec) in enumerate(ADAPTERS.items())}
    rng = random.Random(0)
    prefix = [rng.randrange(3, 300) for _ in range(16)]  # one shared block
    names = [None, "attn4", "all8", "mlp16", "attn4", None, "mlp16", "all8"]
    prompts = [prefix + [rng.randrange(3, 300) for _ in range(rng.randrange(4, 30))] for _ in names]
    models = {n: reference_model(base, None if n is None else paths[n]) for n in set(names)}
    refs = [peft_reference(models[n], p) for n, p in zip(names, prompts)]
    return dict(base=base, root=root, paths=paths, names=names, prompts=prompts, refs=refs)


@pytest.fixture(scope="module")
def llm(setup):
    engine = LLM(setup["base"], skip_tokenizer_init=True, enable_lora=True, max_loras=2, max_lora_rank=16,
                 max_cpu_loras=2, enable_prefix_caching=True, enable_chunked_prefill=True,
                 max_num_batched_tokens=24, max_num_seqs=8, num_gpu_blocks_override=64,
                 async_scheduling=True)  # the GPU default: each step planned before the last one's tokens return
    yield engine


def generate(llm: LLM, prompts, loras):
    params = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=loras)
    return [(o.outputs[0].token_ids, [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in outs]


def assert_close(got, ref, what):
    tokens, logprobs = got
    ref_tokens, ref_logprobs = ref
    assert tokens == ref_tokens, what
    assert max(abs(a - b) for a, b in zip(logprobs, ref_logprobs)) < 1e-4, (what, logprobs, ref_logprobs)


def test_mixed_batch_of_three_adapters_and_the_base_equals_peft(llm, setup):
    reqs = {name: LoRARequest(name, i + 1, path) for i, (name, path) in enumerate(setup["paths"].items())}
    loras = [None if n is None else reqs[n] for n in setup["names"]]
    got = generate(llm, setup["prompts"], loras)
    for name, g, ref in zip(setup["names"], got, setup["refs"]):
        assert_close(g, ref, name)
    # the adapters really change the output (else this test could not fail)
    base_only = generate(llm, setup["prompts"], None)
    assert sum(b[0] != g[0] for b, g in zip(base_only, got)) >= 4
    for name, b, ref in zip(setup["names"], base_only, setup["refs"]):
        if name is None:
            assert_close(b, ref, "base")
    slots = llm.engine.executor.worker.model_runner.lora.slots
    # three adapters through two slots (one slot rewritten) and a CPU tier of two
    assert slots.loads >= 3 and slots.slot_writes >= 3 and len(slots.cpu) <= 2 and len(slots.slot_of) <= 2
    manager = llm.engine.kv_cache_manager
    assert not llm.engine.scheduler.requests and not manager.req_to_blocks


def test_a_changed_adapter_under_the_same_name_gives_the_new_output(llm, setup, tmp_path):
    path = tmp_path / "changing"
    spec = ADAPTERS["all8"]
    save_adapter(setup["base"], path, *spec, seed=100)
    prompt = setup["prompts"][2]
    first = generate(llm, [prompt], LoRARequest("changing", 9, str(path)))[0]
    assert_close(first, peft_reference(reference_model(setup["base"], str(path)), prompt), "before the change")
    save_adapter(setup["base"], path, *spec, seed=101)  # same name, id and path; new weights
    second = generate(llm, [prompt], LoRARequest("changing", 9, str(path)))[0]
    new_ref = peft_reference(reference_model(setup["base"], str(path)), prompt)
    assert new_ref[0] != first[0]
    assert_close(second, new_ref, "after the change")


def test_lora_request_without_enable_lora_names_the_flag(llm, setup):
    """The same engine configuration with LoRA off (the input processor is what refuses)."""
    import dataclasses

    from host.core.frontend.input_processor import InputProcessor

    processor = InputProcessor(dataclasses.replace(llm.config, lora=None), None)
    with pytest.raises(ValueError, match="start it with --enable-lora"):
        processor.process("x", [5, 6, 7], SamplingParams(max_tokens=2),
                          lora_request=LoRARequest("attn4", 1, setup["paths"]["attn4"]))


def test_a_bad_adapter_is_refused_before_it_reaches_the_engine(llm, setup):
    with pytest.raises(ValueError, match="does not exist"):
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2),
                     lora_request=LoRARequest("nope", 5, str(setup["root"] / "missing")))
    with pytest.raises(ValueError, match="2 lora_requests for 1 prompts"):
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2), lora_request=[None, None])
    assert not llm.engine.scheduler.requests


def test_the_adapter_crosses_the_engine_wire_unchanged(llm, setup):
    """The multiprocess clients send EngineCoreRequest as msgpack (contracts/messages.py): the
    adapter, digest included, arrives as it left."""
    from host.contracts.messages import EngineCoreRequest, encoder, to_engine_decoder

    request = llm.input_processor.process("w", [5, 6, 7], SamplingParams(max_tokens=2),
                                          lora_request=LoRARequest("mlp16", 3, setup["paths"]["mlp16"]))
    assert len(request.lora_request.digest) == 64
    decoded = to_engine_decoder.decode(encoder.encode(request))
    assert isinstance(decoded, EngineCoreRequest) and decoded.lora_request == request.lora_request
    base = to_engine_decoder.decode(encoder.encode(llm.input_processor.process("b", [5], SamplingParams(max_tokens=1))))
    assert base.lora_request is None
