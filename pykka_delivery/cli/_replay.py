"""Replaying dead letters through a producer stream (``dead-letters replay``).

A `Producer` on a `Node` of the command's own delivers to the consumer at the target
address. Letters go in batches: a batch is sent, then its confirmations are waited for,
and only the letters whose seq_nr the consumer confirmed are deleted from the file. If
the consumer goes quiet, the confirmed part is deleted and the rest stays for another
replay: nothing the store held is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from pykka_delivery.cli._errors import CommandError
from pykka_delivery.cli._options import Security
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.stores.dead_letters import StoredDeadLetter, StoredDeadLetters
from pykka_delivery.errors import DeliveryError, DeliveryTimeout
from pykka_delivery.transport.node import Node
from pykka_delivery.transport.settings import NodeSettings

__all__ = ["Replay", "node_settings"]

logger = logging.getLogger("pykka_delivery.cli")


def node_settings(bind: str, security: Security) -> NodeSettings:
    """The replay node's settings: bound to ``bind`` (host:port), with the token and TLS
    given."""
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit():
        msg = f"--bind must be host:port (port 0 for any free one), got {bind!r}"
        raise CommandError(msg)
    return NodeSettings(host=host, port=int(port), token=security.token, tls=security.tls)


@dataclass(slots=True)
class Replay:
    """One replay: where to, under which producer id, and the ids replayed so far."""

    store: StoredDeadLetters
    target: str
    producer_id: str
    batch: int
    timeout: float
    replayed: list[int] = field(default_factory=list)

    def run(self, letters: Sequence[StoredDeadLetter], settings: NodeSettings) -> None:
        """Send ``letters`` in order; each is deleted once confirmed.

        Raises:
            CommandError: some were not confirmed (or could not be sent); they stay.
        """
        with Node(settings) as node:
            producer = Producer(self.producer_id, self_ref_factory=node.expose(self.producer_id))
            try:
                producer.register_consumer(node.ref(self.target))
                for start in range(0, len(letters), self.batch):
                    self._send(producer, letters[start : start + self.batch], len(letters))
            finally:
                producer.close()

    def _send(self, producer: Producer, batch: Sequence[StoredDeadLetter], total: int) -> None:
        first = producer.snapshot().current_seq_nr
        failure: Exception | None = None
        try:
            producer.send_many([s.letter.message for s in batch], timeout=self.timeout)
        except (DeliveryError, ValueError) as error:
            failure = error
        if not isinstance(failure, DeliveryTimeout):
            try:
                producer.wait_confirmed(timeout=self.timeout)
            except DeliveryTimeout as error:
                failure = failure or error
        confirmed = producer.snapshot().confirmed_seq_nr
        done = [s.id for i, s in enumerate(batch) if first + i <= confirmed]
        self.store.delete(done)
        self.replayed += done
        logger.info("Replayed %d dead letter(s) to %s", len(done), self.target)
        if failure is not None:
            left = total - len(self.replayed)
            msg = (
                f"replayed {len(self.replayed)} of {total} dead letter(s) to {self.target}; "
                f"the other {left} stay in {self.store!r}: {failure} (check that a "
                "consumer is exposed at --to and confirms, then replay again)"
            )
            raise CommandError(msg) from failure
