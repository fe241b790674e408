"""A producer core's payload gate: the check every payload passes before it is numbered.

The rule (``protocol/payload_check.py``): a payload that what carries or stores it cannot
encode is refused to the sender with its `SerializationError`, before anything changes,
so it never enters the unconfirmed messages or the durable queue and the next message
takes the seq_nr it would have had. A gate holds the check for the core's current
targets (its consumer side, or every worker of a work-pulling core) and its durable
queue, aimed again whenever the targets change, and counts what it refused.

The cores read their copy of ``check`` on their hot path and hand it to
`PayloadGate.refuse_one` only for a payload that needs the check (``type(payload) is not
check.unchecked``), so an in-process stream pays one attribute read and a comparison per
message.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pykka_delivery.protocol.payload_check import PayloadCheck, payload_check
from pykka_delivery.protocol.serialization import SerializationError

__all__ = ["PayloadGate"]


class PayloadGate:
    """The payload check of one producer core.

    Args:
        owner: the core as the error's note names it ("ProducerController 'orders'").
        encoders: what encodes every payload whatever the target (the durable queue).
        enabled: False: nothing is checked (a core whose owner checks for it).

    Attributes:
        check: the check in force; None: nothing to check.
        refused: payloads refused so far.
    """

    __slots__ = ("_enabled", "_encoders", "_owner", "check", "refused")

    def __init__(self, owner: str, encoders: Sequence[object] = (), *, enabled: bool = True):
        self._owner = owner
        self._encoders = tuple(encoders)
        self._enabled = enabled
        self.refused = 0
        self.check: PayloadCheck | None = None
        self.aim(())

    def aim(self, targets: Iterable[object]) -> PayloadCheck | None:
        """Check for ``targets`` (and the encoders) from now on; returns the new check."""
        self.check = payload_check(*targets, *self._encoders) if self._enabled else None
        return self.check

    def refuse_one(self, check: PayloadCheck, payload: object) -> None:
        """`refuse` for one payload with ``check``, the core's copy of the check in force
        (the cores' per-message path: no sequence built, ``check`` read once)."""
        try:
            check.check(payload)
        except SerializationError as error:
            self._refused(error, "it")
            raise

    def refuse(
        self, payloads: Sequence[object], checked: PayloadCheck | None = None
    ) -> PayloadCheck | None:
        """Raise if one of ``payloads`` cannot be encoded; returns the check applied (None:
        nothing to check). Nothing is checked when ``checked`` is the check in force: the
        caller applied it to these payloads already.

        Raises:
            SerializationError: the serializer's, for the first payload refused, with a
                note naming the core and which payload it was.
        """
        check = self.check
        if check is None or check is checked:
            return check
        unchecked = check.unchecked
        for index, payload in enumerate(payloads):
            if type(payload) is unchecked:
                continue
            try:
                check.check(payload)
            except SerializationError as error:
                count = len(payloads)
                what = "it" if count == 1 else f"message {index + 1} of {count} (none was sent)"
                self._refused(error, what)
                raise
        return check

    def _refused(self, error: SerializationError, what: str) -> None:
        self.refused += 1
        error.add_note(
            f"{self._owner} refused {what} before numbering it: nothing was sent, and the "
            "next message takes the seq_nr it would have had"
        )
