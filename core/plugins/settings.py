"""Plugin settings: allowlist, blocklist, strictness, forced platform, tracing.

Each comes from an environment variable and can be overridden by a command-line flag. The parse
rules matter: ``HOST_PLUGINS`` unset means "no allowlist"; set to ``""`` it is an allowlist that
names nothing, so no third-party plugin loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_ALLOW = "HOST_PLUGINS"
ENV_BLOCK = "HOST_BLOCK_PLUGINS"
ENV_STRICT = "HOST_STRICT_PLUGINS"
ENV_PLATFORM = "HOST_PLATFORM"
ENV_TRACE = "HOST_TRACE_PLUGINS"

_TRUE = {"1", "true", "yes", "on"}


def parse_name_list(raw: str | None) -> list[str] | None:
    """``None`` stays ``None``; otherwise split on commas, strip, drop empty parts."""
    if raw is None:
        return None
    return [part.strip() for part in raw.split(",") if part.strip()]


def _flag(raw: str | None) -> bool:
    return raw is not None and raw.strip().lower() in _TRUE


@dataclass(frozen=True)
class PluginSettings:
    """How the plugin host decides what to load in a process."""

    allow: tuple[str, ...] | None = None
    block: tuple[str, ...] = ()
    strict: bool = False
    platform: str | None = None
    trace: bool = False

    @classmethod
    def from_env(
        cls,
        plugins: str | None = None,
        block_plugins: str | None = None,
        strict: bool | None = None,
        platform: str | None = None,
        trace: bool | None = None,
    ) -> "PluginSettings":
        """Read the environment; any argument that is not ``None`` overrides its variable."""
        allow = parse_name_list(plugins if plugins is not None else os.environ.get(ENV_ALLOW))
        block = parse_name_list(block_plugins if block_plugins is not None else os.environ.get(ENV_BLOCK))
        return cls(
            allow=tuple(allow) if allow is not None else None,
            block=tuple(block or ()),
            strict=strict if strict is not None else _flag(os.environ.get(ENV_STRICT)),
            platform=(platform if platform is not None else os.environ.get(ENV_PLATFORM)) or None,
            trace=trace if trace is not None else _flag(os.environ.get(ENV_TRACE)),
        )

    def to_env(self) -> dict[str, str]:
        """The variables that make a child process resolve the same settings."""
        env = {ENV_STRICT: "1" if self.strict else "0", ENV_TRACE: "1" if self.trace else "0"}
        if self.allow is not None:
            env[ENV_ALLOW] = ",".join(self.allow)
        env[ENV_BLOCK] = ",".join(self.block)
        if self.platform:
            env[ENV_PLATFORM] = self.platform
        return env
