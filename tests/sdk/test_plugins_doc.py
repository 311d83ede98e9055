"""docs/plugins.md is the plugin author's guide: every group, every hook's signature, every
conformance suite, and each family's template example exactly as `host plugins new` writes it."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import host.sdk.conformance as conformance
from host.core.entrypoints.cli.plugin_template import TEMPLATES, family_of, placeholders, render
from host.hooks.groups import FAMILY_MODULES, GROUPS, hook_names

DOC = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()


def signature(module, hook: str) -> str:
    sig = inspect.signature(getattr(module, hook))
    ret = str(sig.return_annotation).strip("'")
    return f"{hook}({', '.join(sig.parameters)})" + ("" if ret == "None" else f" -> {ret}")


@pytest.mark.parametrize("group", list(GROUPS))
def test_each_group_has_its_page_with_every_hook_signature(group):
    assert f"### `{group}`" in DOC, f"docs/plugins.md has no section '### `{group}`'"
    module = FAMILY_MODULES[group]
    for hook in hook_names(module):
        assert f"`{signature(module, hook)}`" in DOC, f"docs/plugins.md does not show `{signature(module, hook)}`"


@pytest.mark.parametrize("group", list(GROUPS))
def test_each_family_shows_the_template_plugin_verbatim(group):
    family = family_of(group)
    code = render((TEMPLATES / family / "plugin.py.tmpl").read_text(), placeholders("my_plugin", group)).rstrip()
    assert f"```python\n{code}\n```" in DOC, (
        f"docs/plugins.md's example for {group} is not sdk/template/{family}/plugin.py.tmpl as written for my_plugin; "
        f"paste what `host plugins new my_plugin --group {group}` puts in my_plugin/__init__.py"
    )


def test_every_conformance_suite_is_in_the_table():
    for name in conformance.__all__:
        if name.endswith("Conformance"):
            assert f"| `{name}` |" in DOC, f"docs/plugins.md's suite table lacks {name}"
