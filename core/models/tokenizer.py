"""Loading the tokenizer of a model directory or a GGUF file (offline, no hub access)."""

from __future__ import annotations

import os
from typing import Any


def get_tokenizer(path: str) -> Any:
    """A ``transformers`` tokenizer for a Hugging Face directory or a ``.gguf`` file."""
    from transformers import AutoTokenizer

    if path.lower().endswith(".gguf") and os.path.isfile(path):
        return AutoTokenizer.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path))
    if not os.path.isdir(path):
        raise ValueError(f"tokenizer path {path!r} is neither a model directory nor a .gguf file")
    return AutoTokenizer.from_pretrained(path)
