"""``host generate --enable-lora --lora-modules name=path``: every prompt runs with each adapter,
and the printed completion is the adapter's (the offline API's output for the same adapter,
whose tokens must equal transformers + PEFT's)."""

from __future__ import annotations

import shutil

import pytest
import torch
from typer.testing import CliRunner

from helpers import hf_model


@pytest.fixture(scope="module")
def model_dir(tiny_checkpoint, tmp_path_factory):
    """A tiny random Llama with the default model's tokenizer beside it (so prompts are text)."""
    from host.core.models.default_model import default_model_path

    src = tiny_checkpoint("llama", seed=3, vocab_size=49152, initializer_range=0.1, tie_word_embeddings=True)
    dst = tmp_path_factory.mktemp("tiny-tok") / "model"
    shutil.copytree(src, dst)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{default_model_path()}/{name}", dst / name)
    return str(dst)


@pytest.fixture(scope="module")
def adapter(model_dir, tmp_path_factory):
    import peft

    torch.manual_seed(5)
    model = peft.get_peft_model(hf_model(model_dir), peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "down_proj"],
                                                                     init_lora_weights=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.3)
    path = tmp_path_factory.mktemp("cli-adapter") / "sql"
    model.save_pretrained(path)
    return str(path)


def greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_generate_with_lora_modules_prints_the_adapters_completion(model_dir, adapter):
    import peft
    import transformers

    from host.core.entrypoints.cli.main import app

    prompt = "The capital of France is"
    result = CliRunner().invoke(app, ["generate", prompt, "--model", model_dir, "--max-tokens", "6", "--enable-lora",
                                      "--max-lora-rank", "8", "--lora-modules", f"sql={adapter}",
                                      "--num-gpu-blocks-override", "16"])
    assert result.exit_code == 0, result.output
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer(prompt)["input_ids"]
    want = greedy(peft.PeftModel.from_pretrained(hf_model(model_dir), adapter).eval(), ids, 6)
    assert want != greedy(hf_model(model_dir), ids, 6)  # the adapter changes the completion
    # stdout only: the completion (the log lines go to stderr)
    assert result.stdout.strip() == (prompt + tokenizer.decode(want)).strip()


def test_lora_modules_without_enable_lora_names_the_flag(model_dir, adapter):
    from host.core.entrypoints.cli.main import app

    result = CliRunner().invoke(app, ["generate", "hi", "--model", model_dir, "--lora-modules", f"sql={adapter}"])
    assert result.exit_code == 2 and "--lora-modules needs --enable-lora" in result.output
    bad = CliRunner().invoke(app, ["generate", "hi", "--model", model_dir, "--enable-lora", "--lora-modules", "sql"])
    assert bad.exit_code == 2 and "is not name=path" in bad.output
