"""lm-evaluation-harness against ``host serve``: its ``local-completions`` model scores a small
multiple-choice task built from a local JSONL file (log-likelihoods through ``/v1/completions``
with ``echo`` and ``logprobs``), and every per-request log-likelihood equals the same computation
in transformers on the same weights within 1e-3."""

from __future__ import annotations

import json

import lm_eval  # the `test` extra installs it (lm-eval[api])
import pytest

from helpers import hf_model


@pytest.fixture(scope="module")
def server(hello_server):
    """The session's server with the default flags (tests/conftest.py; the fixture endpoint plugin
    sits beside the built-in API): this module starts none of its own."""
    return hello_server

DOCS = [
    {"question": "The capital of France is", "choices": [" Paris", " Berlin", " a banana"], "answer": 0},
    {"question": "Two plus two equals", "choices": [" four", " seven"], "answer": 0},
    {"question": "The sky on a clear day is", "choices": [" green", " blue", " loud"], "answer": 1},
    {"question": "Cats like to drink", "choices": [" milk", " gasoline"], "answer": 0},
]

TASK = """task: host_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def _encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of a request into context and continuation tokens (trailing spaces of the
    context move to the continuation; the continuation's tokens are those of the whole text after
    the context's), so the reference scores exactly the tokens the harness sent."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    ctx = tokenizer.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


def test_local_completions_loglikelihoods_match_transformers(server, model, tmp_path, monkeypatch):
    import torch
    import transformers

    from host.core.models.default_model import default_model_path

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "host_tiny_mc.yaml").write_text(TASK.format(data=data))
    path = default_model_path()

    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "model": model, "base_url": f"{server.url}/v1/completions", "tokenizer_backend": "huggingface",
            "tokenizer": path, "num_concurrent": 1, "max_retries": 1, "tokenized_requests": True, "batch_size": 16,
        },
        tasks=["host_tiny_mc"],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        log_samples=True,
        random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0,
    )
    samples = results["samples"]["host_tiny_mc"]
    assert len(samples) == len(DOCS)

    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    hf = hf_model(path)
    scored = 0
    for sample in samples:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            ctx, cont = _encode_pair(tokenizer, context, continuation)
            ids = ctx + cont
            with torch.inference_mode():
                logits = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)
            expected = sum(logits[len(ctx) + i - 1, t].item() for i, t in enumerate(cont))
            greedy = all(logits[len(ctx) + i - 1].argmax().item() == t for i, t in enumerate(cont))
            got, got_greedy = resp[0]
            assert got == pytest.approx(expected, abs=1e-3), (context, continuation)
            assert got_greedy == greedy
            scored += 1
    assert scored == sum(len(d["choices"]) for d in DOCS)
    assert 0.0 <= results["results"]["host_tiny_mc"]["acc,none"] <= 1.0
