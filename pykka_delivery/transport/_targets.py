"""What the two ends of a link tell each other about names: `TargetReports`.

A node that receives envelopes for a name nothing is exposed under drops them (and counts
them in ``unknown_target``); without a word back, the sender's handle would only time
out with "nothing delivered". So the receiving node tells the sender, on the same link, in
a ``TargetNotice`` frame: at most once per name and link every
``NodeSettings.unknown_target_report_interval``, and once more ("exposed") when the name
is exposed later, so that the sender forgets it. The sender keeps the names it was told
of (``missing``) until then, or until the link goes down (the other node may come back
with the name), and a `RemoteRef` to such a name says so in its ``link_problem``.

Everything here runs on the node's loop; ``missing`` is read from any thread (a set's
membership test needs no lock).
"""

from __future__ import annotations

from pykka_delivery.protocol import transport_pb2

__all__ = ["TargetReports", "missing_target_problem"]

# Above this many names told unknown on one link, those told longer than an interval ago
# are forgotten (a peer sending to ever new names must not grow the node's memory).
_REMEMBERED = 1024


def missing_target_problem(node_address: str, name: str) -> str:
    """What a handle's timeout says about a name nothing is exposed under."""
    return (
        f"no target {name!r} on node {node_address}: nothing is exposed under that name; "
        "check the name or expose it first"
    )


class TargetReports:
    """Both directions of one peer's name reports.

    Attributes:
        missing: names the peer said nothing is exposed under there (sending side).
        pending: the notice waiting to be written to the peer, or None.
    """

    __slots__ = ("_told", "missing", "pending")

    def __init__(self) -> None:
        self._told: dict[str, float] = {}  # name -> when we last told the peer it is unknown
        self.missing: set[str] = set()
        self.pending: transport_pb2.TargetNotice | None = None

    def unknown_here(self, name: str, now: float, interval: float) -> bool:
        """Envelopes from the peer for ``name`` were dropped at ``now``: True if the peer
        is to be told (it was not within ``interval`` seconds)."""
        told = self._told
        last = told.get(name)
        if last is not None and now - last < interval:
            return False
        if last is None and len(told) >= _REMEMBERED:
            for old in [n for n, at in told.items() if now - at >= interval]:
                del told[old]
        told[name] = now
        notice = self._notice()
        if name in notice.exposed:
            notice.exposed.remove(name)
        notice.unknown.append(name)
        return True

    def exposed_here(self, name: str) -> bool:
        """``name`` was exposed: True if the peer, told before it was unknown, is to be
        told it is not any more."""
        if self._told.pop(name, None) is None:
            return False
        notice = self._notice()
        if name in notice.unknown:
            notice.unknown.remove(name)
        notice.exposed.append(name)
        return True

    def take(self) -> transport_pb2.TargetNotice | None:
        """The notice to write now (then nothing is pending), or None."""
        notice, self.pending = self.pending, None
        return notice

    def heard(self, notice: transport_pb2.TargetNotice) -> list[str]:
        """The peer told us ``notice``: the names newly known missing there."""
        new = [name for name in notice.unknown if name not in self.missing]
        self.missing.update(notice.unknown)
        self.missing.difference_update(notice.exposed)
        return new

    def link_down(self) -> None:
        """The last link to the peer broke: what either side was told may be stale."""
        self._told.clear()
        self.missing.clear()
        self.pending = None

    def _notice(self) -> transport_pb2.TargetNotice:
        if self.pending is None:
            self.pending = transport_pb2.TargetNotice()
        return self.pending
