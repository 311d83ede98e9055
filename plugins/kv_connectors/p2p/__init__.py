"""The ``p2p`` KV connector: a consumer pulls a producer's KV blocks over TCP (see
:mod:`.connector`)."""

from .connector import P2PConnector

__all__ = ["P2PConnector"]
