"""A process that froze its start-up objects (``freeze_startup_objects``: the API server, the
engine core, each worker, an in-process ``LLM``) exits without nanobind's leak report: torch
imports triton, and a frozen reference cycle used to keep triton's nanobind objects alive past
their module, so every exit printed ~40 "nanobind: leaked ..." lines."""

from __future__ import annotations

import subprocess
import sys

from helpers import subprocess_env


def test_no_nanobind_leak_report_at_exit():
    code = (
        "import torch, torch._dynamo\n"  # torch._dynamo pulls the triton objects into a cycle
        "from host.core.utils import freeze_startup_objects\n"
        "freeze_startup_objects()\n"
        "freeze_startup_objects()\n"  # a second call registers no second hook
        "print('froze')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=subprocess_env([]))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "froze"
    assert "nanobind" not in proc.stderr, proc.stderr[-2000:]
