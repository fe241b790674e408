"""pykka-delivery: reliable, flow-controlled delivery between Python actors.

A port of Akka/Pekko Typed reliable delivery to pykka actors, protobuf and gRPC. Start
with `Producer` / `Consumer` (handles for plain code) or `ProducerController` /
`ConsumerController` (pykka actors).
"""

import logging
from importlib.metadata import PackageNotFoundError, version

from pykka_delivery.delivery import (
    CONFIRMED,
    AlreadyApplied,
    AsyncConsumer,
    AsyncProducer,
    Confirmed,
    Consumer,
    ConsumerController,
    ConsumerControllerSettings,
    DeadLetterError,
    DedupStoreError,
    DeliverThenStop,
    Delivery,
    DurableQueueError,
    MemoryDurableQueue,
    MergedConsumer,
    MessageWithConfirmation,
    Producer,
    ProducerController,
    ProducerControllerSettings,
    ProducerSet,
    Ref,
    RegisterConsumer,
    RegisterToProducerController,
    Rejected,
    RequestNext,
    SqliteDeadLetters,
    SqliteDedupStore,
    SqliteDurableQueue,
    SqliteTxDedupStore,
    WorkPullingProducer,
    WorkPullingProducerController,
    WorkPullingSettings,
)
from pykka_delivery.errors import (
    ClosedError,
    ConsumerFenced,
    DeliveryError,
    DeliveryTimeout,
    LocalProtocolError,
    WouldBlock,
)
from pykka_delivery.transport.local import LossyRef

__all__ = [
    "CONFIRMED",
    "AlreadyApplied",
    "AsyncConsumer",
    "AsyncProducer",
    "ClosedError",
    "Confirmed",
    "Consumer",
    "ConsumerController",
    "ConsumerControllerSettings",
    "ConsumerFenced",
    "DeadLetterError",
    "DedupStoreError",
    "DeliverThenStop",
    "Delivery",
    "DeliveryError",
    "DeliveryTimeout",
    "DurableQueueError",
    "LocalProtocolError",
    "LossyRef",
    "MemoryDurableQueue",
    "MergedConsumer",
    "MessageWithConfirmation",
    "Producer",
    "ProducerController",
    "ProducerControllerSettings",
    "ProducerSet",
    "Ref",
    "RegisterConsumer",
    "RegisterToProducerController",
    "Rejected",
    "RequestNext",
    "SqliteDeadLetters",
    "SqliteDedupStore",
    "SqliteDurableQueue",
    "SqliteTxDedupStore",
    "WorkPullingProducer",
    "WorkPullingProducerController",
    "WorkPullingSettings",
    "WouldBlock",
    "__version__",
]

try:
    __version__ = version("pykka-delivery")
    """The installed distribution's version (``pyproject.toml``)."""
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

logging.getLogger("pykka_delivery").addHandler(logging.NullHandler())
