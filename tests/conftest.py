"""Shared test set-up: real pip installs of the fixture plugin packages under tests/fixtures/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import helpers`

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
FIXTURE_PACKAGES = ("recorder", "accel_a", "accel_b", "endpoint", "broken", "wronggroup")

pytest_plugins = ["host.sdk.testing"]


@pytest.fixture(scope="session")
def fixture_sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``pip install`` each fixture package into its own target directory (real installs with
    real dist-info and entry points); tests put the ones they need on ``sys.path``/PYTHONPATH."""
    root = tmp_path_factory.mktemp("fixture-sites")
    sites: dict[str, str] = {}
    for name in FIXTURE_PACKAGES:
        target = root / name
        cmd = [
            sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
            "--no-build-isolation", "--target", str(target), str(FIXTURES / name),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"pip install of fixture {name} failed:\n{proc.stdout}\n{proc.stderr}")
        sites[name] = str(target)
    return sites


