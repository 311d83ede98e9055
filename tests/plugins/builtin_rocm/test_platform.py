"""The ROCm platform, by simulation: no AMD GPU has run this. Only torch's own device checks
are monkeypatched (``torch.version.hip``, ``torch.cuda.is_available`` / ``device_count`` /
device properties); resolution, configuration, attention selection, the Triton kernels (under
``TRITON_INTERPRET=1``) and the CLI are the real code paths."""

from __future__ import annotations

import contextlib
import json
import math
import os
from types import SimpleNamespace
from typing import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the Triton kernels are first imported

import transformers
from typer.testing import CliRunner

from helpers import run_hosts
from host.core.engine_args import EngineArgs
from host.core.plugins.manager import PluginHost
from host.core.plugins.platform import current_platform, reset_current_platform, resolve_platform
from host.core.plugins.settings import PluginSettings
from host.core.worker.attention_selector import select_attention_backend
from host.plugins.builtin_cuda.platform import CudaPlatform
from host.plugins.builtin_rocm.attention import RocmTritonAttentionBackend
from host.plugins.builtin_rocm.platform import RocmPlatform
from host.plugins.triton_ops.attention import TritonPagedAttentionImpl
from host.sdk.attention import AttentionRequirements, CommonAttentionMetadata

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # read before any test simulates ROCm
VISIBILITY_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in (*VISIBILITY_VARS, "HOST_PLATFORM", "HOST_PLUGINS", "HOST_BLOCK_PLUGINS"):
        monkeypatch.delenv(var, raising=False)


@contextlib.contextmanager
def simulated_rocm(arch: str = "gfx942:sramecc+:xnack-", devices: int = 1, hip: str | None = "6.2.41133") -> Iterator[None]:
    """torch answering like a HIP build on a machine with ``devices`` AMD GPUs of ``arch``."""
    props = SimpleNamespace(name="AMD Instinct MI300X", gcnArchName=arch, total_memory=192 * 2**30, major=9, minor=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.version, "hip", hip)
        mp.setattr(torch.cuda, "is_available", lambda: devices > 0)
        mp.setattr(torch.cuda, "device_count", lambda: devices)
        mp.setattr(torch.cuda, "get_device_properties", lambda device=0: props)
        mp.setattr(torch.cuda, "get_device_name", lambda device=0: props.name)
        reset_current_platform()
        try:
            yield
        finally:
            reset_current_platform()


@pytest.fixture(scope="module")
def tiny_dir(tiny_checkpoint) -> str:
    """A model directory with only a config.json: enough for engine configuration."""
    return str(tiny_checkpoint("llama", weights=False, num_hidden_layers=1, max_position_embeddings=256))


def engine_config(model: str, **kwargs):
    """The real start-up path: platform resolution, -O resolution, check_and_update_config."""
    return EngineArgs(model=model, **kwargs).create_engine_config()


# -- detection and the conflict with builtin_cuda ---------------------------------------------


@pytest.mark.parametrize(
    "hip, devices, env, detected, why",
    [
        (None, 1, {}, False, "torch is not a ROCm build (torch.version.hip is None)"),
        ("6.2.41133", 0, {}, False, "ROCm build (HIP 6.2.41133) but no visible device"),
        ("6.2.41133", 1, {"HIP_VISIBLE_DEVICES": ""}, False, 'HIP_VISIBLE_DEVICES="" hides every device'),
        ("6.2.41133", 1, {"ROCR_VISIBLE_DEVICES": ""}, False, 'ROCR_VISIBLE_DEVICES="" hides every device'),
        ("6.2.41133", 2, {"HIP_VISIBLE_DEVICES": "0,1"}, True, "sees 2 device(s) (HIP_VISIBLE_DEVICES=0,1)"),
        # malformed variables on a ROCm machine: claimed, so start-up fails instead of falling back to CPU
        ("6.2.41133", 1, {"HIP_VISIBLE_DEVICES": "x"}, True, "device variables are invalid"),
    ],
)
def test_detection_and_its_reason(monkeypatch, hip, devices, env, detected, why):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with simulated_rocm(devices=devices, hip=hip):
        assert RocmPlatform.detect() is detected
        assert why in RocmPlatform.detection_reason()


def test_rocm_wins_and_cuda_steps_aside_on_a_hip_build(plugin_host):
    with simulated_rocm():
        assert torch.cuda.is_available()  # what makes the conflict: a HIP build says "cuda" too
        assert not CudaPlatform.detect()
        res = resolve_platform(PluginHost(PluginSettings()))
        assert res.platform.name == "rocm" and res.platform.is_rocm() and res.platform.is_cuda_alike()
        probes = {p.name: p for p in res.probes}
        assert probes["rocm"].detected and not probes["cuda"].detected and probes["cpu"].detected
        assert "cuda platform steps aside" in probes["rocm"].reason
        info = res.platform.describe()
    assert info["archs"] == ["gfx942"] and info["triton"] == "available" and "RCCL" in info["collectives"]
    assert res.platform.dist_backend == "nccl" and res.platform.device_type == "cuda"
    assert res.platform.attention_backend_priority == ["triton_rocm", "torch_paged"]


def test_host_platform_explains_the_choice(monkeypatch):
    """``host platform --json`` in-process (CliRunner), so torch can be simulated."""
    from host.core.entrypoints.cli.main import app

    runner = CliRunner()
    with simulated_rocm():
        chosen = runner.invoke(app, ["platform", "--json"])
        monkeypatch.setenv("HIP_VISIBLE_DEVICES", "")
        hidden = runner.invoke(app, ["platform", "--json"])
        monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        conflict = runner.invoke(app, ["platform", "--json"])
    data = json.loads(chosen.stdout)
    assert data["platform"]["name"] == "rocm" and data["platform"]["hip_version"] == "6.2.41133"
    rocm = next(p for p in data["probes"] if p["name"] == "rocm")
    assert rocm["detected"] and "ROCm build (HIP 6.2.41133) sees 1 device(s)" in rocm["reason"]
    data = json.loads(hidden.stdout)
    assert data["platform"]["name"] == "cpu"
    assert 'HIP_VISIBLE_DEVICES="" hides every device' in next(p for p in data["probes"] if p["name"] == "rocm")["reason"]
    data = json.loads(conflict.stdout)  # shown here, and refused at start-up (test below)
    assert "disagree" in next(p for p in data["probes"] if p["name"] == "rocm")["reason"]
    assert "disagree" in data["platform"]["visibility_error"]


def test_cli_lists_the_plugin_and_forcing_rocm_without_rocm_fails_clearly(tmp_path, tiny_dir, builtin_plugins_listing):
    """The installed ``host`` command, on this machine (torch here is not a ROCm build): the
    session's ``host plugins list --json``, and the two forced runs side by side."""
    listing = builtin_plugins_listing
    rows = {(r["group"], r["name"]): r for r in json.loads(listing.stdout)["plugins"]}
    assert rows[("host.platforms", "rocm")]["status"] == "loaded"
    assert rows[("host.attention_backends", "triton_rocm")]["status"] == "loaded"
    assert rows[("host.attention_backends", "triton_rocm")]["registered"] == ["attention_backends:triton_rocm"]
    rocm = {"HOST_PLATFORM": "rocm"}
    forced, gen = run_hosts((["platform", "--json"], [], rocm), (["generate", "hello", "--model", tiny_dir, "--max-tokens", "1"], [], rocm))
    assert forced.returncode == 0, forced.stderr
    assert "torch is not a ROCm build (torch.version.hip is None)" in json.loads(forced.stdout)["reason"]
    assert gen.returncode == 2
    assert "the ROCm platform cannot start here: torch is not a ROCm build" in gen.stderr
    assert "Unset HOST_PLATFORM" in gen.stderr


# -- device ids -------------------------------------------------------------------------------


def ids(logical: int) -> tuple[int, int]:
    p = RocmPlatform()
    return p.device_id_to_physical_device_id(logical), p.logical_device_id_to_visible_device_id(logical)


def test_device_ids_without_variables_are_the_identity():
    assert ids(0) == (0, 0) and ids(3) == (3, 3)
    assert RocmPlatform()._visible_ids_from_env() is None


@pytest.mark.parametrize("var", ["HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"])
def test_hip_level_list_either_variable(monkeypatch, var):
    monkeypatch.setenv(var, "2,3")
    assert ids(0) == (2, 0) and ids(1) == (3, 1)


def test_rocr_filters_first_and_hip_indexes_into_it(monkeypatch):
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "4,5,6,7")
    assert ids(2) == (6, 2)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1,3")
    assert ids(0) == (5, 0) and ids(1) == (7, 1)
    assert RocmPlatform()._visible_ids_from_env() == [5, 7]
    p = RocmPlatform()
    p.set_assigned_physical_device_ids([7])
    assert p.device_id_to_physical_device_id(0) == 7 and p.logical_device_id_to_visible_device_id(0) == 1
    q = RocmPlatform()
    q.set_assigned_physical_device_ids([6])  # filtered out by HIP's list
    with pytest.raises(RuntimeError, match="physical device 6 is not visible.*ROCR_VISIBLE_DEVICES=4,5,6,7 then HIP_VISIBLE_DEVICES=1,3"):
        q.logical_device_id_to_visible_device_id(0)
    with pytest.raises(RuntimeError, match="logical device 2 does not exist.*2 device"):
        RocmPlatform().device_id_to_physical_device_id(2)


def test_hip_and_cuda_variables_must_agree(monkeypatch):
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0, 1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert ids(1) == (1, 1)  # same list, spelled differently
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    with pytest.raises(ValueError, match="HIP_VISIBLE_DEVICES='0, 1' and CUDA_VISIBLE_DEVICES='1,0' disagree"):
        ids(0)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"HIP_VISIBLE_DEVICES": "0,a"}, "'a' is not a non-negative integer"),
        ({"HIP_VISIBLE_DEVICES": "-1"}, "'-1' is not a non-negative integer"),
        ({"ROCR_VISIBLE_DEVICES": "0,,1"}, "'' is not a non-negative integer"),
        ({"ROCR_VISIBLE_DEVICES": "GPU-4b5c6d7e"}, "GPU UUIDs are not supported"),
        ({"CUDA_VISIBLE_DEVICES": "1,1"}, "lists a device twice"),
        ({"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "2"}, "indexes past the 2 device"),
    ],
)
def test_malformed_variables_are_a_clear_value_error(monkeypatch, env, message):
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=message):
        ids(0)


def test_a_variable_hiding_every_device(monkeypatch):
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError, match='ROCR_VISIBLE_DEVICES="" hides every device'):
        ids(0)


# -- configuration at start-up ------------------------------------------------------------------


def test_defaults_on_an_mi300(plugin_host, tiny_dir):
    with simulated_rocm():
        config = engine_config(tiny_dir)
        platform = current_platform()
        backend = select_attention_backend(config, platform, config.model.hf_config, torch.float32)
    assert platform.name == "rocm" and config.device == "cuda"
    comp = config.compilation
    assert comp.custom_ops and comp.cuda_graphs and comp.cuda_graph_sizes[0] == 1  # HIP graphs
    assert config.cache.block_size == 16 and backend is RocmTritonAttentionBackend


def test_triton_paged_runs_as_triton_rocm_and_block_size_must_suit_it(plugin_host, tiny_dir):
    with simulated_rocm():
        assert engine_config(tiny_dir, attention_backend="triton_paged").attention_backend == "triton_rocm"
        assert engine_config(tiny_dir, block_size=64).cache.block_size == 64
        with pytest.raises(ValueError, match="block_size=8 does not suit ROCm's attention backend triton_rocm.*--block-size 16"):
            engine_config(tiny_dir, block_size=8)
        config = engine_config(tiny_dir, block_size=8, attention_backend="torch_paged")
        assert select_attention_backend(config, current_platform(), config.model.hf_config, torch.float32).name == "torch_paged"


def test_gpu_without_triton_support(plugin_host, tiny_dir):
    """gfx906 (MI50): Triton-built features are switched off when only the -O level implied
    them, and refused at start-up when asked for by name."""
    with simulated_rocm(arch="gfx906:sramecc+:xnack-"):
        config = engine_config(tiny_dir, optimization_level=3)
        assert not config.compilation.custom_ops and not config.compilation.torch_compile
        assert config.compilation.cuda_graphs  # HIP graphs need no Triton
        backend = select_attention_backend(config, current_platform(), config.model.hf_config, torch.float32)
        assert backend.name == "torch_paged"
        for kwargs, flag in (({"custom_ops": True}, "--custom-ops"), ({"torch_compile": True}, "--torch-compile"),
                             ({"attention_backend": "triton_paged"}, "--attention-backend triton_paged")):
            with pytest.raises(ValueError, match=f"{flag} need Triton, but Triton's AMD backend does not target gfx906"):
                engine_config(tiny_dir, **kwargs)


def test_what_rocm_cannot_run_is_refused_at_start_up(plugin_host, tiny_dir, tmp_path, monkeypatch):
    with simulated_rocm():
        config = engine_config(tiny_dir)
        config.cache.cache_dtype = "fp8_e4m3"
        with pytest.raises(ValueError, match="kv cache dtype 'fp8_e4m3' is not supported on ROCm.*e4m3fnuz on gfx942"):
            current_platform().check_and_update_config(config)
        with pytest.raises(ValueError, match="dtype 'float64' is not supported on ROCm"):
            current_platform().check_and_update_config(SimpleNamespace(dtype="float64", model=None))
        quantized = tmp_path / "fp8-model"
        hf = transformers.AutoConfig.from_pretrained(tiny_dir)
        hf.quantization_config = {"quant_method": "fp8", "activation_scheme": "dynamic"}
        hf.save_pretrained(quantized)
        with pytest.raises(ValueError, match="quantized with 'fp8'.*e4m3fnuz.*supported quantization on ROCm: none yet"):
            engine_config(str(quantized))
        monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        with pytest.raises(ValueError, match="disagree"):
            engine_config(tiny_dir)


def test_backend_flags():
    req = dict(device_type="cuda", dtype="bfloat16", head_size=128, block_size=16)
    assert RocmTritonAttentionBackend.supports_combination(AttentionRequirements(**req)) is None
    assert RocmTritonAttentionBackend.supports_combination(AttentionRequirements(**{**req, "head_size": 256})) is None
    assert "exceeds 128" in RocmTritonAttentionBackend.supports_combination(AttentionRequirements(**{**req, "dtype": "float32", "head_size": 256}))
    assert "exceeds 256" in RocmTritonAttentionBackend.supports_combination(AttentionRequirements(**{**req, "head_size": 512}))
    assert "kv cache dtype" in RocmTritonAttentionBackend.supports_combination(AttentionRequirements(**req, kv_cache_dtype="fp8"))
    assert "multiple of 16" in RocmTritonAttentionBackend.supports_combination(AttentionRequirements(**{**req, "block_size": 8}))
    # the same impl and builder as triton_paged: flags of its own, kernels shared
    assert RocmTritonAttentionBackend.get_impl_cls() is TritonPagedAttentionImpl


# -- the shared Triton kernels, selected through the ROCm platform --------------------------------


def run_selected_backend(backend, seq_lens, query_lens, heads, kv_heads, head_dim, block_size, dtype, window=None, seed=0):
    """One forward of the backend's impl (write the new K/V, attend) against the references."""
    from host.plugins.triton_ops import kernels as tk

    gen = torch.Generator().manual_seed(seed)
    reqs = len(seq_lens)
    blocks_per = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks_per) + 2
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros(reqs, max(blocks_per), dtype=torch.int32)
    start = 0
    for r, nb in enumerate(blocks_per):
        table[r, :nb] = torch.tensor(perm[start : start + nb], dtype=torch.int32)
        start += nb
    kv_cache = torch.randn(backend.get_kv_cache_shape(num_blocks, block_size, kv_heads, head_dim), generator=gen).to(dtype)
    slots = []
    for r, (n, q) in enumerate(zip(seq_lens, query_lens)):
        slots += [int(table[r, p // block_size]) * block_size + p % block_size for p in range(n - q, n)]
    table, kv_cache = table.to(DEV), kv_cache.to(DEV)
    tokens, padded = len(slots), len(slots) + 2  # two padding rows, as a captured decode graph has
    query = torch.randn(padded, heads, head_dim, generator=gen).to(dtype).to(DEV)
    key = torch.randn(padded, kv_heads, head_dim, generator=gen).to(dtype).to(DEV)
    value = torch.randn(padded, kv_heads, head_dim, generator=gen).to(dtype).to(DEV)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    seq = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=DEV)
    scale = head_dim**-0.5

    want_cache = kv_cache.cpu().clone()  # the references, on the host
    tk.reshape_and_cache_ref(key[:tokens].cpu(), value[:tokens].cpu(), want_cache[0], want_cache[1], slot_mapping.cpu())
    want = tk.paged_attention_ref(query[:tokens].cpu(), want_cache[0], want_cache[1], table.cpu(), qsl.cpu(), seq.cpu(), scale, window)

    impl = backend.get_impl_cls()(heads, head_dim, scale, kv_heads, sliding_window=window)
    builder = backend.get_builder_cls()(backend, torch.device(DEV))
    common = CommonAttentionMetadata(
        query_start_loc=qsl, seq_lens=seq, block_table=table, slot_mapping=slot_mapping, num_reqs=reqs,
        num_actual_tokens=tokens, max_query_len=max(query_lens), max_seq_len=max(seq_lens), block_size=block_size,
        query_start_loc_cpu=qsl.cpu(), seq_lens_cpu=seq.cpu(),
    )
    got = impl.forward(query, key, value, kv_cache, builder.build(common))
    assert torch.equal(kv_cache.cpu(), want_cache)  # the cache write is a copy: exact
    tol = dict(atol=2e-4, rtol=2e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got[:tokens].float().cpu(), want.float(), **tol)
    assert not got[tokens:].any()  # padding rows zeroed


@pytest.mark.triton
def test_shared_triton_kernels_through_the_rocm_platform(plugin_host, tiny_dir):
    pytest.importorskip("triton")
    with simulated_rocm():
        fp32 = engine_config(tiny_dir)
        bf16 = engine_config(tiny_dir, dtype="bfloat16", block_size=32)
        platform = current_platform()
        selected = [select_attention_backend(c, platform, c.model.hf_config, getattr(torch, c.model.dtype)) for c in (fp32, bf16)]
    assert platform.name == "rocm" and selected == [RocmTritonAttentionBackend] * 2
    backend = selected[0]
    hf = fp32.model.hf_config
    heads, kv_heads = hf.num_attention_heads, hf.num_key_value_heads
    head_dim = hf.hidden_size // heads
    # mixed batch: a fresh prompt, a decode, a chunk after a prefix-cache hit (GQA 2)
    run_selected_backend(backend, [5, 37, 21], [5, 1, 6], heads, kv_heads, head_dim, 16, torch.float32)
    # sliding window across page boundaries, with the bf16 engine's page size
    run_selected_backend(backend, [70, 30], [20, 1], heads, kv_heads, head_dim, 32, torch.bfloat16, window=9, seed=1)
    # decodes only: the GQA-grouped decode kernel, split over 3 spans of the 600 tokens
    run_selected_backend(backend, [600, 40], [1, 1], heads, kv_heads, head_dim, 16, torch.float32, seed=2)


@pytest.mark.triton
def test_rocm_prepare_model_runs_the_triton_custom_ops(plugin_host, tiny_dir):
    """``-O1`` and above on ROCm attach the CUDA plugin's Triton norms / rotary / SiLU-and-mul;
    the model gives its own outputs through them."""
    pytest.importorskip("triton")
    from host.core.models.llama import Qwen3ForCausalLM

    with simulated_rocm():
        config = engine_config(tiny_dir)
        platform = current_platform()
    assert config.compilation.custom_ops
    hf = transformers.Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, vocab_size=200, max_position_embeddings=64)
    torch.manual_seed(3)
    plain = Qwen3ForCausalLM(hf).eval()
    for p in plain.parameters():
        torch.nn.init.normal_(p, std=0.2)
    fast = Qwen3ForCausalLM(hf).eval()
    fast.load_state_dict(plain.state_dict())
    plain, fast = plain.to(DEV), fast.to(DEV)
    platform.prepare_model(fast, config)
    assert fast.model.norm.kernel is not None and fast.model.rotary_emb.kernel is not None
    ids_, pos = torch.tensor([5, 9, 13, 2, 7, 100], device=DEV), torch.arange(6, device=DEV)
    with torch.inference_mode():
        torch.testing.assert_close(fast.compute_logits(fast(ids_, pos)), plain.compute_logits(plain(ids_, pos)), atol=1e-4, rtol=1e-4)
