"""The vocabulary that crosses a process boundary: what a producer side and a consumer side
tell each other, whatever carries it (a pykka actor's mailbox, a gRPC link between nodes).

Names follow Akka/Pekko Typed reliable delivery:

* `SequencedMessage` (producer side to consumer side, numbered; `SequencedRun` is a run of
  consecutive ones as a transport received them), `ChunkedMessage` (a piece of a large
  payload, carried inside a `SequencedMessage`);
* `Request`, `Resend`, `Ack`, `RegisterConsumer` (consumer side to producer side), each
  of the three but `Resend` with the consumer's fencing ``epoch``; `Fenced` (producer side
  to a consumer side of an older epoch);
* `PeerLinkChanged`, the one event a transport tells the endpoints exposed on it.

All messages are frozen, slotted dataclasses: pykka does not copy messages, so they must
be immutable. Don't subclass them.

A *ref* is anything with a `tell(message)` method: a pykka `ActorRef`, a remote reference,
or one of the handles' local endpoints. What else a recipient can do is declared, not
probed: `TakesRuns` (it accepts a `SequencedRun` whole) and `TellsMany` (it takes a batch
in one call). Messages that must never cross a process boundary (the application-facing
ones of ``pykka_delivery.delivery.messages``) are marked with `local_only`; a transport
refuses them.

This package imports nothing else of ours: it is the bottom layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = [
    "LOCAL_ONLY",
    "Ack",
    "ChunkedMessage",
    "Fenced",
    "PeerLinkChanged",
    "Ref",
    "RegisterConsumer",
    "ReportsLinkProblem",
    "Request",
    "Resend",
    "SequencedMessage",
    "SequencedRun",
    "TakesRuns",
    "TellsMany",
    "fast_frozen_init",
    "frozen_factory",
    "local_only",
    "new_sequenced_message",
    "with_link_problem",
]


_T = TypeVar("_T")


def fast_frozen_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass a faster ``__init__`` that stays frozen.

    A frozen dataclass's generated ``__init__`` sets each field through
    ``object.__setattr__``; setting the slots through their descriptors instead is about
    twice as fast (bench/RESULTS.md, "Hot paths"). Used for the few classes built once per
    message on the hot path. Fields must have no defaults.
    """
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if any(
        f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        for f in fields
    ):
        msg = f"fast_frozen_init({cls.__name__}): fields with defaults are not supported"
        raise TypeError(msg)
    names = [f.name for f in fields]
    namespace = {f"_set_{name}": cls.__dict__[name].__set__ for name in names}
    body = "".join(f"\n    _set_{name}(self, {name})" for name in names)
    exec(f"def __init__(self, {', '.join(names)}):{body}", namespace)
    init: Any = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses to assign a method
    return cls


def frozen_factory(cls: type[_T]) -> Callable[..., _T]:
    """A function that builds a frozen, slotted dataclass from its fields (positional, in
    order) about twice as fast as even a `fast_frozen_init` ``__init__``.

    It fills an instance of an unfrozen twin class with the same slots by plain attribute
    assignment (the fast path of the interpreter), then makes it an instance of ``cls``
    (``__class__`` assignment: the layouts are the same). The result is an ordinary,
    frozen ``cls`` instance (about half the cost again: bench/RESULTS.md, "Hot paths").
    For the few classes built once per message on the hot path.
    """
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    slots = tuple(cls.__slots__)  # type: ignore[attr-defined]
    if sorted(slots) != sorted(names):
        msg = f"frozen_factory({cls.__name__}): the slots must be the dataclass fields"
        raise TypeError(msg)
    twin = type(f"_{cls.__name__}Builder", (), {"__slots__": slots})
    namespace: dict[str, Any] = {"_new": object.__new__, "_twin": twin, "_cls": cls}
    body = "".join(f"\n    self.{name} = {name}" for name in names)
    exec(
        f"def new_{cls.__name__}({', '.join(names)}):\n    self = _new(_twin){body}"
        "\n    self.__class__ = _cls\n    return self",
        namespace,
    )
    factory: Callable[..., _T] = namespace[f"new_{cls.__name__}"]
    return factory


@runtime_checkable
class Ref(Protocol):
    """Where a message can be sent: anything with ``tell``."""

    def tell(self, message: Any) -> None: ...


@runtime_checkable
class TellsMany(Ref, Protocol):
    """A recipient that takes a transport's whole batch in one call (one append, at most
    one wake-up) instead of one `tell` per message."""

    def tell_many(self, messages: list[Any]) -> None: ...


@runtime_checkable
class TakesRuns(Ref, Protocol):
    """A recipient that accepts `SequencedRun` objects whole (the consumer handles): a
    transport hands it a batch with each run as it decoded it, and every other recipient
    the runs' messages one by one."""

    def tell_runs(self, messages: list[Any]) -> None:
        """Like ``tell_many``, but ``messages`` may hold `SequencedRun` objects."""
        ...


@runtime_checkable
class ReportsLinkProblem(Ref, Protocol):
    """A ref behind a link that can say why the link is down (a transport's remote ref):
    what a handle's timeout names, so a wrong address or token shows as such."""

    def link_problem(self) -> str | None:
        """A sentence on why messages are not getting through, or None."""
        ...


def with_link_problem(msg: str, ref: object) -> str:
    """``msg``, followed by why the link behind ``ref`` is down when ``ref`` can say (a
    `ReportsLinkProblem`): what a timeout adds so that a wrong address or token shows."""
    problem = ref.link_problem() if isinstance(ref, ReportsLinkProblem) else None
    return msg if problem is None else f"{msg}; {problem}"


LOCAL_ONLY: set[type] = set()
"""The message types that never cross a process boundary (see `local_only`)."""


def local_only(cls: type[_T]) -> type[_T]:
    """Mark ``cls`` as a message that stays in its process (the application-facing
    messages, as in Akka): a transport refuses to encode it, whatever the serializers."""
    LOCAL_ONLY.add(cls)
    return cls


# --- wire messages ---------------------------------------------------------------------


@local_only  # travels only inside a SequencedMessage
@dataclass(frozen=True, slots=True)
class ChunkedMessage:
    """One piece of a payload larger than ``chunk_large_messages`` bytes.

    The payload is serialized once and cut into pieces; each piece takes its own seq_nr.
    The consumer side joins the pieces and deserializes with the last piece's
    ``serializer_id`` and ``manifest``.
    """

    data: bytes
    first_chunk: bool
    last_chunk: bool
    serializer_id: int
    manifest: str


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class SequencedMessage:
    """A message numbered by the producer controller, sent to the consumer controller.

    ``first`` marks the first message of a session between one producer controller and one
    consumer controller. ``ack`` asks the consumer controller for an `Ack` once the consumer
    confirmed it (set for `MessageWithConfirmation`). ``producer_controller`` is where the
    consumer side answers; as in Akka, it takes no part in equality.
    """

    producer_id: str
    seq_nr: int
    message: Any
    first: bool
    ack: bool
    producer_controller: Ref = field(compare=False, repr=False)

    def as_first(self) -> SequencedMessage:
        """The same message marked as the first of a session."""
        if self.first:
            return self
        return SequencedMessage(
            self.producer_id, self.seq_nr, self.message, True, self.ack, self.producer_controller
        )

    @property
    def is_first_chunk(self) -> bool:
        """True for the first piece of a chunked message, and for any message not chunked."""
        message = self.message
        return not isinstance(message, ChunkedMessage) or message.first_chunk

    @property
    def is_last_chunk(self) -> bool:
        """True for the last piece of a chunked message, and for any message not chunked."""
        message = self.message
        return not isinstance(message, ChunkedMessage) or message.last_chunk


class SequencedRun:
    """Consecutive plain `SequencedMessage` objects of one producer controller, as a
    transport received them in one run (``SequencedRun`` in ``delivery.proto``): their
    messages and the first seq_nr, with no `SequencedMessage` object built per message.

    Only the consumer handles take runs (their endpoints are `TakesRuns`); a transport
    hands every other recipient the run's messages (`expand`). A run is also a
    cursor, and not thread-safe: `take` hands out its next message. Until the next `take`
    the run reads as that message's `SequencedMessage` (``producer_id``, ``seq_nr``,
    ``message``, ``first``, ``ack``, ``producer_controller``), so a consumer core keeps the
    run itself as the delivery awaiting confirmation; it takes the next message only once
    that one is confirmed.
    """

    __slots__ = (
        "first_seq_nr",
        "last_seq_nr",
        "message",
        "messages",
        "producer_controller",
        "producer_id",
        "seq_nr",
    )

    first = False  # a run never holds a session's first message, a chunk, or an ack request
    ack = False

    def __init__(
        self, producer_id: str, first_seq_nr: int, messages: list[Any], producer_controller: Ref
    ) -> None:
        self.producer_id = producer_id
        self.producer_controller = producer_controller
        self.messages = messages
        self.first_seq_nr = first_seq_nr
        self.last_seq_nr = first_seq_nr + len(messages) - 1
        self.seq_nr = first_seq_nr - 1  # of the message taken last
        self.message: Any = None

    def __repr__(self) -> str:
        return f"SequencedRun({self.producer_id!r}, {self.seq_nr + 1}..{self.last_seq_nr})"

    @property
    def remaining(self) -> int:
        """How many messages were not taken yet (none once ``seq_nr == last_seq_nr``)."""
        return self.last_seq_nr - self.seq_nr

    def take(self) -> Any:
        """The next message (there must be one); ``seq_nr`` and ``message`` become its."""
        self.seq_nr = seq_nr = self.seq_nr + 1
        self.message = message = self.messages[seq_nr - self.first_seq_nr]
        return message

    def expand(self) -> list[SequencedMessage]:
        """The messages not taken yet, as `SequencedMessage` objects."""
        pid = self.producer_id
        ref = self.producer_controller
        new = new_sequenced_message
        return [
            new(pid, seq_nr, message, False, False, ref)
            for seq_nr, message in enumerate(
                self.messages[self.seq_nr + 1 - self.first_seq_nr :], self.seq_nr + 1
            )
        ]


@dataclass(frozen=True, slots=True)
class Request:
    """Consumer side to producer side: confirmed up to, and send up to (inclusive).

    ``support_resend`` is False in only-flow-control mode. ``via_timeout`` marks a retry
    sent because nothing arrived; the producer side then resends everything unconfirmed.
    ``epoch`` is the consumer's fencing epoch (0: none): the producer side ignores a
    `Request` of an epoch lower than the highest it serves.
    """

    confirmed_seq_nr: int
    request_up_to_seq_nr: int
    support_resend: bool = True
    via_timeout: bool = False
    epoch: int = 0

    def __post_init__(self) -> None:
        if self.confirmed_seq_nr > self.request_up_to_seq_nr:
            msg = (
                f"Request confirmed_seq_nr {self.confirmed_seq_nr} is above "
                f"request_up_to_seq_nr {self.request_up_to_seq_nr}: a consumer can only "
                "confirm what it was allowed to receive"
            )
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class Resend:
    """Consumer side detected a gap: resend every unconfirmed message from ``from_seq_nr``.

    ``Resend(0)`` comes from a consumer controller that never saw this producer controller's
    first message: resend everything, the head marked as first.
    """

    from_seq_nr: int


@dataclass(frozen=True, slots=True)
class Ack:
    """Consumer side confirms up to ``confirmed_seq_nr`` without asking for more
    (``epoch``: as in `Request`)."""

    confirmed_seq_nr: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class RegisterConsumer:
    """Connect a consumer controller to a producer controller (from either side).

    ``epoch`` is the consumer's fencing epoch (0: none): the producer side refuses one
    lower than the highest it has seen (and answers `Fenced`), and takes one at least as
    high as its new highest.
    """

    consumer_controller: Ref
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Fenced:
    """Producer side to a consumer side of an older fencing epoch: it was shut out.

    ``epoch`` is the highest epoch the producer ``producer_id`` serves. A consumer side
    whose own epoch is lower stops delivering; one whose epoch is at least as high ignores
    it (it was sent before that consumer registered).
    """

    epoch: int
    producer_id: str


# Fast builders of the two classes built once per message (see frozen_factory).
new_sequenced_message: Callable[[str, int, Any, bool, bool, Ref], SequencedMessage] = (
    frozen_factory(SequencedMessage)
)


# --- transport events ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerLinkChanged:
    """The transport's link to the node at ``peer`` (``host:port``) came up or went down.

    A node tells it to everything exposed on it. Controllers keep every unconfirmed message
    either way; when the link to their peer comes back, a consumer controller retries at
    once instead of waiting for its retry timer.
    """

    peer: str
    up: bool
