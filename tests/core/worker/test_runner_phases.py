"""Step kinds as peers of the model runner's public phases (issue 34, deliverable 3).

* No module under ``core/`` but the runner itself reaches a private (``_name``) member of a
  model runner, and the batch queue reaches no private member of its engine core: an AST scan.
* The runner, its step kinds, the step handle, the proposers, the batch queue and the engine core
  import each other in one direction only, and so does every other module of ``core/``: no import
  cycle (every import counts: module level, ``TYPE_CHECKING`` blocks and imports inside functions).
* The runner's phases are public and documented, every step kind has the
  :class:`~host.core.worker.step_kind.StepKind` shape, and the worker picks the kind by config.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import REPO

CORE = REPO / "core"
RUNNER_FILE = CORE / "worker" / "model_runner.py"
BATCH_QUEUE_FILE = CORE / "engine" / "batch_queue.py"

# names and attributes that hold a model runner / an engine core
RUNNER_NAMES = {"runner", "model_runner"}
CORE_NAMES = {"core", "engine_core"}


def _is_holder(node: ast.AST, names: set[str], aliases: set[str]) -> bool:
    """``runner`` / ``model_runner`` (or an alias of one), or ``<anything>.runner`` /
    ``<anything>.model_runner``."""
    if isinstance(node, ast.Name):
        return node.id in names or node.id in aliases
    return isinstance(node, ast.Attribute) and node.attr in names


def _aliases(tree: ast.AST, names: set[str]) -> set[str]:
    """Local names bound to a holder anywhere in the module (``r = self.runner``), to a fixed
    point (``r2 = r``)."""
    found: set[str] = set()

    def bind(target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name) and _is_holder(value, names, found):
            found.add(target.id)
        elif isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):  # r, s = self.runner, self.scheduler
                bind(t, v)

    while True:
        before = len(found)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target, node.value)
            elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                bind(node.target, node.value)
        if len(found) == before:
            return found


def private_accesses(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, text) of every ``<holder>._name`` attribute access in ``source`` (dunders
    excepted)."""
    tree = ast.parse(source)
    aliases = _aliases(tree, names)
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and _is_holder(node.value, names, aliases)):
            out.append((node.lineno, node.col_offset, ast.unparse(node)))
    return [(line, text) for line, _, text in sorted(out)]


def test_the_scan_finds_private_runner_accesses() -> None:
    """The scanner itself: each way of reaching a runner's private member is found."""
    source = (
        "def f(self, runner, model_runner):\n"
        "    runner._update_states(so)\n"
        "    model_runner._prev_sampled = None\n"
        "    self.runner._prepare_inputs(so)\n"
        "    r = self.runner\n"
        "    r._run_forward(inputs)\n"
        "    q, other = r, self.other\n"
        "    q._record_step()\n"
        "    other._fine\n"
        "    worker.model_runner._forward\n"
        "    runner.update_states(so)\n"  # public: fine
        "    runner.__class__\n"  # a dunder: fine
        "    self._private\n"  # not a runner: fine
    )
    found = [text for _, text in private_accesses(source, RUNNER_NAMES)]
    assert found == ["runner._update_states", "model_runner._prev_sampled", "self.runner._prepare_inputs",
                     "r._run_forward", "q._record_step", "worker.model_runner._forward"]
    queue = ("class Q:\n    def __init__(self, core):\n        self.core = core\n        self._steps = []\n"
             "    def step(self):\n        core, s = self.core, self.core.scheduler\n        self.core._idle_step(so)\n"
             "        core._update(a, b)\n        s._private\n")
    assert [t for _, t in private_accesses(queue, CORE_NAMES)] == ["self.core._idle_step", "core._update"]


def test_no_module_under_core_reaches_a_private_runner_member() -> None:
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        if path == RUNNER_FILE:
            continue
        for line, text in private_accesses(path.read_text(), RUNNER_NAMES):
            offenders.append(f"{path.relative_to(REPO)}:{line}: {text}")
    assert not offenders, "private model-runner members reached from outside the runner:\n" + "\n".join(offenders)


def test_the_batch_queue_uses_public_engine_core_members_only() -> None:
    offenders = [f"{BATCH_QUEUE_FILE.relative_to(REPO)}:{line}: {text}"
                 for line, text in private_accesses(BATCH_QUEUE_FILE.read_text(), CORE_NAMES)]
    assert not offenders, "private engine-core members reached from the batch queue:\n" + "\n".join(offenders)


# -- import cycles --------------------------------------------------------------------------------

def _module_name(path: Path) -> str:
    return "host." + ".".join(path.relative_to(REPO).with_suffix("").parts)


def _core_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in CORE.rglob("*.py") if p.name != "__init__.py"}


def imported_modules(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports anywhere (module level, inside
    ``TYPE_CHECKING`` or a function), relative imports resolved; ``from pkg import mod`` counts
    as an import of ``pkg.mod``."""
    package = name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                out.add(candidate)
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_core() -> None:
    """No module of ``core/`` imports, through any chain, one that imports it (the runner and
    its step kinds, the batch queue and the engine core, the plugin manager and the platform,
    the KV cache manager and its specs, the input processor and pooling all went one way)."""
    modules = _core_modules()
    graph = {name: imported_modules(path, name, set(modules)) for name, path in modules.items()}
    # the edges this redesign turned around are really read
    assert "host.core.worker.model_runner" in graph["host.core.worker.sampling_step"]
    assert "host.core.worker.model_runner" in graph["host.core.spec_decode.worker.verify"]
    assert "host.core.engine.batch_queue" in graph["host.core.engine.core"]
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_runner_imports_no_step_kind() -> None:
    modules = _core_modules()
    imported = imported_modules(RUNNER_FILE, "host.core.worker.model_runner", set(modules))
    step_kinds = {"host.core.worker.sampling_step", "host.core.pooling.worker", "host.core.worker.step_handle"}
    assert not imported & step_kinds
    assert not {m for m in imported if m.startswith("host.core.spec_decode.")}


# -- the public phases and the step kinds ---------------------------------------------------------

PHASES = ("update_states", "prepare_inputs", "run_forward", "logits_at", "keep_sampled_on_device",
          "record_sampled", "prompt_logprobs")


def test_the_runner_phases_are_public_and_documented() -> None:
    from host.core.worker.model_runner import ModelRunner

    for name in PHASES + ("execute_model", "model_forward"):
        method = getattr(ModelRunner, name)
        assert callable(method), name
        assert inspect.getdoc(method), f"ModelRunner.{name} has no docstring"
    assert inspect.getdoc(ModelRunner.attention_layers)
    assert "make_step" in inspect.signature(ModelRunner).parameters


def _step_kinds() -> list[type]:
    from host.core.pooling.worker import PoolingRunner
    from host.core.spec_decode.worker.verify import SpecDecodeStep
    from host.core.worker.sampling_step import SamplingStep

    return [SamplingStep, SpecDecodeStep, PoolingRunner]


def test_every_step_kind_has_the_protocol_shape() -> None:
    from host.core.worker.step_kind import StepKind

    names = set()
    for cls in _step_kinds():
        for member in ("load", "kv_cache_specs", "initialize_kv_cache", "execute"):
            assert callable(getattr(cls, member, None)), f"{cls.__name__}.{member}"
        assert "non_blocking" in inspect.signature(cls.execute).parameters, cls.__name__
        assert isinstance(cls.computes_logits, bool)
        names.add(cls.name)
    assert names == {"sampling", "speculative", "pooling"}
    assert set(StepKind.__annotations__) >= {"name", "computes_logits"}


def _fake_runner(**config: object) -> SimpleNamespace:
    from host.core.pooling.config import PoolerConfig

    model = SimpleNamespace(runner=config.pop("runner", "generate"), pooler=PoolerConfig())
    cfg = SimpleNamespace(model=model, speculative=config.pop("speculative", None),
                          compilation=SimpleNamespace(cuda_graphs=True, cuda_graph_sizes=[1, 2]))
    return SimpleNamespace(config=cfg, sampler=object(), model=SimpleNamespace())


def test_the_worker_picks_the_step_kind_by_config() -> None:
    from host.core.config import SpeculativeConfig
    from host.core.worker.worker import make_step_kind

    plain = make_step_kind(_fake_runner())
    assert plain.name == "sampling" and plain.computes_logits
    pooling = make_step_kind(_fake_runner(runner="pooling"))
    assert pooling.name == "pooling" and not pooling.computes_logits
    assert pooling.kv_cache_specs() == []
    assert pooling.runner.config.compilation.cuda_graphs is False  # a pooling step replays no decode graphs
    spec = make_step_kind(_fake_runner(speculative=SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 3})))
    assert spec.name == "speculative" and spec.k == 3
    for kind in (plain, pooling, spec):
        assert kind.runner is not None


@pytest.mark.parametrize("name", ["spec_decode", "pooling"])
def test_the_runner_names_its_step_kind(name: str) -> None:
    """``runner.spec_decode`` / ``runner.pooling`` are the step kind when it is that kind."""
    from host.core.worker.model_runner import ModelRunner

    runner = ModelRunner.__new__(ModelRunner)
    kinds = {"spec_decode": "speculative", "pooling": "pooling"}
    runner.step_kind = SimpleNamespace(name=kinds[name])
    assert getattr(runner, name) is runner.step_kind
    runner.step_kind = SimpleNamespace(name="sampling")
    assert getattr(runner, name) is None
    runner.step_kind = None
    assert getattr(runner, name) is None
