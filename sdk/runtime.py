"""This process's live objects, for plugins that need them: the resolved platform, the plugin
host, the resolver of ``"package.module:Name"`` strings (such as ``Platform.worker_cls``), the
tokenizer loader, and :func:`die_with_parent` for a plugin's own child processes.

Stable re-exports of :mod:`host.core.plugins`, :mod:`host.core.models.tokenizer` and
:mod:`host.core.utils`; plugins import them
from here, never from the core. Not imported by ``host.sdk`` itself (see :mod:`host.sdk.models`).
"""

from host.core.models.tokenizer import get_tokenizer
from host.core.plugins.manager import get_plugin_host
from host.core.plugins.platform import current_platform
from host.core.plugins.processes import die_with_parent
from host.core.utils import resolve_qualname

__all__ = ["current_platform", "die_with_parent", "get_plugin_host", "get_tokenizer", "resolve_qualname"]
