"""Every metric `DeliveryCollector` exports: name, type, help text, labels.

Counter names are written without their ``_total`` suffix, which prometheus-client adds to
the samples. docs/metrics.md lists the same table for readers.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SPECS", "Spec"]

_NODE = ("node",)
_LINK = ("node", "peer")
_PRODUCER = ("producer_id",)
_CONSUMER = ("consumer", "producer_id")
_COORDINATOR = ("coordinator",)
_LAG = ("coordinator", "namespace", "stream", "group", "partition", "producer_id")


@dataclass(frozen=True, slots=True)
class Spec:
    """One metric: ``kind`` is ``"counter"``, ``"gauge"`` or ``"histogram"``."""

    name: str
    kind: str
    doc: str
    labels: tuple[str, ...]


def _counter(name: str, doc: str, labels: tuple[str, ...]) -> Spec:
    return Spec(f"pykka_delivery_{name}", "counter", doc, labels)


def _gauge(name: str, doc: str, labels: tuple[str, ...]) -> Spec:
    return Spec(f"pykka_delivery_{name}", "gauge", doc, labels)


SPECS: tuple[Spec, ...] = (
    # --- nodes (transport) -------------------------------------------------------------
    _counter("node_frames_sent", "Frames written to links.", _NODE),
    _counter("node_frames_received", "Frames read from links.", _NODE),
    _counter(
        "node_envelopes_sent", "Messages written to links (each message of a run once).", _NODE
    ),
    _counter("node_envelopes_received", "Messages read from links.", _NODE),
    _counter("node_links_opened", "Links established, dialled or accepted.", _NODE),
    _counter("node_links_lost", "Links broken.", _NODE),
    _counter(
        "node_dropped",
        "Messages dropped: outbox_full (a disconnected peer's outbox was full), unsendable "
        "(could not be encoded, or above max_message_bytes).",
        (*_NODE, "reason"),
    ),
    _counter(
        "node_lost_in_flight",
        "Messages in frames whose write failed (the delivery protocol resends them).",
        _NODE,
    ),
    _counter("node_malformed", "Received envelopes or frames that could not be decoded.", _NODE),
    _counter(
        "node_unknown_target", "Received messages for a name nothing is exposed under.", _NODE
    ),
    _counter(
        "node_rejected_links",
        "Links refused (a wrong token, no hello, or with mutual TLS an address the peer's "
        "certificate does not name).",
        _NODE,
    ),
    # --- links: one series per peer node -------------------------------------------------
    _counter("link_frames_sent", "Frames written to the peer.", _LINK),
    _counter("link_bytes_sent", "Encoded bytes of the frames written to the peer.", _LINK),
    _counter("link_frames_received", "Frames read from the peer.", _LINK),
    _counter("link_reconnects", "Links to the peer opened after the first one.", _LINK),
    _counter("link_losses", "Links to the peer broken.", _LINK),
    _gauge("link_up", "1 while a link to the peer is open, else 0.", _LINK),
    # --- producers -----------------------------------------------------------------------
    _counter("messages_sent", "Messages (or chunks) sent for the first time.", _PRODUCER),
    _counter(
        "messages_resent",
        "Messages (or chunks) sent again (Resend, retries, first-message resends).",
        _PRODUCER,
    ),
    _counter(
        "messages_refused",
        "Messages refused when sent: their payload cannot be encoded for the consumer "
        "side's transport or the durable queue.",
        _PRODUCER,
    ),
    _counter("messages_stored", "Messages (or chunks) handed to the durable queue.", _PRODUCER),
    _counter(
        "messages_lost_on_close",
        "Messages unconfirmed when the producer was closed without a durable queue.",
        _PRODUCER,
    ),
    _counter(
        "producer_protocol_errors", "Inputs the producer refused as protocol misuse.", _PRODUCER
    ),
    _counter(
        "producer_fenced",
        "Registrations, requests and acks of a consumer of an older fencing epoch, refused "
        "and answered Fenced.",
        _PRODUCER,
    ),
    _gauge(
        "producer_stuck",
        "Messages unconfirmed longer than stuck_after at the last check.",
        _PRODUCER,
    ),
    _gauge("producer_in_flight", "Messages sent and not confirmed yet.", _PRODUCER),
    _gauge(
        "producer_window",
        "The consumer side's window: seq_nrs it asked for beyond the last confirmed one.",
        _PRODUCER,
    ),
    _gauge(
        "producer_oldest_unconfirmed_age_seconds",
        "Age of the oldest unconfirmed message, measured at scrapes (at most one scrape "
        "interval low; 0 at the first scrape that sees it).",
        _PRODUCER,
    ),
    # --- consumers -----------------------------------------------------------------------
    _counter("messages_delivered", "Deliveries handed to the consumer.", _CONSUMER),
    _counter("messages_confirmed", "Deliveries the consumer confirmed.", _CONSUMER),
    _counter("messages_rejected", "Deliveries the consumer rejected.", _CONSUMER),
    _counter(
        "messages_redelivered", "Rejected deliveries delivered again after a backoff.", _CONSUMER
    ),
    _counter(
        "messages_dead_lettered",
        "Messages written to the dead letters after max_attempts rejections.",
        _CONSUMER,
    ),
    _counter(
        "consumer_duplicates",
        "Messages received again and not delivered (the deduplication store's included).",
        _CONSUMER,
    ),
    _counter("consumer_gaps", "Gaps detected (a Resend sent).", _CONSUMER),
    _gauge("consumer_in_flight", "Messages received and not confirmed yet.", _CONSUMER),
    _gauge(
        "consumer_window",
        "Seq_nrs this consumer asked for beyond the last one it confirmed.",
        _CONSUMER,
    ),
    # --- coordinator servers -------------------------------------------------------------
    _counter(
        "coordinator_streams_attached", "Client streams that said hello and attached.", _COORDINATOR
    ),
    _counter(
        "coordinator_streams_ended",
        "Client streams that ended: goodbye (consumers removed) or lost (kept, disconnected).",
        (*_COORDINATOR, "how"),
    ),
    _counter(
        "coordinator_probes",
        "Liveness probes of lost connections' processes, by verdict: gone (handed over at "
        "once), alive (stream cut), no_answer (maybe a partition).",
        (*_COORDINATOR, "verdict"),
    ),
    _counter(
        "coordinator_rejected",
        "Streams and queries refused (authentication, no hello first, malformed).",
        _COORDINATOR,
    ),
    _counter(
        "coordinator_malformed", "Streams ended by a message that did not parse.", _COORDINATOR
    ),
    _counter(
        "coordinator_requests",
        "Register, unregister and activate requests answered.",
        _COORDINATOR,
    ),
    _counter("coordinator_updates_sent", "Consumer updates written to streams.", _COORDINATOR),
    _gauge("coordinator_groups", "Groups (each has at least one consumer).", _COORDINATOR),
    _gauge(
        "coordinator_consumers",
        "Consumers by state: active (or stepping down), waiting, disconnected (not yet "
        "presumed down), presumed_down.",
        (*_COORDINATOR, "state"),
    ),
    _counter(
        "coordinator_rebalances",
        "Activations: times a consumer was made its group's active one.",
        _COORDINATOR,
    ),
    _counter("coordinator_commands_applied", "Commands that changed the state.", _COORDINATOR),
    _counter("coordinator_commands_refused", "Commands the state machine refused.", _COORDINATOR),
    Spec(
        "pykka_delivery_coordinator_handover_duration_seconds",
        "histogram",
        "Hand-overs, from the decision (step-down sent, active consumer presumed down or "
        "gone) to the next activation.",
        _COORDINATOR,
    ),
    # --- lag, as producers and consumers report it to a coordinator ----------------------
    _gauge("lag_in_flight", "Messages sent and not confirmed, per group and producer.", _LAG),
    _gauge(
        "lag_oldest_unconfirmed_age_seconds",
        "Age of the oldest unconfirmed message, as of the producer's last report.",
        _LAG,
    ),
)
