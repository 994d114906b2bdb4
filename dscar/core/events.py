"""One fit's event log and its failure (no Dask here).

Every part of a job's control state writes what happened here, in order: the dashboard, the
driver's fit result and the stall watch read it. Invariants: events are appended, never changed;
an event's index (its place in the whole log, ``count`` before it was added) never changes;
``error`` is set once (the first failure names the cause; later ones are consequences) and a
``job-failed`` event records it.

The log is bounded by its reader, not by a size: the driver fetches the events from its cursor on
(``since``) with every wait, so those below the cursor are its own (``FitResult.events``) and may go
(``trim``), except the newest ``KEEP_NEWEST`` (the dashboard's snapshots show the newest) and those
from the oldest ``pin`` on (a recovery reads its own events when it ends). A fit of 10,000 clocks
at a thousand workers logs hundreds of thousands of events; kept whole, the scheduler's memory
would grow with the fit's length. Nothing is dropped that the driver has not received.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable

#: events kept whatever the driver has read: the newest, which the dashboard's snapshots carry
KEEP_NEWEST = 1_000


class EventLog:
    """The job's events and why it failed."""

    def __init__(self, clock: Callable[[], int], keep_newest: int | None = None):
        #: the job's events still held (dicts with time, clock, kind, ...), oldest first: those from index ``first`` on
        self.events: list[dict[str, Any]] = []
        #: the index of ``events[0]``: how many older events were trimmed (the driver has them)
        self.first = 0
        #: why the job failed (None while it runs)
        self.error: str | None = None
        #: the clock an event is labelled with when it names none (the job's clock being run)
        self._clock = clock
        #: how many of the newest events ``trim`` always keeps
        self._keep_newest = KEEP_NEWEST if keep_newest is None else int(keep_newest)
        #: index -> how many readers pinned it: events from the smallest on are kept (``pin``)
        self._pins: Counter[int] = Counter()

    def add(self, now: float, kind: str, *, clock: int | None = None, **info: Any) -> None:
        """Record ``kind`` at ``now``, labelled with ``clock`` (default: the job's clock)."""
        self.events.append({"time": now, "clock": self._clock() if clock is None else clock, "kind": kind, **info})

    def fail(self, now: float, error: str) -> None:
        """The job failed: the first cause is kept."""
        if self.error is None:
            self.error = error
            self.add(now, "job-failed", error=error)

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def count(self) -> int:
        """Every event ever added, trimmed or not: the index the next one gets."""
        return self.first + len(self.events)

    def since(self, index: int) -> list[dict[str, Any]]:
        """The events from ``index`` on (a reader's cursor); one below ``first`` was trimmed, which only
        a cursor the driver already moved past can be: the held ones are returned."""
        return self.events[max(0, int(index) - self.first):]

    def pin(self) -> int:
        """Keep the events from now on until ``unpin`` of the index returned (``count``)."""
        index = self.count
        self._pins[index] += 1
        return index

    def unpin(self, index: int) -> None:
        self._pins[index] -= 1
        if self._pins[index] <= 0:
            del self._pins[index]

    def trim(self, upto: int) -> int:
        """The driver holds the events below ``upto``: drop them, but for the newest ``KEEP_NEWEST`` and
        those from the oldest pin on. Returns how many were dropped."""
        cut = min(int(upto), self.count - self._keep_newest, min(self._pins, default=self.count)) - self.first
        if cut <= 0:
            return 0
        del self.events[:cut]
        self.first += cut
        return cut
