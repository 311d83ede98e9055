"""Every ``--flag`` a hook spec's documentation names is a real option of ``host serve``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import run_host

HOOKS = Path(__file__).resolve().parents[2] / "hooks"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*[a-z]")


def hook_doc_flags() -> dict[str, set[str]]:
    """``--flag`` -> the hook modules whose docstrings (module, hook specs, classes) name it."""
    found: dict[str, set[str]] = {}
    for path in sorted(HOOKS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef)))]
        for node in nodes:
            for flag in FLAG.findall(ast.get_docstring(node) or ""):
                found.setdefault(flag, set()).add(path.name)
    return found


def test_hook_docstrings_name_flags():
    flags = hook_doc_flags()
    # the grep sees what it should: these hook docs name their selecting flags today
    assert {"--attention-backend", "--distributed-executor-backend", "--plugins", "--platform"} <= set(flags)


def test_every_flag_a_hook_names_exists_in_host_serve():
    proc = run_host(["serve", "--help"], [], COLUMNS="200")
    assert proc.returncode == 0, proc.stderr
    options = set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z-]*)", proc.stdout, flags=re.M))
    options |= set(re.findall(r" / (--[a-z][a-z-]*)", proc.stdout))  # the --no-x halves
    missing = {flag: sorted(mods) for flag, mods in hook_doc_flags().items() if flag not in options}
    assert missing == {}, f"hook docs name flags `host serve` lacks: {missing}"
