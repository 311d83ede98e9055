"""``host_offer_kernels`` (``host.general``) fills the kernel table: nothing registers at import
time, the first lookup in a process registers the core's references and calls the hook of every
loaded plugin (built-in, in-memory or pip-installed), each entry says who offered it and why, and
``host plugins list`` / ``host platform`` show which kernel serves each op here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import run_host, run_hosts, subprocess_env

IMPORT_EVERYTHING = """
import json
from host.interfaces import kernels
import host.sdk.kernels
import host.core.lora.punica, host.core.lora.layers
import host.plugins.quantization, host.plugins.quantization.ops
import host.plugins.builtin_cpu.platform_plugin, host.plugins.builtin_cpu.quant_kernels
import host.plugins.builtin_cuda.platform_plugin, host.plugins.builtin_rocm.platform_plugin
import host.plugins.triton_ops.lora, host.plugins.triton_ops.quant_linear
at_import = [e.name for e in kernels.registered()]
lora = kernels.kernel_entry("lora_shrink_expand", "cpu")  # the first lookup fills the table
int8 = kernels.kernel_entry("int8_linear", "meta")
print(json.dumps({"at_import": at_import, "lora": [lora.name, lora.source, lora.why()],
                  "int8": [int8.name, int8.source, int8.why()], "after": len(kernels.registered())}))
"""


def test_nothing_is_registered_at_import_time_and_the_first_lookup_fills_the_table():
    proc = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], capture_output=True, text=True,
                          env=subprocess_env([], HOST_CPU_KERNELS="0"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["at_import"] == []
    # the core's own reference, with no plugin involved, and the quantization plugin's
    assert result["lora"] == ["torch", "host.core", "reference for any device: torch, in the core: grouped shrink/expand GEMMs"]
    assert result["int8"][:2] == ["torch_reference", "builtin_quantization"]
    assert result["int8"][2].startswith("reference for any device: torch")
    assert result["after"] >= 5


def test_an_in_memory_plugin_offers_a_kernel_on_the_next_lookup(plugin_host, register_plugin):
    from host.sdk import hookimpl
    from host.sdk.kernels import kernel_candidates, kernel_entry, kernel_report, unregister_kernel

    seen = []

    def fast(x):
        return x

    def reference(x):
        return x

    class Offers:
        @hookimpl
        def host_offer_kernels(self, register, platform, config):
            seen.append((platform.device_type, config))
            register("test_square", "*", reference, name="test_torch", reason="the test's reference")
            register("test_square", platform.device_type, fast, name="test_fast", priority=7, reason="a test build")

    register_plugin(Offers(), name="offers")
    try:
        entry = kernel_entry("test_square", "cpu")
        assert (entry.name, entry.source, entry.impl) == ("test_fast", "offers", fast)
        assert entry.why() == "priority 7 on cpu: a test build"
        assert kernel_entry("test_square", "meta").impl is reference
        assert [e.name for e in kernel_candidates("test_square", "cpu")] == ["test_fast", "test_torch"]
        assert seen == [("cpu", None)]  # once: the next lookups find the table filled
        kernel_entry("test_square", "cpu")
        assert len(seen) == 1
        # the worker offers again (with its engine config); the same names are replaced, not added
        plugin_host.offer_kernels(plugin_host_platform(), None)
        assert seen == [("cpu", None), ("cpu", None)]
        assert [e.name for e in kernel_candidates("test_square", "cpu")] == ["test_fast", "test_torch"]
        row = next(r for r in kernel_report("cpu") if r["op"] == "test_square")
        assert row == {
            "op": "test_square", "device_type": "cpu", "serves": "test_fast", "source": "offers",
            "why": "priority 7 on cpu: a test build",
            "runners_up": [{"name": "test_torch", "device_type": "*", "source": "offers",
                            "why": "reference for any device: the test's reference"}],
        }
    finally:
        unregister_kernel("test_square", "cpu", "test_fast")
        unregister_kernel("test_square", "*", "test_torch")


def plugin_host_platform():
    from host.core.plugins.platform import current_platform

    return current_platform()


def test_a_raising_offer_fails_its_plugin_only(plugin_host, register_plugin):
    from host.core.plugins.errors import PluginError
    from host.sdk import hookimpl
    from host.sdk.kernels import kernel_entry

    class Broken:
        @hookimpl
        def host_offer_kernels(self, register):
            raise RuntimeError("no kernels today")

    record = register_plugin(Broken(), name="broken_kernels")
    with pytest.raises(PluginError, match="broken_kernels.*no kernels today"):  # an in-memory plugin's failure is fatal
        kernel_entry("lora_shrink_expand", "cpu")
    assert record.status == "failed" and "host_offer_kernels raised RuntimeError" in record.reason
    assert kernel_entry("lora_shrink_expand", "cpu").source == "host.core"


def test_the_cli_shows_which_kernel_serves_each_op(fixture_sites, builtin_plugins_listing):
    """The pip-installed fixture ``quantint4`` offers its op's reference through the hook; the
    built-in CPU platform's compiled kernels serve the GGUF and int8 ops over the references."""
    site = fixture_sites["quantint4"]
    listed, table = run_hosts((["platform", "--json"], [site]), (["plugins", "list"], [site]))
    assert listed.returncode == 0, listed.stderr
    kernels = {k["op"]: k for k in json.loads(listed.stdout)["kernels"]}
    int4 = kernels["int4_sym_linear"]
    assert (int4["device_type"], int4["serves"], int4["source"]) == ("cpu", "fixture_torch", "fixture_int4")
    assert int4["why"] == "reference for any device: the fixture's torch reference (dequantize, then F.linear)"
    assert kernels["lora_shrink_expand"]["source"] == "host.core"
    gguf = kernels["gguf_linear"]
    assert gguf["serves"] in ("cpu_avx2", "cpu_scalar") and gguf["source"] == "cpu"
    assert gguf["why"].startswith("priority 10 on cpu: compiled C++ kernels")
    assert [r["name"] for r in gguf["runners_up"]] == ["torch_reference"]
    assert table.returncode == 0, table.stderr
    assert "kernels on cpu" in table.stdout and "fixture_torch" in table.stdout and "int4_sym_linear" in table.stdout
    # the built-in listing's JSON carries the same rows, without the fixture
    assert builtin_plugins_listing.returncode == 0, builtin_plugins_listing.stderr
    payload = json.loads(builtin_plugins_listing.stdout)
    ops = {k["op"]: k for k in payload["kernels"]}
    assert "int4_sym_linear" not in ops and ops["int8_linear"]["serves"] == gguf["serves"]
    hooks = {p["name"]: p["hooks"] for p in payload["plugins"]}
    assert "host_offer_kernels" in hooks["cpu"] and "host_offer_kernels" in hooks["builtin_quantization"]


def test_without_compiled_kernels_the_references_serve():
    proc = run_host(["platform", "--json"], [], HOST_CPU_KERNELS="0")
    assert proc.returncode == 0, proc.stderr
    kernels = {k["op"]: k for k in json.loads(proc.stdout)["kernels"]}
    assert kernels["gguf_linear"]["serves"] == "torch_reference" and kernels["gguf_linear"]["runners_up"] == []
