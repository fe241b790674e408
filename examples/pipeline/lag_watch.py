"""The lag the pipeline demo watches while it runs: the coordinator's answer to
`CoordinatorClient.lag()` (what ``pykka-delivery lag`` prints), sampled about once a
second, and per stage the largest seen.

Producers and consumers report their positions to the coordinator; a row is one
(group, partition, producer) with the messages in flight (sent, not yet confirmed) and the
age of the oldest of them.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from pykka_delivery.coordinator import CoordinatorClient, LagInfo

logger = logging.getLogger("pipeline.lag")


@dataclass
class StageLag:
    """The largest lag seen during one stage."""

    samples: int = 0  # answers that had rows of the stage
    in_flight: int = 0  # the most messages in flight at one time, over the stage's streams
    partition_in_flight: int = 0  # the most in flight on one partition and producer
    partition: str = ""  # which one (its producer id: <stream>-<partition>:<group>@<producer>)
    oldest_age: float = 0.0  # the oldest unconfirmed message, seconds
    now: str = ""  # the last sample, for the progress bars


class LagWatch:
    """Asks the coordinator at ``address`` for the lag every ``interval`` seconds, on a
    thread of its own, and keeps for each stage (`watch`) the largest it saw on the
    streams whose names start with the stage's prefixes."""

    def __init__(self, address: str, interval: float = 1.0) -> None:
        self.address = address
        self.stages: dict[str, StageLag] = {}
        self.problem = ""  # why the lag could not be read, if it could not
        self._interval = interval
        self._lock = threading.Lock()
        self._stage = ""
        self._prefixes: tuple[str, ...] = ()
        self._stop = threading.Event()
        self._client = CoordinatorClient(address, owner="pipeline demo: lag")
        self._thread = threading.Thread(target=self._run, name="lag-watch", daemon=True)
        self._thread.start()

    def watch(self, stage: str, prefixes: tuple[str, ...]) -> None:
        """From now on, count the rows of streams starting with ``prefixes`` as ``stage``'s."""
        with self._lock:
            self._stage, self._prefixes = stage, prefixes
            self.stages.setdefault(stage, StageLag())

    def note(self) -> str:
        """The current stage's last sample, in a few words."""
        with self._lock:
            found = self.stages.get(self._stage)
            return found.now if found is not None else ""

    def close(self) -> None:
        """Stop sampling and close the client (before the coordinator stops)."""
        self._stop.set()
        self._thread.join()
        self._client.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                rows = self._client.lag(timeout=self._interval * 2)
            except Exception as error:  # a demo goes on without lag; the report says why
                if not self.problem:
                    logger.info("Cannot read the lag: %s", error)
                self.problem = f"{type(error).__name__}: {error}"
                continue
            self.problem = ""  # read again: the report need not say it could not be
            with self._lock:
                stage, prefixes = self._stage, self._prefixes
                if not stage:
                    continue
                mine = [r for r in rows if r.stream.startswith(prefixes)]
                if mine:
                    self._record(self.stages[stage], mine)

    @staticmethod
    def _record(lag: StageLag, rows: list[LagInfo]) -> None:
        lag.samples += 1
        total = sum(r.in_flight for r in rows)
        oldest = max(r.oldest_unconfirmed_age for r in rows)
        top = max(rows, key=lambda r: r.in_flight)
        lag.in_flight = max(lag.in_flight, total)
        if top.in_flight > lag.partition_in_flight:
            lag.partition_in_flight = top.in_flight
            lag.partition = top.producer_id
        lag.oldest_age = max(lag.oldest_age, oldest)
        lag.now = f"lag {total:,} (oldest {oldest:.1f} s)"
