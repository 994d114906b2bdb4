"""One fit's event log and its failure (no Dask here).

Every part of a job's control state writes what happened here, in order: the dashboard, the
driver's fit result and the stall watch read it. Invariants: events are appended, never changed
or dropped; ``error`` is set once (the first failure names the cause; later ones are consequences)
and a ``job-failed`` event records it.
"""
from __future__ import annotations

from typing import Any, Callable


class EventLog:
    """The job's events and why it failed."""

    def __init__(self, clock: Callable[[], int]):
        #: the job's events (dicts with time, clock, kind, ...), oldest first
        self.events: list[dict[str, Any]] = []
        #: why the job failed (None while it runs)
        self.error: str | None = None
        #: the clock an event is labelled with when it names none (the job's clock being run)
        self._clock = clock

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
