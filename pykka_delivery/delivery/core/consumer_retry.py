"""A consumer core's retry timer (Pekko's ``RetryTimer``): it repeats a lost `Request`,
`Resend` or `RegisterConsumer`, first after ``resend_interval_min``, then ×1.5 per silent
retry up to ``resend_interval_max``, and back to the minimum when the flow resumes.

It also keeps which peer links went down, so that a link that comes *back* triggers a
retry at once (what was in flight when it broke is lost), while the first opening of a
link does not (retrying then would register twice and have the producer resend its whole
window). The core decides what to repeat; only this module assigns a `RetryTimer`'s fields.
"""

from __future__ import annotations

from pykka_delivery.delivery.core.effects import StartTimer
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.protocol.messages import PeerLinkChanged

__all__ = ["RETRY", "RetryTimer"]

RETRY = "retry"
"""Key of the timer that repeats Request / Resend / RegisterConsumer on silence."""


class RetryTimer:
    """The retry timer's interval, its retries, and the peer links that are down.

    ``backing_off``: the interval is above the minimum (a message arriving then resets
    it, which the core's steady-state path leaves to the general one).
    """

    __slots__ = ("_links_down", "_max", "_min", "backing_off", "interval", "retries")

    def __init__(self, settings: ConsumerControllerSettings) -> None:
        self._min = self.interval = settings.resend_interval_min
        self._max = settings.resend_interval_max
        self.backing_off = False
        self.retries = 0
        self._links_down: set[str] = set()

    def start(self) -> StartTimer:
        """Start ticking at the current interval."""
        return StartTimer(RETRY, self.interval)

    def restart(self) -> StartTimer:
        """Start again from the minimum interval (Akka's ``retryTimer.start()``)."""
        self.interval = self._min
        self.backing_off = False
        return StartTimer(RETRY, self._min)

    def back_off(self) -> StartTimer | None:
        """A retry is made: the next one after ×1.5 the interval, up to the maximum (the
        timer is restarted only if the interval changed)."""
        self.retries += 1
        interval = min(self._max, self.interval * 1.5)
        if interval == self.interval:
            return None
        self.interval = interval
        self.backing_off = interval != self._min
        return StartTimer(RETRY, interval)

    def link_came_back(self, event: PeerLinkChanged) -> bool:
        """Record a link event; True when it is a link that went down coming back up."""
        if not event.up:
            self._links_down.add(event.peer)
            return False
        if event.peer not in self._links_down:
            return False
        self._links_down.discard(event.peer)
        return True
