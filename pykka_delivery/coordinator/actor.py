"""`CoordinatorActor`: the pykka shell around the coordinator's state machine.

The actor owns the state, applies commands with `machine.apply` and carries out the
effects (STYLE.md rule 9: it never blocks on another actor):

* `SendConsumerUpdate` goes to the `ConnectionSink` attached for its connection. With none
  attached it is skipped: on `Attach` the connection is sent the current status of each of
  its consumers (active: ``active=True``, deactivating: ``active=False``), so an update
  lost to a race between a send and a reconnect is not lost for good.
* `StartTimer` / `CancelTimer` are keyed one-shot timers; a firing comes back as a message
  to the actor, which then applies the timer's `DisconnectedTimeout`.
* `CheckConnection`: a connection with a sink attached is alive (`ConnectionReconnected`);
  one without is probed when its ``Hello`` named a probe address (probe.py, the server's
  prober): a `ProbeAnswered` of `Verdict.GONE` (process gone) applies `ConnectionDown`,
  unless the connection attached again meanwhile; any other verdict applies nothing.
* `WatchConnection` / `UnwatchConnection` maintain the set of connections that have
  consumers; the sweep looks at those.

Activation changes (`activations.activation_changes` of each command that changed the
state) go to a `handovers.HandoverBook`: one INFO log line each, with structured fields
(``extra={"event": "activation", ...}``), each group's last `Handover` for `ListGroups`,
and the statistics' rebalance count and hand-over histogram.

The actor also keeps the service directory (`directory.py`: `RegisterService`,
`DeregisterService`, `WatchService`, `UnwatchService`) and the producers of the stream
catalog with their watchers (`catalog_watch.py`: `RegisterProducer`, `DeregisterProducer`,
`WatchStreams`, `UnwatchStreams`), in `_actor_directory.py`. Neither is logged (clients
register and watch again when their streams reopen). A listing goes to every watcher with
a sink after each change (a `CreateStream` that creates or grows a stream is one), and to
a connection for each key or pattern it watches when it attaches. The entries of a lost
connection leave after ``disconnected_timeout`` unless it attaches again; those of a
connection that says goodbye leave at once.

Durability: every command that changed the state is appended to the `CommandLog` before
its effects are carried out, so a crash after an update was sent never loses the change
that caused it. Refused commands and commands that leave the state as it was (a stale
timer, `Recover`, `NodeReconnected`) are not logged: replaying them changes nothing.

Group commit (`_batch.py`): told `Execute` messages are staged until the inbox is empty
or ``max_batch`` are pending, then stored with one append. Any other message (a stop,
`statistics`) first commits the pending batch: nothing outside sees a state not stored. A
`LogFencedError` (another coordinator leads) stops the actor.

Restart: the actor loads the state from its log, applies `UpdateSettings` if the settings
it was given differ from the stored ones, then `Recover`: connections are watched again,
disconnected timers re-armed, and the current updates re-sent (to sinks as they attach).

The sweep: every ``sweep_interval`` seconds, connections that have consumers but no sink,
and have had none for longer than ``settings.disconnected_timeout``, are purged
(`PurgeStaleConnections`); the others are probed (_actor_liveness.py). Without a probe
verdict, it is the only way consumers of a client that never comes back leave their
groups: a lost connection's consumers are presumed down when its timer fires, and a
connection that was connected when the coordinator stopped and never re-attaches after
the restart has no timer at all (its active consumers would block their groups).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import pykka

from pykka_delivery.coordinator._actor_directory import DIRECTORY_MESSAGES, Directories
from pykka_delivery.coordinator._actor_liveness import Liveness
from pykka_delivery.coordinator._batch import (
    DEFAULT_MAX_BATCH,
    PendingBatch,
    Staged,
    answer,
    answer_all,
    fenced_error,
    refuse_queued,
)
from pykka_delivery.coordinator.activations import activation_changes
from pykka_delivery.coordinator.actor_messages import (
    Attach,
    ConnectionSink,
    DeregisterProducer,
    DeregisterService,
    Detach,
    Execute,
    GetStatistics,
    ListGroups,
    ListStreams,
    RegisterProducer,
    RegisterService,
    ReplyTo,
    UnwatchService,
    UnwatchStreams,
    WatchService,
    WatchStreams,
)
from pykka_delivery.coordinator.catalog_watch import ProducerCatalog
from pykka_delivery.coordinator.commands import (
    Command,
    ConnectionDown,
    ConnectionLost,
    ConnectionReconnected,
    CreateStream,
    DisconnectedTimeout,
    Recover,
    Refused,
    Reply,
)
from pykka_delivery.coordinator.directory import ServiceDirectory
from pykka_delivery.coordinator.effects import (
    CancelTimer,
    CheckConnection,
    Effect,
    SendConsumerUpdate,
    StartTimer,
    UnwatchConnection,
    WatchConnection,
    activate,
    step_down,
)
from pykka_delivery.coordinator.handovers import HandoverBook
from pykka_delivery.coordinator.machine import apply
from pykka_delivery.coordinator.probe import ProbeAnswered, ProbeBook
from pykka_delivery.coordinator.queries import list_groups, list_streams, settings_change
from pykka_delivery.coordinator.state import (
    Activity,
    CoordinatorSettings,
    CoordinatorState,
    StreamId,
)
from pykka_delivery.coordinator.stats import COUNTERS, CoordinatorStats, snapshot
from pykka_delivery.coordinator.store import CommandLog, LogFencedError, MemoryCommandLog
from pykka_delivery.delivery.timers import TimerFired, Timers, TimerService

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_SWEEP_INTERVAL",
    "Attach",
    "ConnectionSink",
    "CoordinatorActor",
    "CoordinatorStats",
    "DeregisterProducer",
    "DeregisterService",
    "Detach",
    "Execute",
    "GetStatistics",
    "ListGroups",
    "ListStreams",
    "RegisterProducer",
    "RegisterService",
    "ReplyTo",
    "UnwatchService",
    "UnwatchStreams",
    "WatchService",
    "WatchStreams",
]

logger = logging.getLogger("pykka_delivery.coordinator")

DEFAULT_SWEEP_INTERVAL = 30.0
"""Seconds between two stale-connection sweeps (RabbitMQ's coordinator tick)."""

_SWEEP = "sweep"
_DISCONNECTED = "disconnected:"


# --- the actor -------------------------------------------------------------------------------


def _check_limits(sweep_interval: float, max_batch: int) -> str:
    """What is wrong with the actor's limits ("" if nothing)."""
    if not (math.isfinite(sweep_interval) and sweep_interval > 0):
        return f"sweep_interval must be finite seconds above 0, got {sweep_interval!r}"
    if type(max_batch) is not int or max_batch < 1:
        return f"max_batch must be a whole number of commands, 1 or more, got {max_batch!r}"
    return ""


def _quiet_tell(ref: pykka.ActorRef[Any]) -> Callable[[TimerFired], None]:
    def tell(message: TimerFired) -> None:
        with contextlib.suppress(pykka.ActorDeadError):  # the actor stopped: so do its timers
            ref.tell(message)

    return tell


class CoordinatorActor(Directories, Liveness, pykka.ThreadingActor):
    """Runs the coordinator's state machine, its timers, its log and its sweep.

    Args:
        log: where the state is kept; default: a `MemoryCommandLog` (no durability). The
            actor closes it when it stops, or when it fails to start.
        settings: the coordinator's settings; default: those stored in ``log`` (the
            machine's defaults for a new log). Settings that differ from the stored ones
            are applied (and logged) as `UpdateSettings` at start.
        clock: wall-clock seconds, for the ``now`` of commands; default `time.time`. (The
            sweep measures how long a connection has had no sink on `time.monotonic`.)
        timer_service: runs the timers; default: the process-wide one.
        sweep_interval: seconds between two stale-connection sweeps; default
            `DEFAULT_SWEEP_INTERVAL` (30 s).
        max_batch: the most told `Execute` commands stored with one append (group
            commit); default `DEFAULT_MAX_BATCH` (256). 1 stores each on its own.

    Raises:
        CommandLogError: from `start`, when ``log`` cannot be read.
        ValueError: ``sweep_interval`` is not a finite number above 0, or ``max_batch``
            not a whole number of 1 or more.
    """

    use_daemon_thread = True

    def __init__(
        self,
        log: CommandLog | None = None,
        settings: CoordinatorSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        timer_service: TimerService | None = None,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        super().__init__()
        problem = _check_limits(sweep_interval, max_batch)
        if problem:
            if log is not None:
                log.close()  # the actor owns the log: if it does not start, nobody closes it
            raise ValueError(problem)
        self._log: CommandLog = MemoryCommandLog() if log is None else log
        self._clock = clock
        # The sweep's own reckoning: monotonic, so that a step of the wall clock (NTP, a
        # resumed VM) never makes a connection look stale early.
        self._monotonic: Callable[[], float] = time.monotonic
        self._sweep_interval = sweep_interval
        self._max_batch = max_batch
        self._batch = PendingBatch()
        self._fenced = False  # the log refused an append: another coordinator leads
        self._timers = Timers(_quiet_tell(self.actor_ref), timer_service)
        self._sinks: dict[str, ConnectionSink] = {}
        self._directory = ServiceDirectory()
        self._catalog = ProducerCatalog()
        self._watched: set[str] = set()
        self._detached_since: dict[str, float] = {}  # watched connections without a sink
        self._follow_ups: collections.deque[Command] = collections.deque()
        self._just_sent: set[SendConsumerUpdate] | None = None  # collected during an Attach
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._book = HandoverBook()
        self._probes = ProbeBook()
        # Loaded here, in the caller's thread, so that an unreadable log fails `start`.
        # The actor owns the log: if it does not start, nobody else would close it.
        try:
            self._state: CoordinatorState = self._log.load()
            change = None if settings is None else settings_change(self._state, settings)
            if change is not None:
                self._submit(change)
        except BaseException:
            self._log.close()
            raise

    # --- lifecycle

    def on_start(self) -> None:
        logger.info(
            "Coordinator started with %d groups on %d connections",
            len(self._state.groups),
            len(self._state.connections()),
        )
        try:
            self._submit(Recover(now=self._clock()))
            self._timers.start(_SWEEP, self._sweep_interval)
        except BaseException:
            self._shut_down()  # pykka calls neither on_stop nor on_failure for on_start
            raise

    def on_stop(self) -> None:
        with contextlib.suppress(Exception):  # a failed commit answered its requesters
            self._flush()
        self._shut_down()
        logger.info("Coordinator stopped")

    def on_failure(self, *_exc_info: object) -> None:
        self._shut_down()

    def _shut_down(self) -> None:
        self._timers.cancel_all()
        self._log.close()
        stopped = pykka.ActorDeadError(f"{self.actor_ref} stopped before storing it")
        if self._batch.items:  # a failure in the middle of a batch: it was never stored
            before, items = self._batch.take()
            self._state = before
            answer_all(items, stopped)
        refuse_queued(self.actor_inbox, stopped)

    # --- messages

    def on_receive(self, message: Any) -> Any:
        if type(message) is Execute:
            return self._execute(message.command, message.reply_to)
        if self._batch.items:
            self._flush()  # nothing outside may see a state not stored yet
        if self._fenced:
            if type(message) is TimerFired or type(message) is ProbeAnswered:
                return None
            raise fenced_error()
        if type(message) is TimerFired:
            self._on_timer(message)
            return None
        if type(message) is ProbeAnswered:
            self._on_probe_answer(message)
            return None
        if type(message) is Attach:
            self._probes.attached(message.connection, message.probe_address, message.prober)
            self._attach(message.connection, message.sink)
            return None
        if type(message) is Detach:
            self._detach(message)
            return None
        if type(message) is ListGroups:
            handovers = self._book.last_handovers()
            return list_groups(
                self._state, message.namespace, handovers=handovers, now=self._clock()
            )
        if type(message) is ListStreams:
            return list_streams(self._state, message.namespace, self._catalog.producers)
        if type(message) in DIRECTORY_MESSAGES:
            return self._on_directory(message)
        if type(message) is GetStatistics:
            return self.statistics()
        # Logged, not raised: an exception from a `tell` would stop the coordinator.
        logger.error("Coordinator ignored unexpected message %r", message)
        return None

    def statistics(self) -> CoordinatorStats:
        """The counters so far and the gauges now (call through ``proxy()``, or ask
        `GetStatistics`: answered in the actor's thread)."""
        self._flush()
        book = self._book
        return snapshot(self._counters, self._state, book.activations, book.histogram())

    def _on_timer(self, fired: TimerFired) -> None:
        if not self._timers.accept(fired):
            return  # cancelled or replaced after it fired
        if fired.key == _SWEEP:
            self._sweep()
            return
        if self._on_entries_timer(fired.key):
            return
        self._timers.cancel(fired.key)  # `Timers` repeat; the machine's timers are one-shot
        self._submit(DisconnectedTimeout(fired.key.removeprefix(_DISCONNECTED)))

    def _attach(self, connection: str, sink: ConnectionSink) -> None:
        replaced = self._sinks.get(connection)
        self._sinks[connection] = sink
        self._detached_since.pop(connection, None)
        logger.info(
            "Connection %r attached%s", connection, " (replacing its sink)" if replaced else ""
        )
        sent: set[SendConsumerUpdate] = set()
        self._just_sent = sent
        try:
            if any(
                c.connection == connection and not c.is_connected
                for g in self._state.groups.values()
                for c in g.consumers
            ):
                self._submit(ConnectionReconnected(connection))
        finally:
            self._just_sent = None
        self._send_all(u for u in self._current_updates(connection) if u not in sent)
        self._drain()  # a sink that failed during the re-send
        self._send_watched(connection)

    def _detach(self, message: Detach) -> None:
        connection = message.connection
        if self._sinks.get(connection) is not message.sink:
            logger.debug("Ignored Detach of %r through a sink no longer current", connection)
            return
        logger.info("Connection %r detached (%s)", connection, "lost" if message.lost else "closed")
        self._lose_sink(connection)
        if message.lost:
            self._submit(ConnectionLost(connection, now=self._clock()))
        else:
            self._connection_down(connection)

    def _connection_down(self, connection: str) -> None:
        self._probes.forget(connection)
        self._submit(ConnectionDown(connection))
        self._drop_watches(connection)
        self._drop_entries(connection)

    def _lose_sink(self, connection: str) -> None:
        del self._sinks[connection]
        self._lose_entries_later(connection)
        if connection in self._watched:
            self._detached_since[connection] = self._monotonic()

    def _current_updates(self, connection: str) -> list[SendConsumerUpdate]:
        """The update each connected consumer of ``connection`` was last sent."""
        updates = []
        for gid in self._state.group_ids_of(connection):
            for c in self._state.groups[gid].consumers:
                if c.connection != connection or not c.is_connected:
                    continue
                if c.activity is Activity.ACTIVE:
                    updates.append(activate(gid, c))
                elif c.activity is Activity.DEACTIVATING:
                    updates.append(step_down(gid, c))
        return updates

    # --- applying commands

    def _submit(self, command: Command) -> Reply:
        """Apply ``command``, store it and carry out its effects, then the commands those
        effects led to (a failed sink, a connection check), in order."""
        reply = self._apply(command)
        self._drain()
        return reply

    def _drain(self) -> None:
        while self._follow_ups:
            self._apply(self._follow_ups.popleft())

    def _apply(self, command: Command) -> Reply:
        before = self._state
        outcome = apply(before, command)
        changed = not isinstance(outcome.reply, Refused) and outcome.state != before
        if changed:
            # Stored before any effect: an update is never sent for a change not stored.
            self._store((command,))
            self._state = outcome.state
        self._carry_out(Staged(command, before, outcome, changed, None))
        return outcome.reply

    def _carry_out(self, staged: Staged) -> None:
        """What follows a stored command: counters, activation book, effects."""
        command, before, outcome, changed, _ = staged
        if isinstance(outcome.reply, Refused):
            self._counters["commands_refused"] += 1
            logger.info("Refused %s: %s", type(command).__name__, outcome.reply.message)
            return
        if changed and type(command) is CreateStream:  # created or grown: tell its watchers
            self._stream_changed(StreamId(command.namespace, command.name))
        if changed:
            changes = activation_changes(before, outcome.state, command)
            self._book.record(
                changes, outcome.state, now=self._clock(), monotonic=self._monotonic()
            )
        logger.debug("Applied %r: %r, %d effects", command, outcome.reply, len(outcome.effects))
        self._run(outcome.effects)

    def _store(self, commands: Sequence[Command], state: CoordinatorState | None = None) -> None:
        """Store ``commands``; ``state``: what they lead to, for a log that compacts now."""
        try:
            if len(commands) == 1:  # its compaction, if due, reads the log back
                self._log.append(commands[0])
            else:
                self._log.append_all(commands, state)
        except LogFencedError:
            if not self._fenced:
                self._fenced = True
                logger.error(
                    "Lost leadership: another coordinator leads (the log refused an "
                    "append); this coordinator stops serving"
                )
                with contextlib.suppress(pykka.ActorDeadError):  # not started yet
                    self.stop()
            raise
        self._counters["commands_applied"] += len(commands)

    # --- group commit

    def _execute(self, command: Command, reply_to: ReplyTo | None) -> Reply | None:
        """Stage ``command``; commit the batch now if it was asked, if the inbox is empty
        (nothing more to group with it) or if the batch is full."""
        try:
            if self._fenced:
                raise fenced_error()
            before = self._state
            outcome = apply(before, command)
            changed = not isinstance(outcome.reply, Refused) and outcome.state != before
            self._batch.add(Staged(command, before, outcome, changed, reply_to))
            if changed:
                self._state = outcome.state
        except Exception as error:
            if reply_to is None:
                self._flush()
                raise
            answer(reply_to, error)
        if reply_to is None:
            failure = self._flush()
            if failure is not None:
                raise failure
            return outcome.reply
        if len(self._batch.items) >= self._max_batch or self.actor_inbox.empty():
            try:
                self._flush()
            except Exception:  # its requesters were answered: the store of a follow-up
                logger.exception("The coordinator failed on a follow-up command")
        return None

    def _flush(self) -> Exception | None:
        """Commit the pending batch (if any) and apply the follow-ups of its effects; the
        store's error if it refused the batch (its requesters were given it)."""
        error = self._commit() if self._batch.items else None
        self._drain()
        return error

    def _commit(self) -> Exception | None:
        # The state staged is the one the batch's commands lead to.
        before, error = self._batch.commit(partial(self._store, state=self._state), self._carry_out)
        if error is not None:
            self._state = before  # as if the batch never was: no effect has run
        return error

    def _run(self, effects: Iterable[Effect]) -> None:
        for effect in effects:
            if type(effect) is SendConsumerUpdate:
                self._send_all([effect])
            elif type(effect) is StartTimer:
                self._timers.start(_DISCONNECTED + effect.key.connection, effect.delay)
            elif type(effect) is CancelTimer:
                self._timers.cancel(_DISCONNECTED + effect.key.connection)
            elif type(effect) is CheckConnection:
                if effect.connection in self._sinks:
                    self._follow_ups.append(ConnectionReconnected(effect.connection))
                else:
                    self._probe(effect.connection)
            elif type(effect) is WatchConnection:
                self._watched.add(effect.connection)
                if effect.connection not in self._sinks:
                    self._detached_since.setdefault(effect.connection, self._monotonic())
            elif type(effect) is UnwatchConnection:
                self._watched.discard(effect.connection)
                self._detached_since.pop(effect.connection, None)
                if effect.connection not in self._sinks:
                    self._probes.forget(effect.connection)

    def _send_all(self, updates: Iterable[SendConsumerUpdate]) -> None:
        for update in updates:
            sink = self._sinks.get(update.connection)
            if sink is None:
                self._count(updates_skipped=1)
                logger.debug(
                    "No sink for %r: %r skipped until it attaches", update.connection, update
                )
                continue
            try:
                sink.send_update(update)
            except Exception:
                self._count(sink_failures=1)
                logger.warning(
                    "Sink of connection %r failed on %r: treating the connection as lost",
                    update.connection,
                    update,
                    exc_info=True,
                )
                self._lose_sink(update.connection)
                self._follow_ups.append(ConnectionLost(update.connection, now=self._clock()))
                continue
            self._count(updates_sent=1)
            if self._just_sent is not None:
                self._just_sent.add(update)

    def _count(self, **increments: int) -> None:
        for name, increment in increments.items():
            self._counters[name] += increment
