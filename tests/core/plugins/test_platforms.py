"""Platform resolution: built-in detection, third-party precedence, ambiguity, forcing."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from helpers import on_sys_path, run_hosts
from host.core.plugins.manager import PluginHost
from host.core.plugins.platform import PlatformResolutionError, resolve_platform
from host.core.plugins.settings import PluginSettings
from host.plugins.builtin_cpu.platform import CpuPlatform
from host.plugins.builtin_cuda.platform import CudaPlatform
from host.plugins.builtin_rocm.platform import RocmPlatform
from host.sdk import Platform, hookimpl


def resolve(sites=(), **settings):
    with on_sys_path(*sites):
        host = PluginHost(PluginSettings(**settings))
        return resolve_platform(host)


def test_cpu_is_the_default_without_accelerators(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = resolve()
    assert res.platform.name == "cpu" and res.platform.is_cpu()
    assert "built-in platform cpu" in res.reason
    assert {p.name: p.detected for p in res.probes} == {"cpu": True, "cuda": False, "rocm": False}


def test_cuda_detected_when_torch_sees_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    assert CudaPlatform.detect() and not RocmPlatform.detect()
    res = resolve()
    assert res.platform.name == "cuda" and res.platform.is_cuda() and res.platform.is_cuda_alike()
    assert res.platform.dist_backend == "nccl" and res.platform.device_control_env_var == "CUDA_VISIBLE_DEVICES"


def test_rocm_detected_on_a_hip_build(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    assert RocmPlatform.detect() and not CudaPlatform.detect()
    res = resolve()
    assert res.platform.name == "rocm" and res.platform.is_rocm() and res.platform.is_cuda_alike()


def test_hip_build_without_device_falls_back_to_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    assert resolve().platform.name == "cpu"


def test_one_third_party_platform_wins(fixture_sites, monkeypatch):
    monkeypatch.setenv("HOST_FIXTURE_ACCEL_B", "0")  # B's hardware is absent
    res = resolve([fixture_sites["accel_a"], fixture_sites["accel_b"]])
    assert res.platform.name == "accel_a" and res.platform.is_out_of_tree()
    assert "third-party platform accel_a" in res.reason


def test_two_third_party_platforms_is_an_error_naming_both(fixture_sites):
    with pytest.raises(PlatformResolutionError) as err:
        resolve([fixture_sites["accel_a"], fixture_sites["accel_b"]])
    msg = str(err.value)
    assert "accel_a" in msg and "accel_b" in msg
    assert "--platform" in msg and "HOST_PLATFORM" in msg


def test_forced_platform_resolves_ambiguity(fixture_sites):
    res = resolve([fixture_sites["accel_a"], fixture_sites["accel_b"]], platform="accel_b")
    assert res.platform.name == "accel_b" and "forced" in res.reason
    # forcing a built-in over detected third-party ones works too
    assert resolve([fixture_sites["accel_a"]], platform="cpu").platform.name == "cpu"


def test_forcing_an_unknown_platform_lists_the_registered_ones():
    with pytest.raises(PlatformResolutionError, match="matches no registered platform.*cpu"):
        resolve(platform="tpu")


def test_allowlist_applies_to_platform_plugins(fixture_sites):
    res = resolve([fixture_sites["accel_a"], fixture_sites["accel_b"]], allow=("accel_b",))
    assert res.platform.name == "accel_b"


def test_detect_exception_is_reported_not_swallowed(plugin_host, register_plugin):
    class Flaky(Platform):
        name = "flaky"

        @classmethod
        def detect(cls):
            raise OSError("driver version mismatch")

    class Plugin:
        @hookimpl
        def host_register_platforms(self, register):
            register(Flaky)

    register_plugin(Plugin(), name="flaky", group="host.platforms")
    res = resolve_platform(plugin_host)
    probe = next(p for p in res.probes if p.name == "flaky")
    assert not probe.detected and "OSError: driver version mismatch" in probe.error
    assert res.platform.name == "cpu"


def test_host_platform_command_reports_choice_and_why(fixture_sites):
    one, two = [fixture_sites["accel_a"]], [fixture_sites["accel_a"], fixture_sites["accel_b"]]
    proc, both, forced = run_hosts((["platform", "--json"], one), (["platform"], two),
                                   (["platform", "--json"], two, {"HOST_PLATFORM": "accel_b"}))  # side by side
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["platform"]["name"] == "accel_a"
    assert "third-party" in data["reason"]
    assert {p["name"] for p in data["probes"]} >= {"accel_a", "cpu", "cuda", "rocm"}
    assert both.returncode == 1 and "accel_a" in both.stderr and "accel_b" in both.stderr
    assert json.loads(forced.stdout)["platform"]["name"] == "accel_b"


def test_device_id_namespaces(monkeypatch):
    p = CudaPlatform()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert p.device_id_to_physical_device_id(0) == 4
    assert p.logical_device_id_to_visible_device_id(1) == 1
    p.set_assigned_physical_device_ids([5])
    assert p.device_id_to_physical_device_id(0) == 5
    assert p.logical_device_id_to_visible_device_id(0) == 1
    p.set_assigned_physical_device_ids([5])  # same value: no-op
    with pytest.raises(RuntimeError, match="refusing"):
        p.set_assigned_physical_device_ids([4])
    q = CudaPlatform()
    q.set_assigned_physical_device_ids([7])
    with pytest.raises(RuntimeError, match="not visible"):
        q.logical_device_id_to_visible_device_id(0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError, match="empty string"):
        CudaPlatform().device_id_to_physical_device_id(0)


def test_attribute_forwarding_to_torch_excludes_dunders():
    p = CpuPlatform()
    assert p.is_available is torch.cpu.is_available  # forwarded to torch.cpu
    with pytest.raises(AttributeError):
        p.__no_such_dunder__
    clone = pickle.loads(pickle.dumps(p))
    assert isinstance(clone, CpuPlatform)
