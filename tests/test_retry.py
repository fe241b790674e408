"""The one retry/backoff helper: the waits of a `Backoff` and `call_with_retries`.

Its users keep their own tests of what they retry and log (tests/delivery/stores,
tests/delivery/durable, tests/transport, tests/coordinator, the fan-in's tests).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest

from pykka_delivery.retry import Backoff, call_with_retries


def first(count: int, delays: Any) -> list[float]:
    return list(itertools.islice(delays, count))


class Transient(Exception):
    """An error worth another attempt."""


class GaveUp(Exception):
    """What the caller raises in the end."""


class Flaky:
    """A call that raises ``errors`` in turn, then returns ``"done"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> str:
        self.calls.append(args)
        if self.errors:
            raise self.errors.pop(0)
        return "done"


class Loop:
    """What a caller passes in, recording what the helper did with it."""

    def __init__(self) -> None:
        self.retries: list[tuple[int, float, str]] = []
        self.waits: list[float] = []
        self.given_up: list[tuple[int, Exception]] = []

    def run(self, call: Callable[..., str], *args: Any, attempts: int = 4, **options: Any) -> str:
        return call_with_retries(
            call,
            *args,
            attempts=attempts,
            backoff=Backoff(0.1, 0.3),
            retry_on=Transient,
            on_retry=lambda attempt, delay, error: self.retries.append(
                (attempt, delay, str(error))
            ),
            give_up=self.give_up,
            sleep=self.waits.append,
            **options,
        )

    def give_up(self, attempt: int, error: Exception) -> Exception:
        self.given_up.append((attempt, error))
        return GaveUp(f"{attempt} attempt(s): {error}")


# --- Backoff ---------------------------------------------------------------------------


def test_delays_double_from_the_initial_wait_up_to_the_maximum() -> None:
    delays = Backoff(0.1, 1.0).delays()

    assert first(7, delays) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])


def test_delays_follow_the_multiplier() -> None:
    assert first(4, Backoff(1.0, 5.0, multiplier=1.5).delays()) == [1.0, 1.5, 2.25, 3.375]


def test_a_multiplier_of_one_gives_constant_waits() -> None:
    assert first(3, Backoff(0.5, 0.5, multiplier=1.0).delays()) == [0.5, 0.5, 0.5]


def test_an_initial_wait_of_zero_never_waits() -> None:
    assert first(3, Backoff(0.0, 1.0).delays()) == [0.0, 0.0, 0.0]


def test_jitter_spreads_each_wait_within_its_fraction_either_way() -> None:
    backoff = Backoff(0.1, 5.0, jitter=0.2)
    plain = first(200, Backoff(0.1, 5.0).delays())

    jittered = first(200, backoff.delays(random.Random(18)))

    for delay, base in zip(jittered, plain, strict=True):
        assert base * 0.8 <= delay <= base * 1.2
    assert len(set(jittered[-100:])) > 1, "the waits at the maximum are spread too"


class Lowest(random.Random):
    """Always the lowest factor the jitter allows."""

    def uniform(self, a: float, b: float) -> float:
        return a


def test_jitter_does_not_change_the_doubling_underneath() -> None:
    """Each wait is the doubled one before jitter, spread: jitter does not compound."""
    jittered = first(4, Backoff(0.1, 100.0, jitter=0.5).delays(Lowest()))

    assert jittered == pytest.approx([0.05, 0.1, 0.2, 0.4])


def test_the_same_seed_gives_the_same_waits() -> None:
    backoff = Backoff(0.1, 5.0, jitter=0.2)

    assert first(20, backoff.delays(random.Random(7))) == first(
        20, backoff.delays(random.Random(7))
    )


def test_reset_starts_the_waits_over() -> None:
    delays = Backoff(0.1, 1.0).delays()
    first(5, delays)

    delays.reset()

    assert first(2, delays) == pytest.approx([0.1, 0.2])


def test_each_loop_has_waits_of_its_own() -> None:
    backoff = Backoff(0.1, 1.0)
    one = backoff.delays()
    first(3, one)

    assert first(1, backoff.delays()) == [0.1]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"initial": -0.1, "maximum": 1.0}, "initial"),
        ({"initial": 2.0, "maximum": 1.0}, "initial"),
        ({"initial": 0.1, "maximum": float("inf")}, "finite"),
        ({"initial": 0.1, "maximum": 1.0, "multiplier": 0.5}, "multiplier"),
        ({"initial": 0.1, "maximum": 1.0, "jitter": 1.0}, "jitter"),
        ({"initial": 0.1, "maximum": 1.0, "jitter": -0.1}, "jitter"),
    ],
)
def test_a_backoff_that_cannot_work_is_refused_naming_the_setting(
    options: dict[str, float], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        Backoff(**options)


# --- call_with_retries ----------------------------------------------------------------------


def test_a_call_that_works_at_once_is_made_once_without_waiting() -> None:
    loop = Loop()
    call = Flaky()

    assert loop.run(call, "a", 1) == "done"

    assert call.calls == [("a", 1)]
    assert (loop.retries, loop.waits) == ([], [])


def test_a_retryable_error_is_retried_after_each_wait_of_the_backoff() -> None:
    loop = Loop()
    call = Flaky(Transient("one"), Transient("two"), Transient("three"))

    assert loop.run(call, attempts=4) == "done"

    assert len(call.calls) == 4
    assert loop.retries == [(1, 0.1, "one"), (2, 0.2, "two"), (3, 0.3, "three")]
    assert loop.waits == [0.1, 0.2, 0.3]


def test_attempts_are_counted_and_the_last_failure_gives_up() -> None:
    loop = Loop()
    last = Transient("three")
    call = Flaky(Transient("one"), Transient("two"), last)

    with pytest.raises(GaveUp, match="3 attempt") as raised:
        loop.run(call, attempts=3)

    assert len(call.calls) == 3
    assert loop.given_up == [(3, last)]
    assert raised.value.__cause__ is last
    assert loop.waits == [0.1, 0.2], "no wait after the last attempt"


def test_one_attempt_means_no_retry() -> None:
    loop = Loop()

    with pytest.raises(GaveUp, match="1 attempt"):
        loop.run(Flaky(Transient("once")), attempts=1)

    assert (loop.retries, loop.waits) == ([], [])


def test_a_non_retryable_error_is_not_retried() -> None:
    loop = Loop()
    broken = OSError("disk on fire")
    call = Flaky(broken)

    with pytest.raises(GaveUp, match="disk on fire") as raised:
        loop.run(call, attempts=5)

    assert len(call.calls) == 1
    assert (loop.retries, loop.waits) == ([], [])
    assert loop.given_up == [(1, broken)]
    assert raised.value.__cause__ is broken


def test_a_first_attempt_made_by_the_caller_counts_as_attempt_one() -> None:
    loop = Loop()
    call = Flaky()

    assert loop.run(call, attempts=2, failed=Transient("made already")) == "done"

    assert len(call.calls) == 1
    assert loop.retries == [(1, 0.1, "made already")]


def test_a_first_attempt_made_by_the_caller_that_cannot_be_retried_gives_up_at_once() -> None:
    loop = Loop()
    call = Flaky()

    with pytest.raises(GaveUp):
        loop.run(call, failed=KeyError("bug"))

    assert call.calls == []


def test_zero_attempts_is_refused() -> None:
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        Loop().run(Flaky(), attempts=0)
