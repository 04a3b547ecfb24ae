"""Progress of a phase on stderr: a bar on a terminal, a line every LOG_EVERY_S seconds in a log.

Imports click alone: the command line reads it before any command runs (`lzsolve --help`
imports no torch), and the pipeline's phases (lzsolve/pipeline.py) draw their bars with it.
"""
from __future__ import annotations

import sys
import time

import click

LOG_EVERY_S = 30.0  # progress lines when stderr is not a terminal (CI logs)


class _LogProgress:
    """click.progressbar's interface for logs: a line every LOG_EVERY_S seconds and one at the end,
    instead of a bar redrawn with carriage returns."""

    def __init__(self, length: int, label: str):
        self.length, self.label, self.done = length, label, 0
        self.started = self.last = time.monotonic()

    def __enter__(self):
        return self

    def update(self, n: int, item: str | None = None) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= LOG_EVERY_S:
            self.last = now
            self._line(f"{self._count()}, {now - self.started:.0f} s" + (f": {item}" if item else ""))

    def _count(self) -> str:
        if not self.length:
            return f"{self.done} done"
        return f"{self.done}/{self.length} ({100 * self.done / self.length:.0f}%)"

    def _line(self, text: str) -> None:
        click.echo(f"{self.label} {text}", err=True)

    def __exit__(self, *exc):
        self._line(f"{self._count()} in {time.monotonic() - self.started:.0f} s" + (" (stopped)" if exc[0] else ""))


def progress(length: int, label: str):
    """A progress bar on a terminal, periodic lines otherwise."""
    if sys.stderr.isatty():
        return click.progressbar(length=length, label=label, show_eta=bool(length), show_pos=True,
                                 item_show_func=lambda s: s, file=sys.stderr)
    return _LogProgress(length, label)


def add_measurements(bar, planned: int, label: str, measurements: int) -> None:
    """Measurements a phase adds once it has begun (validation's second rounds, around its losses): the
    total grows, and the label says by how much ("validating (120 planned +36)"), so that a percentage
    that falls back says why."""
    bar.length += measurements
    bar.label = f"{label} ({planned} planned +{bar.length - planned})"
