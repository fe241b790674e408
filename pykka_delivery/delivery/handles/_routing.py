"""The routing rule of the consumers that serve several producers behind one ref
(`FanInConsumer`, `MergedConsumer`): a batch is split per producer id, order kept."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from pykka_delivery.protocol.messages import (
    Fenced,
    PeerLinkChanged,
    SequencedMessage,
    SequencedRun,
)

__all__ = ["split_by_producer"]

logger = logging.getLogger("pykka_delivery.consumer")


def split_by_producer(
    messages: Iterable[Any], owner: object
) -> tuple[dict[str, list[Any]], list[PeerLinkChanged]]:
    """``messages`` sorted for routing: what one producer sent (`SequencedMessage`,
    `SequencedRun`, `Fenced`) per producer id, each list in arrival order, and the
    `PeerLinkChanged` events (for every producer's consumer). Anything else is logged,
    naming ``owner``, and dropped."""
    batches: dict[str, list[Any]] = {}
    links: list[PeerLinkChanged] = []
    for message in messages:
        kind = type(message)
        if kind is SequencedMessage or kind is SequencedRun or kind is Fenced:
            batch = batches.get(message.producer_id)
            if batch is None:
                batches[message.producer_id] = batch = []
            batch.append(message)
        elif kind is PeerLinkChanged:
            links.append(message)
        else:
            logger.warning(
                "%r cannot handle %s (only a producer's messages and PeerLinkChanged): dropped",
                owner,
                kind.__name__,
            )
    return batches, links
