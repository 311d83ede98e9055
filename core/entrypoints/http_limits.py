"""Connection limits of the API server's HTTP layer (uvicorn's h11 protocol, process 0).

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive`` seconds, but a
connection that never completes its request headers (a half-open or slowloris client) is held
for ever. :func:`h11_protocol_with_header_timeout` returns uvicorn's h11 protocol with a
header-read timeout: a connection whose request line and headers have not all arrived
``header_read_timeout`` seconds after it opened — or after its previous response, once the
next request's first bytes came — is closed. Bodies and responses are not timed (a long
stream is normal).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("host.api")


class _HeaderTimeoutH11(H11Protocol):
    header_read_timeout: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self._arm_header_timer()  # the next request's headers are on their way
        scope = self.scope
        super().data_received(data)
        if self.scope is not scope:  # a request's headers were read completely
            self._cancel_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_read_timeout, self._header_timeout_expired)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout_expired(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            logger.debug("closing a connection from %s: no complete request headers within %g s", self.client, self.header_read_timeout)
            self.transport.close()


def h11_protocol_with_header_timeout(header_read_timeout: float) -> type[Any]:
    """uvicorn's h11 protocol class, closing connections whose headers take longer than
    ``header_read_timeout`` seconds (pass it as ``uvicorn.Config(http=...)``)."""
    if not header_read_timeout > 0:
        raise ValueError(f"--header-read-timeout must be > 0 seconds, got {header_read_timeout}")
    return type("HostH11Protocol", (_HeaderTimeoutH11,), {"header_read_timeout": float(header_read_timeout)})
