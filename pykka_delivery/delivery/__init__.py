"""Reliable delivery between one producer and one consumer, in layers (docs/delivery.md).

* ``core``: pure state machines, `ProducerCore`, `ConsumerCore`, `WorkPullingCore`
  (messages in, effects out).
* ``session``: the one interpreter of a core's effects per side, no waiting, no threads.
* ``actors``: pykka actors around the sessions, `ProducerController`, `ConsumerController`.
* ``handles``: for code that is not an actor, `Producer`, `Consumer`, and their asyncio
  flavours `AsyncProducer`, `AsyncConsumer`: only the waiting around a session.
* Nothing lost when a process dies: the durable producer queue (`SqliteDurableQueue`,
  `MemoryDurableQueue`), the consumer's deduplication store (`SqliteDedupStore`,
  `MemoryDedupStore`), dead letters for rejected messages (`SqliteDeadLetters`,
  `ProducerDeadLetters`); their PostgreSQL twins (the ``[postgres]`` extra) are imported
  from ``stores/*_postgres.py`` (docs/backends.md).
* Work pulling: `WorkPullingProducerController` spreads a producer's messages over the
  workers registered under a service key (`LocalServiceRegistry` in one process).
"""

from pykka_delivery.delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.delivery.actors.producer_controller import ProducerController
from pykka_delivery.delivery.actors.work_pulling import WorkPullingProducerController
from pykka_delivery.delivery.core.consumer import ConsumerCore, ConsumerPhase, ConsumerStats
from pykka_delivery.delivery.core.producer import ProducerCore, ProducerPhase, ProducerStats
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
    WorkPullingSettings,
)
from pykka_delivery.delivery.handles.async_consumer import AsyncConsumer
from pykka_delivery.delivery.handles.async_producer import AsyncProducer
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.handles.fan_in import FanInConsumer, FanInSettings, FanInStats
from pykka_delivery.delivery.handles.merged import MergedConsumer, ProducerSet
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.handles.work_pulling import WorkPullingProducer
from pykka_delivery.delivery.messages import (
    CONFIRMED,
    Confirmed,
    ConsumerStart,
    DeliverThenStop,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    RegisterToProducerController,
    Rejected,
    RequestNext,
)
from pykka_delivery.delivery.registry import LocalServiceRegistry, ServiceRegistry, default_registry
from pykka_delivery.delivery.stores.dead_letters import (
    DeadLetter,
    DeadLetterDestination,
    DeadLetterError,
    MemoryDeadLetters,
    ProducerDeadLetters,
    SqliteDeadLetters,
)
from pykka_delivery.delivery.stores.dedup import (
    DedupStore,
    DedupStoreError,
    MemoryDedupStore,
    SqliteDedupSettings,
    SqliteDedupStore,
)
from pykka_delivery.delivery.stores.dedup_tx import (
    AlreadyApplied,
    SqliteTxDedupSettings,
    SqliteTxDedupStore,
    TxDedupStore,
)
from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_queue import (
    NO_QUALIFIER,
    DurableProducerQueue,
    DurableProducerState,
    DurableQueueError,
    MessageSent,
)
from pykka_delivery.delivery.stores.durable_sqlite import SqliteDurableQueue, SqliteQueueSettings
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol.messages import (
    Ack,
    ChunkedMessage,
    Ref,
    RegisterConsumer,
    Request,
    Resend,
    SequencedMessage,
)

__all__ = [
    "CONFIRMED",
    "NO_QUALIFIER",
    "Ack",
    "AlreadyApplied",
    "AsyncConsumer",
    "AsyncProducer",
    "ChunkedMessage",
    "Confirmed",
    "Consumer",
    "ConsumerController",
    "ConsumerControllerSettings",
    "ConsumerCore",
    "ConsumerPhase",
    "ConsumerStart",
    "ConsumerStats",
    "DeadLetter",
    "DeadLetterDestination",
    "DeadLetterError",
    "DedupStore",
    "DedupStoreError",
    "DeliverThenStop",
    "Delivery",
    "DurableProducerQueue",
    "DurableProducerState",
    "DurableQueueError",
    "FanInConsumer",
    "FanInSettings",
    "FanInStats",
    "LocalServiceRegistry",
    "MemoryDeadLetters",
    "MemoryDedupStore",
    "MemoryDurableQueue",
    "MergedConsumer",
    "MessageSent",
    "MessageWithConfirmation",
    "Producer",
    "ProducerController",
    "ProducerControllerSettings",
    "ProducerCore",
    "ProducerDeadLetters",
    "ProducerPhase",
    "ProducerSet",
    "ProducerStart",
    "ProducerStats",
    "Ref",
    "RegisterConsumer",
    "RegisterToProducerController",
    "Rejected",
    "Request",
    "RequestNext",
    "Resend",
    "SequencedMessage",
    "ServiceRegistry",
    "SqliteDeadLetters",
    "SqliteDedupSettings",
    "SqliteDedupStore",
    "SqliteDurableQueue",
    "SqliteQueueSettings",
    "SqliteTxDedupSettings",
    "SqliteTxDedupStore",
    "TimerService",
    "TxDedupStore",
    "WorkPullingProducer",
    "WorkPullingProducerController",
    "WorkPullingSettings",
    "default_registry",
]
