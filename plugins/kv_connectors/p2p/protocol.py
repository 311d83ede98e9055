"""The p2p side channel's messages (msgspec msgpack, one frame each; a READ reply's KV bytes
follow it as extra frames).

Consumer -> producer: :class:`GetMeta` (handshake), :class:`Read`, :class:`Heartbeat`,
:class:`Done`. Producer -> consumer: :class:`HandshakePayload`, :class:`ReadReply`, :class:`Ack`.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec


class GetMeta(msgspec.Struct, tag="get_meta"):
    rank: int = 0


class Read(msgspec.Struct, tag="read"):
    engine_id: str  # the producer the reader expects (a restarted producer has a new one)
    req_id: str
    block_ids: list[int]


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    req_ids: list[str]


class Done(msgspec.Struct, tag="done"):
    req_id: str


Message = Union[GetMeta, Read, Heartbeat, Done]


class HandshakePayload(msgspec.Struct):
    engine_id: str
    compatibility_hash: str
    compat_inputs: dict[str, Any]
    lease_s: float
    rank: int
    world_size: int
    layers: list[str]
    num_blocks: int


class ReadReply(msgspec.Struct):
    """``status``: ``ok`` (then one frame per layer, K then V, per run of consecutive block
    ids in ``block_ids`` order), ``unknown`` (no lease for that request: not registered yet,
    or a restarted producer), ``released`` (its lease ended), ``wrong_engine``, ``bad_blocks``."""

    status: str
    detail: str = ""
    layers: list[str] = []


class Ack(msgspec.Struct):
    ok: bool = True
    detail: str = ""


ENCODER = msgspec.msgpack.Encoder()
MESSAGE_DECODER = msgspec.msgpack.Decoder(Message)
HANDSHAKE_DECODER = msgspec.msgpack.Decoder(HandshakePayload)
READ_REPLY_DECODER = msgspec.msgpack.Decoder(ReadReply)
ACK_DECODER = msgspec.msgpack.Decoder(Ack)


def block_runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """``block_ids`` as runs of consecutive ids: ``[(first, count), ...]`` in order (each run is
    one contiguous slice of a page tensor, sent without a copy)."""
    runs: list[tuple[int, int]] = []
    for b in block_ids:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs
