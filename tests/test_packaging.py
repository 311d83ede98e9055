"""The distribution: one wheel ``host`` holding every subpackage under the ``host`` name."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from helpers import REPO
from host.plugins.builtin_cpu.kernel_build import HEADERS, SOURCES

SKIP_DIRS = {"tests", ".venv", "build", "dist", "bench", "docs", ".git", ".ci", ".cache"}


def source_packages() -> set[str]:
    """Every folder with an ``__init__.py`` under the repository root, as ``host.…`` names."""
    found = {"host"}
    for init in REPO.rglob("__init__.py"):
        rel = init.parent.relative_to(REPO)
        if not rel.parts or rel.parts[0] in SKIP_DIRS or any(p.startswith(".") or p.endswith(".egg-info") for p in rel.parts):
            continue
        found.add(".".join(("host", *rel.parts)))
    return found


def test_wheel_contains_every_package_and_entry_points(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=300,
        # the compiled kernels take minutes (tests/plugins/builtin_cpu/test_prebuilt_kernels.py checks
        # the ones make install built); this wheel is about the package's layout
        env={**os.environ, "HOST_BUILD_CPU_KERNELS": "0"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheel = next(tmp_path.glob("host-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    packages = {str(Path(n).parent).replace("/", ".") for n in names if n.endswith("__init__.py")}
    assert packages == source_packages()
    assert not any(n.startswith(("host/tests", "tests/", "core/", "plugins/")) for n in names)
    for line in ("[host.platforms]", "cpu = host.plugins.builtin_cpu.platform_plugin", "[console_scripts]",
                 "torch_paged = host.plugins.torch_paged.attention_plugin"):
        assert line in entry_points
    # the CPU kernels' C++ sources and the headers they share travel as package data
    assert not [n for n in names if n.endswith(".so")]  # HOST_BUILD_CPU_KERNELS=0: nothing prebuilt
    assert {n for n in names if n.endswith((".cpp", ".h"))} == {
        f"host/plugins/builtin_cpu/csrc/{name}" for name in (*SOURCES, *HEADERS)
    }
    # the wheel imports on its own, from a plain directory, with no editable-install path hooks
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)], check=True)
    import pluggy

    pluggy_site = str(Path(pluggy.__file__).parent.parent)
    script = (
        "import host.hooks, host.sdk, host.core.plugins.manager as m\n"
        "from host.plugins.builtin_cpu import kernels\n"
        "print(m.__file__)\n"
        "print(kernels.__file__)\n"
        "print(sum(len(text) for text in kernels.kernel_sources()))\n"
    )
    check = subprocess.run(
        [sys.executable, "-S", "-c", script],
        capture_output=True, text=True, env={"PYTHONPATH": f"{target}:{pluggy_site}"}, cwd=tmp_path,
    )
    assert check.returncode == 0, check.stderr
    manager_file, kernels_file, source_chars = check.stdout.split()
    assert manager_file.startswith(str(target)) and kernels_file.startswith(str(target))
    # the compiled extension is built from the sources read out of the installed package
    csrc = REPO / "plugins" / "builtin_cpu" / "csrc"
    assert int(source_chars) == sum(len((csrc / name).read_text(encoding="utf-8")) for name in (*SOURCES, *HEADERS))
