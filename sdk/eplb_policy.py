"""For plugin authors: :mod:`host.interfaces.eplb_policy`, re-exported (the engine imports it from there)."""

from host.interfaces.eplb_policy import *  # noqa: F401,F403 - every public name, re-exported
from host.interfaces.eplb_policy import EplbPolicy  # noqa: F401 - named for host.sdk
