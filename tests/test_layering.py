"""The layers of ``host``, as a test: who may import whom (docs/architecture.md, ARCHITECTURE).

Bottom to top: ``host.hooks`` (hook specs; imports nothing of ``host`` but itself),
``host.contracts`` (the types that cross between the engine's parts: messages, ``Request``, step
outputs, forward context, params; imports nothing of ``host`` but itself), ``host.interfaces``
(the base classes and tables the engine calls; imports only itself and the contracts),
``host.core`` (the engine; never imports a plugin nor ``host.sdk``), ``host.sdk`` (the stable
surface over the core for plugin authors; never imports a plugin), ``host.plugins`` (built-ins,
which reach the engine only through ``host.sdk``). Inside ``host.plugins`` each package is a
plugin, named by an entry point, or a library package several plugins share; a plugin never
imports another plugin. Inside ``host.core`` a lower role folder never imports a higher one
(:data:`BACK_UP_IMPORTS`).

:func:`layering_violations` reads every ``.py`` file under ``core/``, ``hooks/``, ``sdk/`` and
``plugins/`` with :mod:`ast` — module-level and function-level ``import`` / ``from`` statements,
relative ones resolved, ``if TYPE_CHECKING:`` blocks included — and names the file, the line and
the rule of each forbidden import. Strings are not imports: a qualified name such as
``"host.core.worker.worker:Worker"`` or an ``importlib.import_module("host.plugins.x")`` call is
not checked.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import REPO

SOURCE_DIRS = ("contracts", "interfaces", "core", "hooks", "sdk", "plugins")

# Packages under host.plugins that no entry point names: code several built-in plugins share.
LIBRARY_PACKAGES: dict[str, str] = {
    "host.plugins.triton_ops": (
        "the Triton kernels, the triton_paged backend class, the sampling kernel and the custom ops "
        "that both GPU platforms run (builtin_cuda registers triton_paged, builtin_rocm its subclass "
        "triton_rocm)"
    ),
}

# (importing module or package, imported module or package) -> why a built-in plugin may import
# another built-in plugin there. Each entry must still match an import of the real tree.
CROSS_PLUGIN_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("host.plugins.builtin_rocm.platform", "host.plugins.builtin_cuda.platform"): (
        "RocmPlatform subclasses CudaPlatform: a HIP build of torch answers through torch.cuda, so "
        "ROCm changes only detection, device ids, its attention backend and its start-up checks"
    ),
    ("host.plugins.builtin_cpu", "host.plugins.torch_paged"): (
        "cpu_paged is the torch_paged algorithm plus the compiled decode kernel (its impl and "
        "backend subclass torch_paged's, the fused decode step reads torch_paged's metadata)"
    ),
}

# (importing module, imported module) -> why a plugin imports host.core directly rather than
# through host.sdk. Kept empty: what plugins need is re-exported by host.sdk's modules.
CORE_IMPORT_ALLOWLIST: dict[tuple[str, str], str] = {}

# (lower, higher) role folders of host.core: the lower never imports the higher, even lazily
BACK_UP_IMPORTS: dict[tuple[str, str], str] = {
    ("host.core.config", "host.core.models"): "configs are plain validated dataclasses; the models read them",
    ("host.core.engine", "host.core.worker"): "the engine core reaches workers through its executor (collective_rpc)",
    ("host.core.kv_cache", "host.core.scheduler"): "the scheduler drives the KV cache manager, never the reverse",
    ("host.core.lora", "host.core.worker"): "LoRA layers read the forward context from host.contracts",
    ("host.core.models", "host.core.worker"): "models read the forward context from host.contracts",
    ("host.core.scheduler", "host.core.engine"): "the engine core drives the scheduler; messages live in host.contracts",
    ("host.core.scheduler", "host.core.worker"): "the scheduler reads the runner's output type from host.contracts",
}

RULE_NO_PLUGINS_BELOW = "contracts/, interfaces/, core/, hooks/ and sdk/ never import host.plugins"
RULE_CONTRACTS_AT_THE_FLOOR = "contracts/ imports nothing of host but itself"
RULE_INTERFACES_BELOW_CORE = "interfaces/ imports only itself and host.contracts"
RULE_CORE_BELOW_SDK = "core/ never imports host.sdk (it calls host.interfaces; host.sdk is the plugin authors' surface)"
RULE_NO_BACK_UP = "a lower role folder of host.core never imports a higher one (BACK_UP_IMPORTS)"
RULE_HOOKS_AT_THE_BOTTOM = "hooks/ is the bottom layer: it imports only host.hooks"
RULE_PLUGINS_APART = "a built-in plugin never imports another built-in plugin (only a library package)"
RULE_CORE_THROUGH_SDK = "a plugin reaches host.core only through host.sdk"


@dataclass(frozen=True)
class Import:
    """One imported name: ``target`` is the module, or ``module.name`` for ``from module import
    name`` (a submodule or an attribute; the rules match by prefix, so either works)."""

    file: str  # relative to the root
    line: int
    importer: str  # the importing module's name, ``host.…``
    target: str


@dataclass(frozen=True)
class Violation:
    file: str
    line: int
    importer: str
    target: str
    rule: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.importer} imports {self.target} ({self.rule})"


def within(name: str, prefix: str) -> bool:
    """``name`` is the module or package ``prefix`` or inside it."""
    return name == prefix or name.startswith(prefix + ".")


def module_name(root: Path, path: Path) -> tuple[str, bool]:
    """``host.…`` name of a source file, and whether it is a package's ``__init__``."""
    parts = path.relative_to(root).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(("host", *parts)), is_package


def imports_of(root: Path, path: Path) -> list[Import]:
    """Every import statement of one file, anywhere in it, with relative imports resolved."""
    importer, is_package = module_name(root, path)
    package = importer if is_package else importer.rpartition(".")[0]
    rel = path.relative_to(root).as_posix()
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [Import(rel, node.lineno, importer, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                if node.level - 1 >= len(anchor):
                    raise ValueError(f"{rel}:{node.lineno}: a relative import climbs above the host package")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found += [Import(rel, node.lineno, importer, f"{base}.{alias.name}") for alias in node.names]
    return sorted(found, key=lambda imp: imp.line)


def plugin_package(name: str) -> str | None:
    """``host.plugins.X`` for a module inside built-in package X (``None`` outside one)."""
    parts = name.split(".")
    if len(parts) < 3 or parts[:2] != ["host", "plugins"]:
        return None
    return ".".join(parts[:3])


def excepted(imp: Import, table: dict[tuple[str, str], str]) -> bool:
    return any(within(imp.importer, src) and within(imp.target, dst) for src, dst in table)


def rules_broken(imp: Import) -> list[str]:
    """The layering rules one import breaks."""
    broken = []
    if within(imp.target, "host.plugins") and any(
        within(imp.importer, f"host.{layer}") for layer in ("contracts", "interfaces", "core", "hooks", "sdk")
    ):
        broken.append(RULE_NO_PLUGINS_BELOW)
    if within(imp.importer, "host.contracts") and within(imp.target, "host") and not within(imp.target, "host.contracts"):
        broken.append(RULE_CONTRACTS_AT_THE_FLOOR)
    if (within(imp.importer, "host.interfaces") and within(imp.target, "host")
            and not any(within(imp.target, p) for p in ("host.interfaces", "host.contracts"))):
        broken.append(RULE_INTERFACES_BELOW_CORE)
    if within(imp.importer, "host.core") and within(imp.target, "host.sdk"):
        broken.append(RULE_CORE_BELOW_SDK)
    if any(within(imp.importer, low) and within(imp.target, high) for low, high in BACK_UP_IMPORTS):
        broken.append(RULE_NO_BACK_UP)
    if within(imp.importer, "host.hooks") and within(imp.target, "host") and not within(imp.target, "host.hooks"):
        broken.append(RULE_HOOKS_AT_THE_BOTTOM)
    mine, theirs = plugin_package(imp.importer), plugin_package(imp.target)
    if mine and theirs and mine != theirs and theirs not in LIBRARY_PACKAGES and not excepted(imp, CROSS_PLUGIN_EXCEPTIONS):
        broken.append(RULE_PLUGINS_APART)
    if within(imp.importer, "host.plugins") and within(imp.target, "host.core") and not excepted(imp, CORE_IMPORT_ALLOWLIST):
        broken.append(RULE_CORE_THROUGH_SDK)
    return broken


def source_files(root: Path) -> list[Path]:
    return sorted(p for d in SOURCE_DIRS if (root / d).is_dir() for p in (root / d).rglob("*.py") if "__pycache__" not in p.parts)


def all_imports(root: Path) -> list[Import]:
    return [imp for path in source_files(root) for imp in imports_of(root, path)]


def layering_violations(root: Path) -> list[Violation]:
    """Every forbidden import under ``root`` (a tree laid out like the repository: ``root`` is
    the ``host`` package), in file and line order."""
    return [
        Violation(imp.file, imp.line, imp.importer, imp.target, rule)
        for imp in all_imports(root)
        for rule in rules_broken(imp)
    ]


# -- the real tree ----------------------------------------------------------------------------------


def test_the_repository_keeps_its_layers():
    violations = layering_violations(REPO)
    assert not violations, "forbidden imports:\n" + "\n".join(map(str, violations))


def test_every_exception_is_still_needed():
    imports = all_imports(REPO)
    for table in (CROSS_PLUGIN_EXCEPTIONS, CORE_IMPORT_ALLOWLIST):
        for (src, dst), reason in table.items():
            assert reason, f"the exception {src} -> {dst} needs its reason"
            assert any(within(i.importer, src) and within(i.target, dst) for i in imports), (
                f"no import from {src} of {dst} is left: delete that exception"
            )
    for library in LIBRARY_PACKAGES:
        users = {plugin_package(i.importer) for i in imports if within(i.target, library)} - {library}
        assert len(users) >= 2, f"{library} is shared by {sorted(users)}: a library package is for code plugins share"


def test_every_plugins_package_is_a_plugin_or_a_library():
    """Named by an entry point in pyproject.toml (a plugin) or listed in LIBRARY_PACKAGES (never
    both), so the 'plugins stay apart' rule knows each package's kind."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    targets = [t for group in project["entry-points"].values() for t in group.values()]
    plugins = {plugin_package(t.partition(":")[0]) for t in targets} - {None}
    packages = {f"host.plugins.{p.parent.name}" for p in (REPO / "plugins").glob("*/__init__.py")}
    assert not plugins & set(LIBRARY_PACKAGES), "a library package must not be an entry point"
    assert packages == plugins | set(LIBRARY_PACKAGES), (
        f"neither plugin nor library: {sorted(packages - plugins - set(LIBRARY_PACKAGES))}; "
        f"listed but missing: {sorted((plugins | set(LIBRARY_PACKAGES)) - packages)}"
    )


# -- the checker, on a synthetic tree ---------------------------------------------------------------


SYNTHETIC = {
    # one forbidden import of each kind
    "core/engine.py": "import os\n\nfrom host.plugins.alpha.kernels import fast\n",
    "core/frontend.py": "from host.sdk.errors import APIError\n",
    "core/scheduler/plan.py": "def plan():\n    from host.core.worker.output import ModelRunnerOutput\n",
    "contracts/messages.py": "from host.core.config import Config\n",
    "interfaces/platform.py": "from host.core.plugins.manager import get_plugin_host\n",
    "hooks/general.py": "from host.hooks.markers import hookspec\n\n\ndef spec():\n    from host.core.config import Config\n",
    "sdk/helpers.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..plugins.alpha import thing\n",
    "plugins/alpha/platform.py": "from host.plugins.beta.attention import BetaBackend\n",
    "plugins/alpha/runner.py": "def run():\n    import host.core.worker.worker\n",
    # clean files: the same names as strings, the sdk, the package's own modules, the library
    "plugins/__init__.py": "",
    "plugins/alpha/__init__.py": "from . import platform\nfrom .kernels import fast\n",
    "plugins/alpha/kernels.py": (
        "import importlib\n\nfrom host.plugins.triton_ops.kernels import paged_attention\n"
        "from host.sdk.runtime import current_platform\n\n"
        'WORKER = "host.core.worker.worker:Worker"\n'
        'BETA = importlib.import_module("host.plugins.beta")\n'
    ),
    "plugins/beta/__init__.py": "",
    "plugins/beta/attention.py": "from host.sdk import AttentionBackend\n\n\nclass BetaBackend(AttentionBackend):\n    pass\n",
    "plugins/triton_ops/__init__.py": "",
    "plugins/triton_ops/kernels.py": "import torch\n",
    "core/worker.py": "from host.interfaces.attention import AttentionBackend\nfrom host.core.config import Config\n",
    "contracts/request.py": "import enum\n\nfrom host.contracts.sampling_params import SamplingParams\n",
    "interfaces/attention.py": "from host.contracts.forward_context import ForwardContext\n",
    "sdk/runtime.py": "from host.core.plugins.platform import current_platform\n",
    "hooks/markers.py": "import pluggy\n",
}


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_finds_one_forbidden_import_of_each_kind(tmp_path):
    write_tree(tmp_path, SYNTHETIC)
    found = {(v.file, v.line, v.target, v.rule) for v in layering_violations(tmp_path)}
    assert found == {
        ("core/engine.py", 3, "host.plugins.alpha.kernels.fast", RULE_NO_PLUGINS_BELOW),
        ("hooks/general.py", 5, "host.core.config.Config", RULE_HOOKS_AT_THE_BOTTOM),
        ("sdk/helpers.py", 4, "host.plugins.alpha.thing", RULE_NO_PLUGINS_BELOW),
        ("plugins/alpha/platform.py", 1, "host.plugins.beta.attention.BetaBackend", RULE_PLUGINS_APART),
        ("plugins/alpha/runner.py", 2, "host.core.worker.worker", RULE_CORE_THROUGH_SDK),
        ("core/frontend.py", 1, "host.sdk.errors.APIError", RULE_CORE_BELOW_SDK),
        ("core/scheduler/plan.py", 2, "host.core.worker.output.ModelRunnerOutput", RULE_NO_BACK_UP),
        ("contracts/messages.py", 1, "host.core.config.Config", RULE_CONTRACTS_AT_THE_FLOOR),
        ("interfaces/platform.py", 1, "host.core.plugins.manager.get_plugin_host", RULE_INTERFACES_BELOW_CORE),
    }
    message = str(next(v for v in layering_violations(tmp_path) if v.file == "plugins/alpha/runner.py"))
    assert message == (
        "plugins/alpha/runner.py:2: host.plugins.alpha.runner imports host.core.worker.worker "
        f"({RULE_CORE_THROUGH_SDK})"
    )


def test_the_checker_passes_a_clean_tree(tmp_path):
    clean = {rel: text for rel, text in SYNTHETIC.items() if rel not in (
        "core/engine.py", "hooks/general.py", "sdk/helpers.py", "plugins/alpha/platform.py", "plugins/alpha/runner.py",
        "core/frontend.py", "core/scheduler/plan.py", "contracts/messages.py", "interfaces/platform.py",
    )}
    clean["plugins/alpha/__init__.py"] = "from .kernels import fast\n"  # platform.py is gone
    write_tree(tmp_path, clean)
    assert layering_violations(tmp_path) == []


def test_the_exceptions_are_exactly_as_wide_as_listed(tmp_path):
    write_tree(tmp_path, {
        # the documented exceptions
        "plugins/builtin_rocm/platform.py": "from host.plugins.builtin_cuda.platform import CudaPlatform\n",
        "plugins/builtin_cpu/attention.py": "from host.plugins.torch_paged.attention import TorchPagedAttentionBackend\n",
        # ... and one step past each
        "plugins/builtin_rocm/attention.py": "from host.plugins.builtin_cuda.attention_plugin import register\n",
        "plugins/builtin_cpu/platform.py": "from host.plugins.builtin_cuda.platform import CudaPlatform\n",
        "plugins/torch_paged/attention.py": "from host.plugins.builtin_cpu.kernels import paged_decode_kernel\n",
    })
    assert {v.file for v in layering_violations(tmp_path)} == {
        "plugins/builtin_rocm/attention.py", "plugins/builtin_cpu/platform.py", "plugins/torch_paged/attention.py",
    }


def test_a_relative_import_above_the_package_is_an_error(tmp_path):
    write_tree(tmp_path, {"core/x.py": "from .... import y\n"})
    with pytest.raises(ValueError, match="core/x.py:1: a relative import climbs above the host package"):
        layering_violations(tmp_path)
