"""A node's counters: `NodeStats`, the frozen snapshot a caller reads, and `Counters`,
the live ones the node's threads add to; `LinkStats`, the counters of the links to one
peer node."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["Counters", "LinkStats", "NodeStats"]


@dataclass(frozen=True, slots=True)
class NodeStats:
    """Counters of a node, as a frozen snapshot.

    Attributes:
        frames_sent / envelopes_sent: what the writers put on links. The envelope
            counters count messages: each message of a run (consecutive messages of one
            producer sharing one envelope) counts once.
        frames_received / envelopes_received: what the readers took off links.
        links_opened / links_lost: links established (dialled or accepted) and broken.
        dropped_pending: envelopes dropped because a disconnected peer's outbox was full.
        dropped_unsendable: messages that could not be encoded or exceeded the size limit.
        lost_in_flight: messages in a frame whose write failed (the protocol resends).
        malformed: received envelopes that could not be decoded (a run counts once).
        unknown_target: received envelopes for a name nothing is exposed under.
        rejected_links: links refused (a wrong token, no hello, or with mutual TLS an
            address the peer's certificate does not name).
    """

    frames_sent: int
    envelopes_sent: int
    frames_received: int
    envelopes_received: int
    links_opened: int
    links_lost: int
    dropped_pending: int
    dropped_unsendable: int
    lost_in_flight: int
    malformed: int
    unknown_target: int
    rejected_links: int


@dataclass(slots=True)
class Counters:
    """The live, mutable counters behind `NodeStats` (same fields)."""

    frames_sent: int = 0
    envelopes_sent: int = 0
    frames_received: int = 0
    envelopes_received: int = 0
    links_opened: int = 0
    links_lost: int = 0
    dropped_pending: int = 0
    dropped_unsendable: int = 0
    lost_in_flight: int = 0
    malformed: int = 0
    unknown_target: int = 0
    rejected_links: int = 0

    def snapshot(self) -> NodeStats:
        # Field by field: dataclasses.asdict deep-copies, ten times slower (metrics read
        # this at every scrape).
        return NodeStats(*[getattr(self, name) for name in _FIELDS])


_FIELDS = tuple(field.name for field in dataclasses.fields(Counters))


@dataclass(frozen=True, slots=True)
class LinkStats:
    """Counters of a node's links to one peer node, as a frozen snapshot (counted per
    frame, never per message).

    Attributes:
        frames_sent / bytes_sent: frames written to the peer, and their encoded size.
            What this node receives from the peer is the peer's ``bytes_sent`` to it.
        frames_received: frames read from the peer.
        links_opened / links_lost: links to the peer established (dialled or accepted)
            and broken; every one opened after the first is a reconnect.
        up: a link to the peer is open now.
    """

    frames_sent: int
    bytes_sent: int
    frames_received: int
    links_opened: int
    links_lost: int
    up: bool
