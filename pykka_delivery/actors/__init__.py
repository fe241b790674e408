"""Reliable delivery between one producer and one consumer: cores, actors and handles.

* Pure state machines: `ProducerCore`, `ConsumerCore` (messages in, effects out).
* pykka actors running them: `ProducerController`, `ConsumerController`.
* Handles for code that is not an actor: `Producer`, `Consumer`, and their asyncio
  flavours `AsyncProducer`, `AsyncConsumer`.
"""

from pykka_delivery.actors.async_handles import AsyncConsumer, AsyncProducer
from pykka_delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.actors.consumer_core import ConsumerCore, ConsumerPhase, ConsumerStats
from pykka_delivery.actors.consumer_handle import Consumer
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
    Request,
    RequestNext,
    Resend,
    SequencedMessage,
)
from pykka_delivery.actors.producer_controller import ProducerController
from pykka_delivery.actors.producer_core import ProducerCore, ProducerPhase, ProducerStats
from pykka_delivery.actors.producer_handle import Producer
from pykka_delivery.actors.settings import ConsumerControllerSettings, ProducerControllerSettings
from pykka_delivery.actors.timers import TimerService

__all__ = [
    "CONFIRMED",
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
    "DeliverThenStop",
    "Delivery",
    "MessageWithConfirmation",
    "Producer",
    "ProducerController",
    "ProducerControllerSettings",
    "ProducerCore",
    "ProducerPhase",
    "ProducerStart",
    "ProducerStats",
    "Ref",
    "RegisterConsumer",
    "RegisterToProducerController",
    "Request",
    "RequestNext",
    "Resend",
    "SequencedMessage",
    "TimerService",
]
