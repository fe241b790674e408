"""`GroupConsumer`: one process's member of a consumer group on every stream it follows.

A group may follow several streams, named or by pattern (``"orders.*"``). The consumer
watches each pattern in the coordinator's stream catalog and runs one `GroupMember` per
matching stream, each finding the stream's producers in the catalog; a stream created
later that matches is picked up when the coordinator pushes it. Members are made on a
thread of the consumer's own (a listing arrives on the client's thread, which must not
block, and a member registers every partition before it is made); one that fails to be
made is tried again after a backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pykka_delivery.coordinator import CatalogStream, CoordinatorClient, check_stream_pattern
from pykka_delivery.errors import ClosedError, DeliveryError, DeliveryTimeout
from pykka_delivery.partitions._catalog_watches import watch_catalog
from pykka_delivery.partitions.group import GroupMember
from pykka_delivery.partitions.records import GroupDelivery, GroupMemberSettings
from pykka_delivery.retry import Backoff

if TYPE_CHECKING:
    from pykka_delivery.transport.node import Node

__all__ = ["GroupConsumer"]

logger = logging.getLogger("pykka_delivery.partitions")


class GroupConsumer:
    """This process's member of ``group`` on every stream of the catalog matching
    ``streams``::

        consumer = GroupConsumer(client, "billing", ["orders.*", "payments"], handler=handle,
                                 node=node)
        ...
        consumer.close()

    Args:
        client: the process's connection to the coordinator.
        group: the consumer group's name.
        streams: stream names or patterns (``*``, ``?``, ``[...]``), or one of them.
        handler: called with each `GroupDelivery` (its ``stream`` says which), as a
            `GroupMember`'s handler.
        node: this process's transport node (the producers reach the members there).
        catalog_namespace: the streams' namespace in the catalog. Default ``""``.
        settings: every member's settings; its ``retry_backoff_min`` / ``_max`` also
            pace the attempts to make a member that failed.
        member_options: further keywords of every `GroupMember` (``namespace``,
            ``dedup_store``, ``serialization``, hooks, ...).

    Raises:
        ValueError: a bad group name or pattern, or no streams.
        ConnectionRejected, DeliveryTimeout, ClosedError: a watch could not be made.
    """

    def __init__(
        self,
        client: CoordinatorClient,
        group: str,
        streams: str | Sequence[str],
        *,
        handler: Callable[[GroupDelivery], None],
        node: Node,
        catalog_namespace: str = "",
        settings: GroupMemberSettings | None = None,
        **member_options: Any,
    ) -> None:
        patterns = (streams,) if isinstance(streams, str) else tuple(streams)
        if not patterns:
            msg = f"GroupConsumer {group!r}: give at least one stream name or pattern"
            raise ValueError(msg)
        for pattern in patterns:
            check_stream_pattern(pattern)
        self.group = group
        self.patterns = patterns
        self.settings = settings = settings or GroupMemberSettings()
        self._client = client
        self._make: Callable[[str, int], GroupMember] = lambda stream, partitions: GroupMember(
            client,
            stream,
            partitions,
            group,
            handler=handler,
            node=node,
            catalog_namespace=catalog_namespace,
            settings=settings,
            **member_options,
        )
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._listed: dict[str, int] = {}  # stream -> partitions, every pattern together
        self._members: dict[str, GroupMember] = {}
        self._closed = False
        self.errors: list[BaseException] = []
        """Failed attempts to make a member, oldest first (each was tried again)."""
        self._thread = threading.Thread(
            target=self._run, name=f"group-consumer-{group}", daemon=True
        )
        self._thread.start()
        self._stops: list[Callable[[], None]] = []
        try:
            for pattern in patterns:
                self._stops.append(
                    watch_catalog(
                        client,
                        pattern,
                        self._on_catalog,
                        namespace=catalog_namespace,
                        timeout=settings.registration_timeout,
                    )
                )
        except BaseException:
            self.close()
            raise

    def members(self) -> dict[str, GroupMember]:
        """The member of each stream followed now, by stream name."""
        with self._lock:
            return dict(self._members)

    def streams(self) -> tuple[str, ...]:
        """The streams followed now, sorted."""
        with self._lock:
            return tuple(sorted(self._members))

    def wait_for_streams(self, names: Sequence[str], timeout: float | None = None) -> None:
        """Block until every stream of ``names`` has its member.

        Raises:
            DeliveryError: not within ``timeout`` (``DeliveryTimeout``), or closed.
        """
        with self._lock:
            if not self._changed.wait_for(
                lambda: self._closed or all(n in self._members for n in names), timeout
            ):
                missing = sorted(set(names) - set(self._members))
                msg = f"GroupConsumer {self.group!r}: no member of {missing} within {timeout} s"
                raise DeliveryTimeout(msg)
            if self._closed:
                msg = f"GroupConsumer {self.group!r} is closed"
                raise ClosedError(msg)

    def close(self, grace: float | None = None) -> None:
        """Stop following the catalog and close every member (each leaves gracefully:
        see `GroupMember.close`). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._changed.notify_all()
        for stop in self._stops:
            stop()
        if self._thread is not threading.current_thread():
            self._thread.join(self.settings.registration_timeout)
        with self._lock:
            members = list(self._members.values())
        for member in members:
            member.close(grace)

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _on_catalog(self, streams: tuple[CatalogStream, ...]) -> None:
        """On the client's thread: note the streams listed (never forgotten: streams of
        the catalog are never deleted) for the thread to make their members."""
        with self._lock:
            for stream in streams:
                self._listed[stream.name] = max(stream.partitions, self._listed.get(stream.name, 0))
            self._changed.notify_all()

    def _run(self) -> None:
        """Make a member for each stream listed that has none, in name order; one that
        fails does not hold the others: a round's failures wait a backoff together."""
        backoff = Backoff(self.settings.retry_backoff_min, self.settings.retry_backoff_max)
        delays = backoff.delays()
        while True:
            with self._lock:
                self._changed.wait_for(
                    lambda: self._closed or bool(set(self._listed) - set(self._members))
                )
                if self._closed:
                    return
                missing = sorted(
                    (n, self._listed[n]) for n in set(self._listed) - set(self._members)
                )
            failed = [
                stream for stream, partitions in missing if not self._join(stream, partitions)
            ]
            if self._closed:
                return
            if not failed:
                delays = backoff.delays()
                continue
            delay = next(delays)
            logger.warning(
                "GroupConsumer %r could not join stream(s) %s; trying again in %.3g s",
                self.group,
                failed,
                delay,
            )
            with self._lock:
                if self._changed.wait_for(lambda: self._closed, delay):
                    return

    def _join(self, stream: str, partitions: int) -> bool:
        """Make ``stream``'s member; False if that failed (kept in ``errors``)."""
        try:
            member = self._make(stream, partitions)
        except (DeliveryError, ValueError) as error:
            self.errors.append(error)
            logger.warning(
                "GroupConsumer %r: joining stream %r failed: %s", self.group, stream, error
            )
            return False
        with self._lock:
            if not self._closed:
                self._members[stream] = member
                self._changed.notify_all()
                logger.info("GroupConsumer %r follows stream %r", self.group, stream)
                return True
        member.close()  # closed meanwhile
        return True
