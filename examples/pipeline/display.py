"""What the pipeline demo shows: progress bars while a stage runs and the final report,
rendered with rich.

On a terminal the bars are redrawn in place; when the output is a file or a pipe
(``make demo | cat``) rich draws no live display, so a snapshot of the bars is printed
every few seconds instead, and the report is plain text.
"""

from __future__ import annotations

import threading
from typing import Any

from lag_watch import StageLag
from rich.console import Console, Group
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

SNAPSHOT_EVERY = 5.0  # seconds between printed snapshots when the output is not a terminal

console = Console(highlight=False)


class _Rate(ProgressColumn):
    """Items per second over the last seconds (rich's own speed column counts bytes)."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text(f"{speed:,.0f}/s" if speed else "", style="progress.data.speed")


class StageProgress:
    """The bars of one stage: ``with StageProgress() as bars: bars.set(name, done, total)``.
    Each bar has a note (``note=``) printed after it: the lag the coordinator reports."""

    def __init__(self) -> None:
        # Without a terminal the snapshots are lines in a log: no bar, 80 columns.
        drawn = (BarColumn(bar_width=24),) if console.is_terminal else ()
        timed = (TimeElapsedColumn(),) if console.is_terminal else ()
        self._progress = Progress(
            TextColumn("  {task.description:<17}"),
            *drawn,
            MofNCompleteColumn(),
            TaskProgressColumn(),
            _Rate(),
            *timed,
            TextColumn("{task.fields[note]}"),
            console=console,
        )
        self._tasks: dict[str, TaskID] = {}
        self._stop = threading.Event()
        self._snapshots: threading.Thread | None = None

    def set(self, name: str, done: int, total: int, note: str | None = None) -> None:
        task = self._tasks.get(name)
        if task is None:
            self._tasks[name] = self._progress.add_task(
                name, total=total, completed=done, note=note or ""
            )
            return
        fields: dict[str, Any] = {} if note is None else {"note": note}
        self._progress.update(task, completed=done, total=total, **fields)

    def print(self, message: str) -> None:
        """A line above the bars (the bars stay below it)."""
        self._progress.console.print(message)

    def __enter__(self) -> StageProgress:
        self._progress.start()
        if not console.is_terminal:
            self._snapshots = threading.Thread(target=self._snapshot, daemon=True)
            self._snapshots.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._snapshots is not None:
            self._snapshots.join()
        self._progress.stop()  # draws the bars a last time

    def _snapshot(self) -> None:
        while not self._stop.wait(SNAPSHOT_EVERY):
            console.print(self._progress.make_tasks_table(self._progress.tasks))


def stage_title(text: str) -> None:
    console.print(f"[bold]{text}[/bold]")


def _lag_row(lag: StageLag | None) -> tuple[str, str, str]:
    if lag is None or not lag.samples:
        return "not reported", "-", "-"
    return (
        f"{lag.in_flight:,} in flight",
        f"{lag.partition_in_flight:,} ({lag.partition})" if lag.partition else "-",
        f"{lag.oldest_age:.1f} s",
    )


def report(figures: dict[str, Any]) -> None:
    """The final report: per stage what went in and came out, its throughput and the
    largest lag seen (``figures["lag_stages"]``); the fail-overs."""
    lag: dict[str, StageLag] = figures["lag_stages"]
    table = Table(title="Pipeline report", title_justify="left", show_lines=False)
    table.add_column("", style="bold")
    table.add_column("1: clicks → Spark", justify="right")
    table.add_column("2: Spark → consumers", justify="right")
    problem = figures["lag_problem"]
    stored = figures["totals_sent"] - figures["totals_lost"]
    counted = figures["clicks_sent"] - figures["clicks_lost"]
    one, two = _lag_row(lag.get("stage 1")), _lag_row(lag.get("stage 2"))
    rows = [
        ("sent", f"{figures['clicks_sent']:,} clicks", f"{figures['totals_sent']:,} totals"),
        ("received (distinct)", f"{counted:,}", f"{stored:,}"),
        (
            "lost / twice",
            f"{figures['clicks_lost']} / {figures['clicks_duplicates']}",
            f"{figures['totals_lost']} / {figures['totals_duplicates']}",
        ),
        (
            "totals check",
            _verdict(figures["totals_match_producers"], "equal the producers'"),
            _verdict(figures["totals_match_spark"], "equal Spark's"),
        ),
        (
            "throughput, end to end",
            f"{figures['stage1_msgs_per_s']:,} clicks/s",
            f"{figures['stage2_rows_per_s']:,} rows/s",
        ),
        ("time", f"{figures['stage1_seconds']:.1f} s", f"{figures['stage2_seconds']:.1f} s"),
        (
            "fail-overs",
            str(len(figures["stage1_failovers"])),
            str(len(figures["stage2_failovers"])),
        ),
        ("largest lag", one[0], two[0]),
        ("  on one partition", one[1], two[1]),
        ("  oldest unconfirmed", one[2], two[2]),
    ]
    for row in rows:
        table.add_row(*row)
    stored_by = ", ".join(f"{k} {v:,}" for k, v in sorted(figures["stored_by_consumer"].items()))
    counted_by = ", ".join(f"{k} {v:,}" for k, v in sorted(figures["clicks_by_producer"].items()))
    events = [f"  • {event}" for event in figures["stage1_failovers"] + figures["stage2_failovers"]]
    console.print()
    console.print(
        Group(
            table,
            Text(f"Distinct clicks counted per producer: {counted_by}"),
            Text(f"Stored per consumer: {stored_by}"),
            Text("Fail-overs:"),
            *(Text(e) for e in events or ["  none"]),
            Text(
                f"Lag: messages sent to a consumer and not yet confirmed, as "
                f"`{figures['lag_command']}` shows it, sampled about once a second "
                f"(CoordinatorClient.lag()); 'not reported' where no producer or consumer "
                f"of the stage reports positions."
                + (f" The lag could not be read: {problem}" if problem else "")
            ),
            Text(f"Total time {figures['seconds']} s"),
        )
    )


def _verdict(ok: bool, what: str) -> str:
    return f"[green]{what}[/green]" if ok else f"[red bold]NOT {what}[/red bold]"
