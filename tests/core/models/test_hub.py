"""Hub ids (``ORG/NAME``) resolved through ``huggingface_hub`` from a cache laid out exactly as it
lays one out (refs/main -> snapshots/<commit>/, files as symlinks into blobs/), with downloads off
(the tests never reach the Hub: tests/conftest.py sets HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from helpers import hf_greedy, hf_model
from host import LLM, SamplingParams
from host.core.models.default_model import resolve_model_path
from host.core.models.hub import looks_like_hub_id


def lay_out_cache(cache: Path, repo_id: str, files_from: Path, commit: str = "0123456789abcdef0123456789abcdef01234567",
                  ref: str = "main") -> Path:
    """``huggingface_hub``'s cache layout for one model repository at one ref; returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    for f in files_from.iterdir():
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hub_ids_are_told_from_local_paths(tmp_path):
    assert looks_like_hub_id("Qwen/Qwen3-0.6B") and looks_like_hub_id("unsloth/gemma-3-270m-it-GGUF:gemma-3-270m-it-Q4_K_M.gguf")
    assert not looks_like_hub_id("./models/llama") and not looks_like_hub_id("/abs/model") and not looks_like_hub_id("a/b/c")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert not looks_like_hub_id("org/name")  # an existing local folder wins
    finally:
        os.chdir(cwd)


def test_a_cached_hub_id_serves_offline_and_equals_transformers(hub_cache, tiny_checkpoint):
    ckpt = tiny_checkpoint("llama")
    snapshot = lay_out_cache(hub_cache, "acme/tiny-llama", ckpt)
    assert resolve_model_path("acme/tiny-llama") == str(snapshot)
    llm = LLM("acme/tiny-llama", skip_tokenizer_init=True, max_model_len=64, kv_cache_memory=16 << 20)
    prompt = [5, 17, 42, 8, 99, 3]
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert list(out[0].outputs[0].token_ids) == hf_greedy(hf_model(ckpt), prompt, 8)


def test_revision_and_download_dir_choose_the_snapshot(hub_cache, tiny_checkpoint, tmp_path):
    other = tmp_path / "elsewhere"
    main = lay_out_cache(other, "acme/tiny-llama", tiny_checkpoint("llama"))
    v2 = lay_out_cache(other, "acme/tiny-llama", tiny_checkpoint("llama", seed=1), commit="f" * 40, ref="v2")
    assert resolve_model_path("acme/tiny-llama", download_dir=str(other)) == str(main)
    assert resolve_model_path("acme/tiny-llama", revision="v2", download_dir=str(other)) == str(v2)
    with pytest.raises(ValueError, match=r"not in the local Hugging Face cache"):
        resolve_model_path("acme/tiny-llama")  # not in the default cache


def test_an_id_missing_offline_is_a_clear_error(hub_cache):
    with pytest.raises(ValueError, match=r"'acme/absent' is not in the local Hugging Face cache .*HF_HUB_OFFLINE=1"):
        resolve_model_path("acme/absent")
    with pytest.raises(ValueError, match=r"\.gguf"):
        resolve_model_path("meta-llama/Llama-3.2-1B")


def test_a_snapshot_without_config_is_refused(hub_cache, tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    (files / "README.md").write_text("no weights here")
    lay_out_cache(hub_cache, "acme/readme-only", files)
    with pytest.raises(ValueError, match="has no config.json"):
        resolve_model_path("acme/readme-only")


def test_gguf_file_picks_one_gguf_from_a_hub_repo_or_a_folder(hub_cache, tmp_path):
    files = tmp_path / "gguf-repo"
    files.mkdir()
    for name in ("tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf"):
        (files / name).write_bytes(b"GGUF" + name.encode())
    snapshot = lay_out_cache(hub_cache, "acme/tiny-GGUF", files)
    want = str(snapshot / "tiny-Q8_0.gguf")
    assert resolve_model_path("acme/tiny-GGUF:tiny-Q8_0.gguf") == want
    assert resolve_model_path("acme/tiny-GGUF", gguf_file="tiny-Q8_0.gguf") == want
    assert resolve_model_path(str(files), gguf_file="tiny-Q4_K_M.gguf") == str(files / "tiny-Q4_K_M.gguf")
    with pytest.raises(ValueError, match="is not in"):
        resolve_model_path(str(files), gguf_file="tiny-F16.gguf")
    with pytest.raises(ValueError, match="has no file 'tiny-F16.gguf'"):
        resolve_model_path("acme/tiny-GGUF", gguf_file="tiny-F16.gguf")
    with pytest.raises(ValueError, match="must be a file name ending in .gguf"):
        resolve_model_path("acme/tiny-GGUF", gguf_file="weights.bin")
    with pytest.raises(ValueError, match="--model ORG/NAME --gguf-file FILE.gguf"):
        resolve_model_path("acme/tiny-GGUF:tiny-Q8_0.gguf", gguf_file="tiny-Q8_0.gguf")


def test_only_what_serving_needs_is_downloaded():
    """The allow patterns, applied by huggingface_hub's own filter (what snapshot_download keeps)."""
    from huggingface_hub.utils import filter_repo_objects

    from host.core.models.hub import SERVING_FILES

    repo = ["config.json", "generation_config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
            "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "pytorch_model.bin",
            "consolidated.pth", "original/params.json", "flax_model.msgpack", "README.md", "onnx/model.onnx"]
    kept = set(filter_repo_objects(repo, allow_patterns=list(SERVING_FILES)))
    assert kept == {"config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                    "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """A local HTTP server answering every Hub API call with the error a test sets (status and
    X-Error-Code, as huggingface.co answers), downloads on, an empty cache."""
    import http.server
    import threading

    from huggingface_hub import constants

    answer = {"status": 404, "code": "RepoNotFound"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(answer["status"])
            self.send_header("X-Error-Code", answer["code"])
            self.send_header("X-Error-Message", answer["code"])
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": "' + answer["code"].encode() + b'"}')

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield answer
    finally:
        server.shutdown()
        server.server_close()


def test_misspelt_gated_and_missing_revisions_are_clear_errors_from_the_hub(fake_hub):
    fake_hub.update(status=401, code="RepoNotFound")
    with pytest.raises(ValueError, match=r"'acme/no-such-model' is not a model on the Hugging Face Hub \(misspelt"):
        resolve_model_path("acme/no-such-model")
    fake_hub.update(status=403, code="GatedRepo")
    with pytest.raises(ValueError, match=r"'acme/gated' is gated .* set HF_TOKEN"):
        resolve_model_path("acme/gated")
    fake_hub.update(status=404, code="RevisionNotFound")
    with pytest.raises(ValueError, match=r"has no revision 'v9'"):
        resolve_model_path("acme/tiny", revision="v9")


def test_a_tokenizer_hub_id_fetches_the_tokenizer_only(hub_cache, tiny_checkpoint, tmp_path):
    import shutil as _shutil

    from host.core.models.default_model import resolve_model_path as resolve

    files = tmp_path / "tok"
    files.mkdir()
    source = Path(resolve("default"))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).is_file():
            _shutil.copyfile(source / name, files / name)
    snapshot = lay_out_cache(hub_cache, "acme/tok", files, ref="v1")
    llm = LLM(str(tiny_checkpoint("llama", vocab_size=49152)), tokenizer="acme/tok", tokenizer_revision="v1",
              max_model_len=64, kv_cache_memory=16 << 20)
    assert llm.config.model.tokenizer == str(snapshot)
    assert llm.get_tokenizer().encode("Hello world", add_special_tokens=False) == [19556, 905]
    llm.shutdown()
    with pytest.raises(ValueError, match="not in the local Hugging Face cache"):
        LLM(str(tiny_checkpoint("llama")), tokenizer="acme/absent-tok", max_model_len=64)
