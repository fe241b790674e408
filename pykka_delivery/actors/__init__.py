"""Reliable delivery between one producer and one consumer: cores, actors and handles.

* Pure state machines: `ProducerCore`, `ConsumerCore` (messages in, effects out).
* pykka actors running them: `ProducerController`, `ConsumerController`.
* Handles for code that is not an actor: `Producer`, `Consumer`, and their asyncio
  flavours `AsyncProducer`, `AsyncConsumer`.
* Nothing lost when a process dies: the durable producer queue (`SqliteDurableQueue`,
  `MemoryDurableQueue`), the consumer's deduplication store (`SqliteDedupStore`,
  `MemoryDedupStore`), dead letters for rejected messages (`SqliteDeadLetters`,
  `ProducerDeadLetters`).
* Work pulling: `WorkPullingProducerController` spreads a producer's messages over the
  workers registered under a service key (`LocalServiceRegistry` in one process).
"""

from pykka_delivery.actors.async_handles import AsyncConsumer, AsyncProducer
from pykka_delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.actors.consumer_core import ConsumerCore, ConsumerPhase, ConsumerStats
from pykka_delivery.actors.consumer_handle import Consumer
from pykka_delivery.actors.dead_letters import (
    DeadLetter,
    DeadLetterDestination,
    DeadLetterError,
    MemoryDeadLetters,
    ProducerDeadLetters,
    SqliteDeadLetters,
)
from pykka_delivery.actors.dedup import (
    DedupStore,
    DedupStoreError,
    MemoryDedupStore,
    SqliteDedupSettings,
    SqliteDedupStore,
)
from pykka_delivery.actors.durable_memory import MemoryDurableQueue
from pykka_delivery.actors.durable_queue import (
    NO_QUALIFIER,
    DurableProducerQueue,
    DurableProducerState,
    DurableQueueError,
    MessageSent,
)
from pykka_delivery.actors.durable_sqlite import SqliteDurableQueue, SqliteQueueSettings
from pykka_delivery.actors.fan_in import FanInConsumer, FanInSettings, FanInStats
from pykka_delivery.actors.messages import (
    CONFIRMED,
    Ack,
    ChunkedMessage,
    Confirmed,
    ConsumerStart,
    DeliverThenStop,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    Ref,
    RegisterConsumer,
    RegisterToProducerController,
    Rejected,
    Request,
    RequestNext,
    Resend,
    SequencedMessage,
)
from pykka_delivery.actors.producer_controller import ProducerController
from pykka_delivery.actors.producer_core import ProducerCore, ProducerPhase, ProducerStats
from pykka_delivery.actors.producer_handle import Producer
from pykka_delivery.actors.registry import LocalServiceRegistry, ServiceRegistry, default_registry
from pykka_delivery.actors.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
    WorkPullingSettings,
)
from pykka_delivery.actors.timers import TimerService
from pykka_delivery.actors.work_pulling import WorkPullingProducerController
from pykka_delivery.actors.work_pulling_handle import WorkPullingProducer

__all__ = [
    "CONFIRMED",
    "NO_QUALIFIER",
    "Ack",
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
    "MessageSent",
    "MessageWithConfirmation",
    "Producer",
    "ProducerController",
    "ProducerControllerSettings",
    "ProducerCore",
    "ProducerDeadLetters",
    "ProducerPhase",
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
    "TimerService",
    "WorkPullingProducer",
    "WorkPullingProducerController",
    "WorkPullingSettings",
    "default_registry",
]
