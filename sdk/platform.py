"""For plugin authors: :mod:`host.interfaces.platform`, re-exported (the engine imports it from there)."""

from host.interfaces.platform import (  # noqa: F401 - re-exported
    Platform,
    PlatformEnum,
    UnspecifiedPlatform,
)
