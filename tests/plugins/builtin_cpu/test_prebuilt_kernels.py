"""The CPU kernels are compiled when the package is installed (``setup.py``: one module per
instruction set), not at the first start: the engine takes the widest prebuilt module that runs
here and was built from the installed sources; a stale one is left for a first-use build."""

from __future__ import annotations

import os

import pytest

from host.plugins.builtin_cpu import kernels
from host.plugins.builtin_cpu.kernel_build import PREBUILT_PREFIX, probe_runs, sources_hash

PACKAGE_DIR = os.path.dirname(kernels.__file__)


def prebuilt_files() -> dict[str, str]:
    """``isa -> path`` of the modules the install built into the package."""
    found = {}
    for name in os.listdir(PACKAGE_DIR):
        if name.startswith(PREBUILT_PREFIX) and name.endswith(".so"):
            found[name[len(PREBUILT_PREFIX):].split(".")[0]] = os.path.join(PACKAGE_DIR, name)
    return found


@pytest.fixture(scope="module")
def prebuilt() -> dict[str, str]:
    files = prebuilt_files()
    assert files, f"no prebuilt CPU kernel module in {PACKAGE_DIR}: install with make install (pip install --no-build-isolation -e .)"
    return files


def test_the_engine_uses_a_prebuilt_module(prebuilt, monkeypatch):
    monkeypatch.delenv("HOST_CPU_ISA", raising=False)
    monkeypatch.delenv("HOST_CPU_KERNELS", raising=False)
    module = kernels.prebuilt_module()
    assert module is not None
    assert module.__name__.startswith(f"host.plugins.builtin_cpu.{PREBUILT_PREFIX}")
    assert module.__file__ in prebuilt.values()
    assert module.sources_hash == sources_hash(kernels.kernel_sources())
    assert module.isa_probe() == 1
    # the widest instruction set whose probe program runs here is the one chosen
    isa = module.__name__.rsplit(PREBUILT_PREFIX, 1)[1]
    runs = [name for name in ("avx512", "avx2") if name in prebuilt and probe_runs(name)]
    assert isa == (runs[0] if runs else "scalar")


def test_the_child_process_probe_refuses_what_traps(prebuilt, tmp_path, monkeypatch):
    """Each prebuilt module's ``isa_probe()`` runs in a child: it succeeds exactly where the
    compiled probe program of that instruction set runs (an AVX-512 module, built with
    HOST_CPU_KERNEL_ISAS=avx512,avx2, on an AVX2-only machine kills its child with SIGILL, not this
    process)."""
    monkeypatch.setattr(kernels, "_probe_cache_path", lambda: str(tmp_path / "probe.json"))
    for isa, path in prebuilt.items():
        expected = isa == "scalar" or probe_runs(isa)
        assert kernels._prebuilt_runs(path) is expected, isa
    assert (tmp_path / "probe.json").is_file()  # the answers are kept for the next start


def test_a_module_built_from_other_sources_is_not_used(prebuilt, monkeypatch):
    """Sources edited after the install: no prebuilt module is taken (the first use builds one)."""
    monkeypatch.delenv("HOST_CPU_ISA", raising=False)
    edited = [*kernels.kernel_sources()]
    edited[0] += "\n// edited after the install\n"
    monkeypatch.setattr(kernels, "kernel_sources", lambda: edited)
    assert kernels.prebuilt_module() is None


def test_forced_instruction_set(prebuilt, monkeypatch):
    monkeypatch.delenv("HOST_CPU_ISA", raising=False)
    isa = kernels.prebuilt_module().__name__.rsplit(PREBUILT_PREFIX, 1)[1]  # one that runs here
    monkeypatch.setenv("HOST_CPU_ISA", isa)
    assert kernels.prebuilt_module().__file__ == prebuilt[isa]
    monkeypatch.setenv("HOST_CPU_ISA", "bogus")
    with pytest.raises(ValueError, match="HOST_CPU_ISA='bogus' is not one of avx512, avx2, scalar"):
        kernels.prebuilt_module()
