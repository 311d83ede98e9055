"""Hugging Face Hub ids (``ORG/NAME``, ``ORG/NAME:FILE.gguf``) as local model paths, through
``huggingface_hub``: a model already in the local cache (``HF_HOME`` / ``HF_HUB_CACHE``) serves
offline; elsewhere only what serving needs is downloaded (config, tokenizer, safetensors, or the
one GGUF file named), never the ``.bin`` / ``.pth`` duplicates. ``HF_HUB_OFFLINE=1`` and
``HF_TOKEN`` are read by ``huggingface_hub`` itself. Every failure is a ``ValueError`` naming the
id and the fix."""

from __future__ import annotations

import os
import re

# what serving a safetensors checkpoint reads: config, generation defaults, tokenizer files, weights
SERVING_FILES = (
    "config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
    "tokenizer*", "special_tokens_map.json", "vocab*", "merges.txt", "*.model", "*.tiktoken", "chat_template*",
)
# what loading a tokenizer alone reads
TOKENIZER_FILES = tuple(p for p in SERVING_FILES if "safetensors" not in p)
_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[^/:]+\.gguf)?$")


def looks_like_hub_id(model: str) -> bool:
    """``ORG/NAME`` or ``ORG/NAME:FILE.gguf`` that is not a local path (``./x/y``, ``/abs``, ``~``)."""
    return bool(_ID.match(model)) and not os.path.exists(os.path.expanduser(model))


def resolve_hub_id(model: str, revision: str | None = None, cache_dir: str | None = None,
                   tokenizer_only: bool = False) -> str:
    """The local path of Hub id ``model``: the snapshot folder (with ``config.json``), or the GGUF
    file of ``ORG/NAME:FILE.gguf``. From the local cache (``cache_dir``, else ``HF_HOME``'s) when it
    is there, else downloaded into it. ``tokenizer_only`` fetches the tokenizer and config files
    only (``--tokenizer ORG/NAME``), never the weights."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, _, gguf_file = model.partition(":")
    patterns = [gguf_file] if gguf_file else list(TOKENIZER_FILES if tokenizer_only else SERVING_FILES)
    try:
        try:
            folder = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=patterns, local_files_only=True)
        except LocalEntryNotFoundError:
            if _offline():
                raise
            folder = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=patterns)
    except LocalEntryNotFoundError:
        raise ValueError(
            f"model={model!r} is not in the local Hugging Face cache ({cache_dir or _cache_dir()}) and downloads are off "
            "(HF_HUB_OFFLINE=1); download it once with network access (`huggingface-cli download "
            f"{repo_id}`), point HF_HOME at the cache that holds it, or pass a local model directory or .gguf file"
        ) from None
    except GatedRepoError:
        raise ValueError(
            f"model={model!r} is gated on the Hugging Face Hub: accept its license on the model page and "
            "set HF_TOKEN to a token of the account that did"
        ) from None
    except RevisionNotFoundError:
        raise ValueError(f"model={model!r} has no revision {revision!r} on the Hugging Face Hub; check the revision") from None
    except RepositoryNotFoundError:
        raise ValueError(
            f"model={model!r} is not a model on the Hugging Face Hub (misspelt, or private: set HF_TOKEN); "
            "check the id, or pass a local model directory or .gguf file"
        ) from None
    except OSError as e:  # no network, a proxy in the way, a full disk
        raise ValueError(f"model={model!r} could not be fetched from the Hugging Face Hub ({e}); "
                         "retry with network access, or pass a local model directory") from None
    if gguf_file:
        path = os.path.join(folder, gguf_file)
        if not os.path.isfile(path):
            raise ValueError(f"model={model!r}: the repository has no file {gguf_file!r}; name one of its .gguf files")
        return path
    if tokenizer_only:
        if not any(name.startswith("tokenizer") for name in os.listdir(folder)):
            raise ValueError(f"tokenizer={model!r} has no tokenizer files in its snapshot ({folder}); name a repository "
                             "with tokenizer.json or tokenizer_config.json")
        return folder
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ValueError(
            f"model={model!r} has no config.json in its snapshot ({folder}); a Hugging Face model repository "
            "with config.json and *.safetensors is needed, or ORG/NAME:FILE.gguf for a GGUF repository"
        )
    return folder


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE
