"""The gRPC transport between real processes on 127.0.0.1: two and three of them, and
processes killed with SIGKILL.

Every process is started here (examples/remote_producer.py, examples/remote_consumer.py,
and the services in tests/transport/procs.py), reads its own output on a thread (`Proc`),
and is killed and reaped when the test ends, whatever happened. Every wait is bounded.

The consumers check sequence numbers themselves (examples/remote_consumer.py counts
duplicates and gaps; ``procs consume`` writes each number to a file before confirming it,
so the test reads exactly what was received, in order, even from a killed process).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.transport.procs import Proc, Spawn

pytestmark = pytest.mark.slow

PRODUCER = "examples/remote_producer.py"
CONSUMER = "examples/remote_consumer.py"
PROCS = ("-m", "tests.transport.procs")
BOUND = 100.0  # seconds for a whole run to finish (below pytest-timeout's 120)
WINDOW = 500  # the consumers' flow-control window
# Once its consumer has exited, a producer has its last confirmations: it reports at once.
AFTER_CONSUMER = 20.0


def is_summary(key: str) -> Callable[[dict[str, Any]], bool]:
    return lambda line: key in line and not line.get("ready") and "timeout" not in line


def numbers_in(path: Path) -> list[int]:
    return [int(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def wait_for_lines(path: Path, count: int, proc: Proc, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_bytes().count(b"\n") >= count):
        assert proc.alive(), f"{proc.name} exited early\n{proc.output()}"
        assert time.monotonic() < deadline, f"fewer than {count} lines in {timeout} s"
        time.sleep(0.005)


def start_producer(spawn: Spawn, count: int, *options: str) -> tuple[Proc, str]:
    """The producer service on a free port (port 0: the node binds and announces it, so
    there is no window in which another process could take a port picked in advance)."""
    producer = spawn("producer", PRODUCER, "--port", "0", "--count", str(count), *options)
    return producer, producer.ready()


def finish(*procs: Proc, deadline: float) -> None:
    for proc in procs:
        code = proc.wait(max(1.0, deadline - time.monotonic()))
        assert code == 0, f"{proc.name} exited with {code}\n{proc.output()}"


def consumed(consumer: Proc, deadline: float) -> dict[str, Any]:
    """The consumer's summary, once it has exited with status 0."""
    summary = consumer.expect(is_summary("received"), deadline - time.monotonic())
    finish(consumer, deadline=deadline)
    return summary


def sender_done(sender: Proc, key: str, downstream: Proc) -> dict[str, Any]:
    """The summary of a process whose consumer (``downstream``) has exited: everything is
    confirmed by then, so it must come within `AFTER_CONSUMER` seconds."""
    try:
        summary = sender.expect(is_summary(key), AFTER_CONSUMER)
    except AssertionError as error:
        msg = (
            f"{downstream.name} confirmed everything and exited, but {sender.name} never saw "
            "its last confirmations (lost when the consumer's node stopped?)"
        )
        raise AssertionError(f"{msg}\n{error}\n{downstream.output()}") from None
    finish(sender, deadline=time.monotonic() + AFTER_CONSUMER)
    return summary


# --- delivery --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "producer_mode, consumer_mode",
    [((), ()), (("--asyncio",), ("--asyncio",)), ((), ("--asyncio",))],
    ids=["threads", "asyncio", "threads-to-asyncio"],
)
def test_two_processes_deliver_100_000_messages_in_order_exactly_once(
    spawn: Spawn, producer_mode: tuple[str, ...], consumer_mode: tuple[str, ...]
) -> None:
    """With the sync handles and nodes on loop threads of their own, with the asyncio
    handles and nodes on the services' event loops (``async with Node()``), and mixed."""
    deadline = time.monotonic() + BOUND
    producer, address = start_producer(spawn, 100_000, *producer_mode)
    consumer = spawn(
        "consumer", CONSUMER, "--producer", address, "--count", "100000", *consumer_mode
    )
    consumer.ready()

    received = consumed(consumer, deadline)
    sent = sender_done(producer, "sent", consumer)

    print(f"\ntwo processes ({producer_mode}, {consumer_mode}): {received}, producer {sent}")
    assert (received["received"], received["duplicates"], received["gaps"]) == (100_000, 0, 0)
    assert sent["sent"] == 100_000


def test_three_processes_deliver_100_000_messages_through_a_relay_in_order_exactly_once(
    spawn: Spawn,
) -> None:
    """producer process -> relay process (a Consumer and a Producer) -> consumer process:
    two links, each with its own reliable-delivery session."""
    deadline = time.monotonic() + BOUND
    producer, address = start_producer(spawn, 100_000)
    relay = spawn("relay", *PROCS, "relay", "--producer", address, "--count", "100000")
    relay_address = relay.ready()
    consumer = spawn("consumer", CONSUMER, "--producer", relay_address, "--count", "100000")
    consumer.ready()

    received = consumed(consumer, deadline)
    forwarded = sender_done(relay, "forwarded", consumer)
    sent = sender_done(producer, "sent", relay)

    print(f"\nthree processes: consumer {received}, relay {forwarded}, producer {sent}")
    assert (received["received"], received["duplicates"], received["gaps"]) == (100_000, 0, 0)
    assert forwarded["forwarded"] == 100_000
    assert sent["sent"] == 100_000


# --- processes killed ------------------------------------------------------------------


@pytest.mark.parametrize("restart_on", ["a new port", "the same port"])
def test_a_consumer_killed_with_sigkill_and_restarted_gets_everything_unconfirmed_again(
    spawn: Spawn, tmp_path: Path, restart_on: str
) -> None:
    """At-least-once across a consumer crash: nothing is lost, and what arrives twice is
    only what the dead consumer received but the producer had not seen confirmed (at most
    a flow-control window), delivered again at the start of the new consumer's run."""
    count, kill_at = 20_000, 5_100  # not a multiple of half the window
    deadline = time.monotonic() + BOUND
    log = tmp_path / "received.txt"
    producer, address = start_producer(spawn, count)
    consume = (*PROCS, "consume", "--producer", address, "--count", str(count))
    consume += ("--file", str(log), "--window", str(WINDOW))
    first = spawn("consumer 1", *consume, "--throttle", "5000")  # killed mid-stream
    first_address = first.ready()

    wait_for_lines(log, kill_at, first)
    first.kill()
    assert first.popen.returncode == -9
    before = numbers_in(log)
    last = before[-1]
    assert before == list(range(1, last + 1)), "the first run is in order, without gaps"
    assert last < count, "killed before the end"

    port = first_address.split("/")[0].rsplit(":", 1)[1] if restart_on == "the same port" else "0"
    second = spawn("consumer 2", *consume, "--port", port, "--resend-interval", "0.2")
    second.ready()
    summary = consumed(second, deadline)
    sent = sender_done(producer, "sent", second)

    after = numbers_in(log)[len(before) :]
    restart = after[0]
    print(f"\nkilled at {last}, restarted at {restart}; producer {sent}, consumer 2 {summary}")
    assert after == list(range(restart, count + 1)), "the second run is in order, without gaps"
    assert restart <= last + 1, "nothing lost between the runs"
    duplicates = last - restart + 1
    assert duplicates <= WINDOW, f"{duplicates} delivered twice: more than the window"
    assert set(before) | set(after) == set(range(1, count + 1))
    assert sent["sent"] == count


def test_a_producer_killed_with_sigkill_leaves_the_consumer_timing_out_not_crashing(
    spawn: Spawn, tmp_path: Path
) -> None:
    """The consumer keeps running: ``receive(timeout=...)`` raises DeliveryTimeout (the
    service prints a line per timeout), and what it got is in order without duplicates.
    (A producer that survives its crash is a later issue: nothing more is asserted.)"""
    deadline = time.monotonic() + BOUND
    log = tmp_path / "received.txt"
    producer, address = start_producer(spawn, 100_000)
    consumer = spawn(
        "consumer",
        *PROCS,
        "consume",
        "--producer",
        address,
        "--count",
        "100000",
        "--file",
        str(log),
        "--throttle",
        "5000",
        "--receive-timeout",
        "1.0",
        "--max-timeouts",
        "3",
    )
    consumer.ready()

    wait_for_lines(log, 2_000, consumer)
    producer.kill()
    timeout = consumer.expect(lambda line: "timeout" in line, 15.0)
    assert timeout["timeout"] == "DeliveryTimeout"
    assert timeout["received"] >= 2_000, "the first timeout came after the kill"
    assert consumer.alive(), "the consumer survives the producer's death"
    summary = consumer.expect(is_summary("received"), deadline - time.monotonic())
    finish(consumer, deadline=deadline)

    numbers = numbers_in(log)
    print(f"\nproducer killed; consumer {summary}")
    assert summary["timeouts"] == 3
    assert numbers == list(range(1, len(numbers) + 1)), "in order, no duplicates, no gaps"
    assert summary["received"] == len(numbers) < 100_000
    assert not any("Traceback" in line for line in consumer.stderr), consumer.output()
