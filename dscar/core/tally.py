"""What each clock did: shards per worker, step timings, stage times, metrics (no Dask here).

``ClockTally`` is the part of a job's control state that counts a clock's work for its report
(the driver's fit result, the dashboard, bench figures). Under BSP one clock runs at a time: the
``shards_done`` / ``timings`` / ``stage_s`` of the clock being run. Under SSP several clocks run
at once: each open clock has its own entry in ``per_clock`` until its report is made, and
``reports`` keeps finished clocks' reports until the driver has read a newer one.

Invariants: a committed attempt is counted once, in the clock it ran in; a rebuild attempt is
not counted (it is no clock's work); ``objectives`` lists completed clocks in order, skipped
clocks (no objective) left out.
"""
from __future__ import annotations

import math
from typing import Any


#: clocks whose finish times ``ClockTally.finished_at`` keeps (at least)
FINISHED_KEPT = 256


def add_timings(sums: dict[str, float], timings: dict | None) -> None:
    """Add an attempt's ``timings`` (name -> seconds) into ``sums``."""
    for k, v in (timings or {}).items():
        sums[k] = sums.get(k, 0.0) + float(v)


def sum_timings(sums: dict[str, dict[str, float]], notes: list[tuple[str, dict | None]]) -> None:
    """Add each noted ``(worker, timings)`` of committed attempts, in order, into ``sums`` (worker -> summed timings)."""
    for worker, timings in notes:
        add_timings(sums.setdefault(worker, {}), timings)


class ClockTally:
    """Per-clock counts and reports for one fit."""

    def __init__(self) -> None:
        #: this clock's metrics (when DONE)
        self.metrics: dict[str, float] = {}
        #: (clock, objective) of every completed clock, in order (skipped clocks have none)
        self.objectives: list[tuple[int, float]] = []
        #: worker -> shards committed this clock
        self.shards_done: dict[str, int] = {}
        #: worker -> summed attempt timings this clock (``timings``), less those still ``_noted``
        self._timings: dict[str, dict[str, float]] = {}
        #: (worker, timings) of this clock's commits not yet summed into ``_timings``: a commit notes its own
        #: (one append), and a read of ``timings`` sums them. Summed at each commit, it read its worker's
        #: entry in a dict of W workers and that worker's sums, cold at thousands of workers
        self._noted: list[tuple[str, dict | None]] = []
        #: wall seconds per stage this clock ("shards", "apply", "clock_end", "rebuild", "shards:<phase>", ...)
        self.stage_s: dict[str, float] = {}
        #: when the stage being run began (0: none yet) and when this clock began
        self.stage_t0 = 0.0
        self.clock_t0 = 0.0
        #: SSP: clock -> {"t0": first hand-out, "commits": [(worker, timings) of each committed attempt]}
        self.per_clock: dict[int, dict[str, Any]] = {}
        #: SSP: clock -> its report for the driver, once finished (kept until a newer one is read)
        self.reports: dict[int, dict[str, Any]] = {}
        #: clock -> when its clock end reported (the coordinator's wall time), for the newest ``FINISHED_KEPT``
        #: clocks: a driver that reads several reports at once times each clock by these, not by their arrival
        self.finished_at: dict[int, float] = {}

    @property
    def timings(self) -> dict[str, dict[str, float]]:
        """worker -> summed attempt timings this clock (BSP)."""
        self._sum_noted()
        return self._timings

    @timings.setter
    def timings(self, value: dict[str, dict[str, float]]) -> None:
        self._sum_noted()  # (the notes go to the dict they belong to: a read before may hold it)
        self._timings = value

    def _sum_noted(self) -> None:
        """The commits noted go into ``_timings``."""
        if self._noted:
            sum_timings(self._timings, self._noted)
            self._noted = []

    def begin(self, now: float) -> None:
        """A clock begins (BSP): its counts start from zero."""
        self.metrics, self.shards_done, self.timings, self.stage_s = {}, {}, {}, {}
        self.stage_t0 = self.clock_t0 = now

    def book_stage(self, names: list[str], now: float) -> None:
        """The stage that began at ``stage_t0`` ended at ``now``: its time goes to each of ``names``
        (none: the stage is not timed); the next stage begins now."""
        if names and self.stage_t0:
            dt = now - self.stage_t0
            for name in names:
                self.stage_s[name] = self.stage_s.get(name, 0.0) + dt
        self.stage_t0 = now

    def committed(self, worker: str, timings: dict | None) -> None:
        """An attempt of ``worker`` committed this clock (BSP): its timings count (noted; summed when read)."""
        self._noted.append((worker, timings))

    def pass_counted(self, committed_by: dict[str, int]) -> None:
        """A data pass completed (BSP): its commits per worker count for this clock."""
        for w, n in committed_by.items():
            self.shards_done[w] = self.shards_done.get(w, 0) + n

    def finished(self, clock: int, metrics: dict, now: float) -> None:
        """Clock ``clock``'s clock-end step reported ``metrics`` at ``now``."""
        self.metrics = dict(metrics)
        self.finished_at[clock] = now
        if len(self.finished_at) > 2 * FINISHED_KEPT:  # (the driver reads in order, a few clocks behind at most)
            for c in [c for c in self.finished_at if c <= clock - FINISHED_KEPT]:
                del self.finished_at[c]
        if math.isfinite(float(metrics.get("objective", math.nan))):
            self.objectives.append((clock, float(metrics["objective"])))

    # -------------------------------------------------------------------- SSP
    def open(self, clock: int, now: float) -> None:
        """A shard of ``clock`` is handed out (SSP): the clock's count starts at its first."""
        if clock not in self.per_clock:
            self.per_clock[clock] = {"t0": now, "commits": []}

    def started(self, clock: int, now: float) -> float:
        """When ``clock``'s first shard was handed out (SSP; ``now`` if none was)."""
        return self.per_clock.get(clock, {}).get("t0", now)

    def committed_in(self, clock: int, worker: str, timings: dict | None) -> None:
        """An attempt of ``worker`` in ``clock`` committed (SSP): noted, and counted when the clock's report
        is made (``close``). Counted here, each commit read its worker's entries in two dicts of W workers
        and its sums' dict, cold at thousands of workers; a note is one append to the clock's list."""
        t = self.per_clock.get(clock)
        if t is not None:
            t["commits"].append((worker, timings))

    def close(self, clock: int) -> tuple[dict[str, int], dict[str, dict[str, float]]]:
        """``clock``'s counts, for its report (SSP): shards per worker and summed timings, in commit order."""
        done: dict[str, int] = {}
        sums: dict[str, dict[str, float]] = {}
        commits = self.per_clock.pop(clock, {}).get("commits", ())
        for worker, _ in commits:
            done[worker] = done.get(worker, 0) + 1
        sum_timings(sums, commits)
        return done, sums

    def report_for(self, clock: int, drop_older: bool = True) -> dict | None:
        """``clock``'s report once finished; older reports are dropped (the driver reads in order, and asks for
        ``clock`` holding every older one), unless ``drop_older`` is False (reports sent ahead of the ask)."""
        if clock not in self.reports:
            return None
        if drop_older:
            for c in [c for c in self.reports if c < clock]:
                del self.reports[c]
        return self.reports[clock]
