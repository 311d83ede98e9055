"""For plugin authors: :mod:`host.interfaces.errors`, re-exported (the engine imports it from there)."""

from host.interfaces.errors import (  # noqa: F401 - re-exported
    APIError,
    error_body,
    error_response,
)
