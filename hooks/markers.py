"""The pluggy markers every host plugin uses.

``hookimpl`` is re-exported from :mod:`host.sdk`; plugin authors import it from there.
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "host"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
