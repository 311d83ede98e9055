"""Every hook is documented, lives in its family's module, and has a test (datasette's rule)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from host.core.plugins.manager import COLLECTORS, PluginHost
from host.core.plugins.settings import PluginSettings
from host.hooks import FAMILY_MODULES, hook_group, hook_names

ALL_HOOKS = sorted(h for m in FAMILY_MODULES.values() for h in hook_names(m))
TESTS = Path(__file__).resolve().parent.parent


def test_families_cover_every_group():
    from host.hooks.groups import GROUPS

    assert set(FAMILY_MODULES) == set(GROUPS)


@pytest.mark.parametrize("hook", ALL_HOOKS)
def test_hook_has_docstring_and_one_family(hook):
    module = FAMILY_MODULES[hook_group(hook)]
    fn = getattr(module, hook)
    assert inspect.getdoc(fn) and len(inspect.getdoc(fn)) > 80
    owners = [g for g, m in FAMILY_MODULES.items() if hook in hook_names(m)]
    assert owners == [hook_group(hook)]


@pytest.mark.parametrize("hook", ALL_HOOKS)
def test_hook_has_a_test(hook):
    texts = [p.read_text() for p in TESTS.rglob("test_*.py") if p.name != "test_hookspecs.py"]
    texts += [p.read_text() for p in (TESTS / "fixtures").rglob("*.py")]
    assert any(hook in t for t in texts), f"no test or fixture exercises {hook}"


def test_collectors_and_pick_one_hooks():
    host = PluginHost(PluginSettings(), discover=None)
    # collector hooks feed host-owned registries; the select hook is firstresult
    assert set(COLLECTORS) <= set(ALL_HOOKS)
    assert host.pm.hook.host_select_attention_backend.spec.opts["firstresult"] is True
    assert host.pm.hook.host_register_platforms.spec.opts["firstresult"] is False
