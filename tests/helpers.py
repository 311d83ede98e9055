"""Helpers shared by tests (importable because tests/conftest.py puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
HOST_BIN = str(Path(sys.executable).with_name("host"))


@contextlib.contextmanager
def on_sys_path(*paths: str) -> Iterator[None]:
    """Make installed fixture packages discoverable in this process for the block."""
    sys.path[:0] = list(paths)
    try:
        yield
    finally:
        for p in paths:
            sys.path.remove(p)
        for mod in [m for m in sys.modules if m.startswith("host_fixture_")]:
            del sys.modules[mod]


def subprocess_env(sites: list[str], **extra: str) -> dict[str, str]:
    """A clean environment for a child process with only ``sites`` as extra plugins."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOST_")}
    env["PYTHONPATH"] = os.pathsep.join(sites)
    env.update(extra)
    return env


def run_host(args: list[str], sites: list[str], timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    """Run the installed ``host`` command in a child process."""
    return subprocess.run([HOST_BIN, *args], capture_output=True, text=True, env=subprocess_env(sites, **extra), timeout=timeout)
