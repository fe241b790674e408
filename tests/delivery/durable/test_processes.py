"""A durable producer process killed with SIGKILL again and again: nothing is lost.

A consumer process (tests/delivery/durable/procs.py ``consume``) runs at one address for
the whole test (but on PostgreSQL, below). A producer process (``produce``) with a
`SqliteDurableQueue` sends the numbers 1..`COUNT` (payload == seq_nr) to it; the test
kills it with SIGKILL at random points (seeded: the seed is printed, and
``DURABLE_KILL_SEED=<seed>`` replays it) at least `MID_STREAM_KILLS` times while messages
flow, once more shortly after a start, and starts it again on the same queue file each
time, until one incarnation sends the last number and sees everything confirmed.

Each incarnation gets a new node address, so the producer registers the consumer
(``register_consumer``): its first message, marked ``first``, starts a new session at the
consumer whatever the consumer's state (docs/durable.md, "Starting on a stored state").
The consumer never registers anywhere: a consumer registering to a producer that has died
would drop what the next one sends.

What is asserted:

* with the consumer's deduplication store: the consumer's file holds 1..COUNT exactly
  once, in order;
* without it: every number at least once, each incarnation's run in order and without
  gaps, and duplicates only where a restarted producer resends what its queue held
  unconfirmed: a run starts at the first unconfirmed seq_nr its incarnation loaded, never
  above the previous run's end + 1 (nothing lost) and never below the confirmations the
  queue had stored, and never after a number the queue had not stored (store, then send);
* in both: a restarted producer always loads every seq_nr an earlier incarnation reported
  stored (``{"sent": n}`` lines: `send_many` returned, so they were stored), what it loads
  unconfirmed is contiguous up to its next seq_nr, and at most two windows;
* on PostgreSQL (queue, and the consumer's effects with a `PostgresTxDedupStore`, the
  exactly-once recipe): the consumer is SIGKILLed too, just before `CONSUMER_KILLS` of the
  producer's mid-stream kills, and started again at a new address that the next producer
  registers; the effect rows are 1..COUNT exactly once, in order.

The consumer takes messages as fast as it can (no throttle), so the producer is busy
(storing, sending, taking Requests) when it is killed, not waiting for demand.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pykka_delivery.delivery.stores.dead_letters import SqliteDeadLetters
from tests.delivery.durable import procs
from tests.transport.procs import Proc, Spawn

pytestmark = pytest.mark.slow

PROCS = ("-m", "tests.delivery.durable.procs")
COUNT = 50_000
WINDOW = 500  # the consumer's flow-control window
MID_STREAM_KILLS = 5  # kills once the consumer has got a random number of new messages
EARLY_KILLS = 1  # kills a random moment (up to EARLY_KILL_MAX s) after a producer's start
EARLY_KILL_MAX = 0.1
CONSUMER_KILLS = 2  # with effects in PostgreSQL: mid-stream kills that take the consumer too
THROTTLE = 0  # messages/s the consumer takes (0: as fast as it can, so kills land in busy code)
BOUND = 100.0  # seconds for a whole run (below pytest-timeout's 120)


class Tail:
    """The consumer's file, read as it grows: the highest number so far."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.highest = 0

    def poll(self) -> int:
        if self.path.exists():
            with self.path.open("rb") as file:
                file.seek(self._offset)
                data = file.read()
            self._offset += len(data)
            lines = (self._partial + data).split(b"\n")
            self._partial = lines.pop()
            if lines:
                self.highest = max(self.highest, *(int(line) for line in lines))
        return self.highest


@dataclass
class Incarnation:
    """One producer process: what it loaded, what it reported stored, how it ended."""

    number: int
    current_seq_nr: int  # the next seq_nr, as loaded
    unconfirmed: tuple[int, int] | None  # the loaded unconfirmed range, resent first
    reported_sent: int = 0  # the highest ``{"sent": n}`` it printed
    ended: str = "running"
    lines: list[dict[str, Any]] = field(default_factory=list)

    def record(self, line: dict[str, Any]) -> None:
        self.lines.append(line)
        if "sent" in line and not line.get("done"):
            self.reported_sent = max(self.reported_sent, int(line["sent"]))

    @property
    def first_sent(self) -> int:
        """The seq_nr its session starts with."""
        return self.unconfirmed[0] if self.unconfirmed else self.current_seq_nr


def kill_seed() -> int:
    return int(os.environ.get("DURABLE_KILL_SEED") or random.SystemRandom().randrange(2**32))


def kill_plan(rng: random.Random) -> list[float | int]:
    """The kills in order: an int kills once the consumer has passed that many numbers
    beyond where the producer started (its loaded ``current_seq_nr``; at least 500, so it
    has sent new messages, and at most 5 000, so that every kill comes well before the
    end), a float that many seconds after the producer's ready line (during its start and
    the resending of what it loaded)."""
    plan: list[float | int] = [rng.randrange(500, 5_000) for _ in range(MID_STREAM_KILLS)]
    for _ in range(EARLY_KILLS):
        plan.insert(rng.randrange(len(plan) + 1), rng.uniform(0.0, EARLY_KILL_MAX))
    return plan


def numbers_in(path: Path) -> list[int]:
    return [int(line) for line in path.read_bytes().splitlines()]


def runs_of(numbers: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive numbers, as (first, last)."""
    runs: list[tuple[int, int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    return runs


def collect(proc: Proc, incarnation: Incarnation) -> None:
    """Everything else ``proc`` printed (it has exited and its readers are joined)."""
    while not proc.lines.empty():
        incarnation.record(proc.lines.get_nowait())


@dataclass
class KillRun:
    """The scenario's moving parts: the consumer, its file, the command lines."""

    spawn: Spawn
    consume: list[str]
    produce: list[str]  # without --consumer, which is the current consumer's address
    tail: Tail
    rng: random.Random
    seed: int
    deadline: float
    consumers: list[Proc] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # per consumer, its last "skipped"
    address: str = ""  # the consumer's

    @property
    def consumer(self) -> Proc:
        return self.consumers[-1]

    def start_consumer(self) -> None:
        self.consumers.append(self.spawn(f"consumer {len(self.consumers)}", *PROCS, *self.consume))
        self.skipped.append(0)
        self.address = self.consumer.ready()

    def record_consumer(self, line: dict[str, Any]) -> None:
        if "skipped" in line:
            self.skipped[-1] = max(self.skipped[-1], int(line["skipped"]))

    def kill_consumer(self) -> None:
        """SIGKILL the consumer mid-flow (the producer still sending to it), then start
        another, which the next producer registers."""
        consumer = self.consumer
        assert consumer.alive(), f"the consumer exited early\n{consumer.output()}"
        consumer.kill()
        assert consumer.popen.returncode == -9, consumer.output()
        while not consumer.lines.empty():
            self.record_consumer(consumer.lines.get_nowait())
        self.start_consumer()

    def start_producer(self, number: int) -> tuple[Proc, Incarnation]:
        argv = [*PROCS, *self.produce, "--consumer", self.address]
        producer = self.spawn(f"producer {number}", *argv)
        ready = producer.expect(lambda line: bool(line.get("ready")), 30.0)
        loaded = ready["unconfirmed"]
        unconfirmed = (int(loaded[0]), int(loaded[1])) if loaded else None
        return producer, Incarnation(number, int(ready["current_seq_nr"]), unconfirmed)

    def finish(self, producer: Proc, incarnation: Incarnation) -> None:
        """The last producer: it must send the rest and see everything confirmed."""

        def done(line: dict[str, Any]) -> bool:
            incarnation.record(line)
            return bool(line.get("done"))

        producer.expect(done, self.deadline - time.monotonic())
        code = producer.wait(max(1.0, self.deadline - time.monotonic()))
        assert code == 0, f"seed {self.seed}: {incarnation}\n{producer.output()}"
        incarnation.ended = "done"
        collect(producer, incarnation)

    def kill(
        self, producer: Proc, incarnation: Incarnation, when: float | int, consumer: bool
    ) -> None:
        """SIGKILL ``producer`` as `kill_plan` says; with ``consumer``, the consumer first
        (then start another)."""

        def context() -> str:
            return f"seed {self.seed}: {incarnation}\n{producer.output()}"

        if isinstance(when, float):
            time.sleep(when)
            incarnation.ended = f"killed {when:.3f} s after its start"
        else:
            when += incarnation.current_seq_nr
            while self.tail.poll() < when:
                assert producer.alive(), f"the producer exited early; {context()}"
                assert self.consumer.alive(), f"the consumer exited early; {context()}"
                assert time.monotonic() < self.deadline, f"no progress to {when}; {context()}"
                time.sleep(0.002)
            time.sleep(self.rng.uniform(0.0, 0.005))  # anywhere between two reads of the file
            incarnation.ended = f"killed at consumer number {self.tail.highest}"
        assert producer.alive(), f"the producer ended before its kill; {context()}"
        if consumer:
            self.kill_consumer()
            incarnation.ended += ", the consumer killed first"
        producer.kill()
        assert producer.popen.returncode == -9, context()
        collect(producer, incarnation)


def run_with_kills(
    spawn: Spawn, tmp_path: Path, *, dedup: bool, queue: str = "", effects: str = ""
) -> tuple[list[int], list[Incarnation], dict[str, Any], KillRun]:
    """The whole scenario; returns the consumer's numbers, the incarnations, the last
    consumer's summary and the run (the seed, the consumers). ``queue``: the producer's
    queue (a `postgresql://` URL), an SQLite file in ``tmp_path`` when empty. ``effects``:
    a `postgresql://` URL where the consumer applies each number with its position in one
    transaction (procs.py ``--effects-url``); it is then also killed, `CONSUMER_KILLS`
    times, just before a mid-stream producer kill."""
    seed = kill_seed()
    rng = random.Random(seed)
    plan = kill_plan(rng)
    mid_stream = [i for i, when in enumerate(plan) if isinstance(when, int)]
    with_consumer = set(rng.sample(mid_stream, CONSUMER_KILLS)) if effects else set()
    print(f"\nDURABLE_KILL_SEED={seed} dedup={dedup} kills={plan} consumer at {with_consumer}")
    deadline = time.monotonic() + BOUND
    log = tmp_path / "received.txt"
    consume = ["consume", "--file", str(log), "--count", str(COUNT), "--window", str(WINDOW)]
    consume += ["--throttle", str(THROTTLE), "--receive-timeout", "20"]
    if effects:
        consume += ["--effects-url", effects]
    elif dedup:
        consume += ["--dedup-db", str(tmp_path / "dedup.db")]
    produce = ["produce", "--db", queue or str(tmp_path / "queue.db"), "--count", str(COUNT)]
    run = KillRun(spawn, consume, produce, Tail(log), rng, seed, deadline)
    run.start_consumer()
    incarnations: list[Incarnation] = []
    for number, when in enumerate([*plan, None]):
        producer, incarnation = run.start_producer(number)
        incarnations.append(incarnation)
        if when is None:
            run.finish(producer, incarnation)
        else:
            run.kill(producer, incarnation, when, number in with_consumer)
    consumer = run.consumer

    def is_summary(line: dict[str, Any]) -> bool:
        run.record_consumer(line)
        return "received" in line and "timeout" not in line

    summary = consumer.expect(is_summary, deadline - time.monotonic())
    code = consumer.wait(max(1.0, deadline - time.monotonic()))
    assert code == 0, consumer.output()
    for incarnation in incarnations:
        print(
            f"  producer {incarnation.number}: loaded current_seq_nr "
            f"{incarnation.current_seq_nr}, unconfirmed {incarnation.unconfirmed}, reported "
            f"sent up to {incarnation.reported_sent}, {incarnation.ended}"
        )
    print(f"  consumer: {summary}, duplicates skipped per consumer: {run.skipped}")
    assert summary["mismatches"] == 0, "a payload's number differed from its seq_nr"
    return numbers_in(log), incarnations, summary, run


def check_producers(incarnations: list[Incarnation], numbers: list[int], seed: int) -> None:
    """What every incarnation loaded holds what the one before reported stored; the
    consumer got nothing that was not stored first."""
    killed = [i for i in incarnations if i.ended.startswith("killed")]
    assert len(killed) >= MID_STREAM_KILLS + EARLY_KILLS, f"seed {seed}: {incarnations}"
    reported = 0
    for incarnation in incarnations:
        context = f"seed {seed}, producer {incarnation.number}: {incarnation}"
        assert incarnation.current_seq_nr > reported, f"a reported message was lost; {context}"
        if incarnation.unconfirmed is not None:
            low, high = incarnation.unconfirmed
            assert high == incarnation.current_seq_nr - 1, f"unconfirmed not contiguous; {context}"
            assert high - low + 1 <= 2 * WINDOW, f"more unconfirmed than windows allow; {context}"
        reported = max(reported, incarnation.reported_sent, incarnation.current_seq_nr - 1)
    mid_stream = [i for i in incarnations if i.ended.startswith("killed at")]
    for incarnation in mid_stream:
        assert incarnation.reported_sent > 0, f"seed {seed}: {incarnation} sent nothing"
    assert incarnations[-1].ended == "done"
    assert max(numbers) == COUNT


def test_durable_producer_killed_repeatedly_with_dedup_store_exactly_once_in_order(
    spawn: Spawn, tmp_path: Path
) -> None:
    """The consumer with a `SqliteDedupStore`: the application sees 1..COUNT exactly once,
    in order, over every kill. Each restarted producer resends what its queue held
    unconfirmed (the confirmations are written behind, so some of it was processed
    already); the store recognises those as at or below the consumer's position."""
    numbers, incarnations, summary, run = run_with_kills(spawn, tmp_path, dedup=True)
    seed = run.seed
    check_producers(incarnations, numbers, seed)
    if numbers != list(range(1, COUNT + 1)):
        duplicated = len(numbers) - len(set(numbers))
        missing = sorted(set(range(1, COUNT + 1)) - set(numbers))[:10]
        pytest.fail(
            f"seed {seed}: {len(numbers)} numbers, {duplicated} duplicated, missing "
            f"{missing}..., first out of order at index "
            f"{next(i for i, n in enumerate(numbers) if n != i + 1)}"
        )
    assert summary["stats"]["dedup_duplicates"] > 0, (
        f"seed {seed}: no restarted producer resent anything the consumer had processed, "
        "so the store was not exercised"
    )


def test_durable_producer_on_postgres_killed_repeatedly_applies_each_effect_exactly_once(
    spawn: Spawn, tmp_path: Path, postgres_url: str
) -> None:
    """The same on a `PostgresDurableQueue`, the consumer applying each number as a row of
    the database and recording its position with a `PostgresTxDedupStore` in the same
    transaction (the exactly-once recipe), and SIGKILLed itself twice mid-flow: each
    restarted producer takes the producer id over at once (the killed one's session and
    its advisory lock end with it) and loads every message reported stored; each
    restarted consumer loads the positions committed with the effects. The rows are
    1..COUNT exactly once, in order, and the consumers skipped duplicates the producers
    resent (the store was exercised)."""
    numbers, incarnations, _, run = run_with_kills(
        spawn, tmp_path, dedup=True, queue=postgres_url, effects=postgres_url
    )
    check_producers(incarnations, numbers, run.seed)
    assert sum(i.ended.endswith("the consumer killed first") for i in incarnations) == (
        CONSUMER_KILLS
    )
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute(f"SELECT number FROM {procs.EFFECTS_TABLE} ORDER BY id").fetchall()
    applied = [number for (number,) in rows]
    if applied != list(range(1, COUNT + 1)):
        missing = sorted(set(range(1, COUNT + 1)) - set(applied))[:10]
        pytest.fail(
            f"seed {run.seed}: {len(applied)} effects, {len(applied) - len(set(applied))} "
            f"applied twice, missing {missing}..., first out of order at index "
            f"{next((i for i, n in enumerate(applied) if n != i + 1), len(applied))}"
        )
    assert sum(run.skipped) > 0, (
        f"seed {run.seed}: no consumer skipped a duplicate (per consumer: {run.skipped}), so "
        "the store was not exercised"
    )


def test_durable_producer_killed_repeatedly_without_dedup_store_at_least_once_in_order(
    spawn: Spawn, tmp_path: Path
) -> None:
    """Without a deduplication store delivery is at least once: the file is a sequence of
    runs, each a restarted producer's session, each in order without gaps; a run starts
    where its producer's queue had its first unconfirmed seq_nr, at or below the previous
    run's end + 1, so the only duplicates are messages the consumer processed whose
    confirmation the killed producer had not stored."""
    numbers, incarnations, _, run = run_with_kills(spawn, tmp_path, dedup=False)
    seed = run.seed
    check_producers(incarnations, numbers, seed)
    assert set(numbers) == set(range(1, COUNT + 1)), f"seed {seed}: numbers lost"
    runs = runs_of(numbers)
    assert runs[0][0] == 1, f"seed {seed}: {runs[:3]}"
    starts = {i.first_sent: i for i in incarnations}
    for (_, previous_end), (start, end) in itertools.pairwise(runs):
        context = f"seed {seed}: run {start}..{end} after one ending at {previous_end}"
        assert start <= previous_end + 1, f"a gap: {context}"
        assert start in starts, f"not where any producer's session started; {context}"
        unconfirmed = starts[start].unconfirmed
        assert unconfirmed is not None, f"a restart without unconfirmed resent; {context}"
        assert previous_end <= unconfirmed[1], f"received more than was stored; {context}"
    duplicates = len(numbers) - COUNT
    print(f"  {len(runs)} runs, {duplicates} duplicates")
    assert duplicates > 0, f"seed {seed}: no producer resent anything already processed"
    assert runs[-1][1] == COUNT


def test_poison_messages_land_in_the_dead_letter_store_after_max_attempts(
    spawn: Spawn, tmp_path: Path
) -> None:
    """A consumer process rejects every multiple of 100 each time it is delivered: after
    ``max_attempts`` (3) deliveries each goes to the consumer's SQLite dead letters, the
    stream moves on, and the durable producer sees every message confirmed."""
    count, poison_every = 2_000, 100
    deadline = time.monotonic() + BOUND
    log, dead = tmp_path / "received.txt", tmp_path / "dead.db"
    consume = ["consume", "--file", str(log), "--count", str(count), "--window", "50"]
    consume += ["--poison-every", str(poison_every), "--max-attempts", "3"]
    consume += ["--dead-letters", str(dead), "--receive-timeout", "20"]
    consumer = spawn("consumer", *PROCS, *consume)
    produce = ["produce", "--db", str(tmp_path / "queue.db"), "--consumer", consumer.ready()]
    producer = spawn("producer", *PROCS, *produce, "--count", str(count), "--batch", "50")
    producer.ready()

    summary = consumer.expect(
        lambda line: "received" in line and "timeout" not in line, deadline - time.monotonic()
    )
    assert consumer.wait(max(1.0, deadline - time.monotonic())) == 0, consumer.output()
    producer.expect(lambda line: "done" in line, deadline - time.monotonic())

    poison = [n for n in range(1, count + 1) if n % poison_every == 0]
    assert numbers_in(log) == [n for n in range(1, count + 1) if n % poison_every], (
        "every other message once, in order"
    )
    with SqliteDeadLetters(dead) as letters:
        stored = [s.letter for s in letters.letters()]
    assert [int.from_bytes(d.message[:8], "big") for d in stored] == poison
    assert {(d.attempts, d.reason.split()[0]) for d in stored} == {(3, "poison")}
    assert [d.seq_nr for d in stored] == poison
    stats = summary["stats"]
    assert (stats["dead_lettered"], stats["rejected"]) == (len(poison), 3 * len(poison))
