"""Progress reporting: the library reports steps; the CLI decides how they look."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

Advance = Callable[[int], None]


class Reporter:
    """Silent by default; ``RichReporter`` draws bars on stderr."""

    def note(self, message: str) -> None:
        """A one-line status message."""

    @contextmanager
    def task(self, description: str, total: int, unit: str = "bytes") -> Iterator[Advance]:
        """A unit of work of ``total`` bytes (or other ``unit``s); yields a function that advances it."""
        yield lambda _n: None


class RichReporter(Reporter):
    """Progress bars and notes on stderr (never on stdout, which ``--json`` owns)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False)

    @contextmanager
    def task(self, description: str, total: int, unit: str = "bytes") -> Iterator[Advance]:
        """A bar with the amount done, the rate and the time remaining (``eta``).

        Arguments:
            description: the bar's label; total: the amount of work; unit: ``bytes`` or what else it counts.
        """
        counted: tuple[ProgressColumn, ...] = (DownloadColumn(), TransferSpeedColumn()) if unit == "bytes" else \
            (MofNCompleteColumn(), TextColumn(unit), TimeElapsedColumn())
        columns = (TextColumn("{task.description}"), BarColumn(), *counted, TextColumn("eta"), TimeRemainingColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            task_id = progress.add_task(description, total=total)
            yield lambda n: progress.advance(task_id, n)
        self.console.print(f"{description}: done", highlight=False)
