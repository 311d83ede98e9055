"""This process's live objects, for plugins that need them: the resolved platform, the plugin
host, and the resolver of ``"package.module:Name"`` strings (such as ``Platform.worker_cls``).

Stable re-exports of :mod:`host.core.plugins` and :mod:`host.core.utils`; plugins import them
from here, never from the core. Not imported by ``host.sdk`` itself (see :mod:`host.sdk.models`).
"""

from host.core.plugins.manager import get_plugin_host
from host.core.plugins.platform import current_platform
from host.core.utils import resolve_qualname

__all__ = ["current_platform", "get_plugin_host", "resolve_qualname"]
