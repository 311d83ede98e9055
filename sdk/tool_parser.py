"""For plugin authors: :mod:`host.interfaces.tool_parser`, re-exported (the engine imports it from there)."""

from host.interfaces.tool_parser import *  # noqa: F401,F403 - every public name, re-exported
