"""Checkpoint intervals chosen from measurements, and the rework a loss would cost now (no Dask here).

Young (1974) and Daly (2006): when a checkpoint costs the job ``c`` seconds and failures come
every ``M`` seconds on average, the interval between checkpoints that wastes least (the
checkpoints' own cost plus the work a failure throws away, half an interval on average) is
about ``sqrt(2 c M)``; Daly's higher-order terms matter only when ``c`` nears ``M``.

``IntervalPlanner`` applies it with what the job measures: ``c`` is the time the newest
checkpoints cost (the clock they stall while the owners snapshot, plus their background write,
counted in full: an upper bound when the write overlaps training), the interval is turned into
clocks by the median measured clock time, and ``M`` is configured (``mtbf``) or observed
(the job's running time over the workers it lost). Until a cost and an ``M`` are known the
configured ``every`` holds; it also checkpoints once early, so a cost is measured.

``rework_estimate`` is the live figure shown with every clock: under full recovery a loss
now rolls every table back to the newest checkpoint, so it costs the checkpoint's age in
clocks. Under partial recovery only the lost worker's partitions go back; SCAR bounds the
rework by the size of that perturbation, and to first order it scales with it: the estimate is
the age times the largest share one worker holds of the change not yet saved (each owner's
``||current - saved||`` measured when the newest checkpoint was taken, before it saved).
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

#: measured checkpoint costs and clock times kept (the newest)
WINDOW = 8
#: with ``interval="auto"``: the first checkpoint is taken after this clock, to measure a cost
FIRST_AUTO_CLOCK = 1


def young_daly_s(cost_s: float, mtbf_s: float) -> float:
    """Seconds between checkpoints that waste least: ``sqrt(2 cost MTBF)``."""
    if cost_s < 0 or mtbf_s <= 0:
        raise ValueError("cost must be >= 0 and MTBF > 0")
    return math.sqrt(2.0 * cost_s * mtbf_s)


def expected_waste(period_clocks: float, clock_s: float, cost_s: float, mtbf_s: float,
                   rework_clocks: float | None = None) -> float:
    """Fraction of the job's time lost to checkpoints and failures at a checkpoint period: the
    checkpoints' cost per second of training, plus a failure's rework (default: half a period,
    full recovery) per MTBF."""
    period_s = period_clocks * clock_s
    rework = period_clocks / 2.0 if rework_clocks is None else rework_clocks
    return cost_s / period_s + rework * clock_s / mtbf_s


@dataclass
class IntervalPlanner:
    """The checkpoint period in clocks, from measured costs and clock times and an MTBF."""

    #: clocks between checkpoints until a cost and an MTBF are known (the configured ``every``)
    default_period: float
    #: configured mean time between failures, seconds (None: observed from the job's losses)
    mtbf_s: float | None = None
    #: seconds each of the newest checkpoints cost the job
    costs: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    #: wall seconds of the newest clocks
    clock_s: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    #: when the job's first clock began (None before), and the workers lost since
    started: float | None = None
    losses: int = 0
    #: the clock after which the next checkpoint is due
    next_due: float = FIRST_AUTO_CLOCK
    #: the clock after which the newest checkpoint was taken (None: none yet)
    last_taken: int | None = None

    def record_clock(self, seconds: float) -> None:
        if seconds > 0 and math.isfinite(seconds):
            self.clock_s.append(float(seconds))

    def record_cost(self, seconds: float) -> None:
        if seconds >= 0 and math.isfinite(seconds):
            self.costs.append(float(seconds))

    def record_loss(self) -> None:
        self.losses += 1

    def mtbf(self, now: float) -> tuple[float | None, str]:
        """The MTBF in seconds and where it comes from ("configured", "observed" or "unknown")."""
        if self.mtbf_s is not None:
            return self.mtbf_s, "configured"
        if self.losses:
            return max(now - (now if self.started is None else self.started), 1e-9) / self.losses, "observed"
        return None, "unknown"

    def period(self, now: float) -> dict:
        """The period in clocks and what chose it: ``{"period", "source", "cost_s", "clock_s", "mtbf_s"}``."""
        mtbf, source = self.mtbf(now)
        cost = statistics.median(self.costs) if self.costs else None
        clock = statistics.median(self.clock_s) if self.clock_s else None
        out = {"cost_s": cost, "clock_s": clock, "mtbf_s": mtbf, "mtbf_source": source}
        if mtbf is None or cost is None or clock is None:
            return {**out, "period": float(self.default_period), "source": "configured every"}
        return {**out, "period": float(max(1.0, round(young_daly_s(cost, mtbf) / clock))), "source": "young-daly"}

    def due(self, clock: int) -> bool:
        """Whether a checkpoint is due after ``clock``."""
        return clock >= self.next_due - 1e-9

    def taken(self, clock: int) -> None:
        """A checkpoint was taken after ``clock``: the next is due one period later (``replan``)."""
        self.last_taken = clock

    def abandoned(self) -> None:
        """The newest version will never complete (a writer was lost): take one at the next clock end."""
        self.next_due = 0

    def replan(self, now: float) -> dict:
        """Choose the period again (a cost was measured, a worker lost): the next checkpoint is
        due one period after the newest."""
        choice = self.period(now)
        if self.last_taken is not None:
            self.next_due = self.last_taken + choice["period"]
        return choice


@dataclass
class FixedSchedule:
    """``interval="fixed"``: a checkpoint every ``period`` clocks (``CheckpointConfig.due``), behind
    the planner's interface, so the job asks one object whether one is due."""

    #: the store's configuration (its ``due``)
    cfg: object

    def due(self, clock: int) -> bool:
        return self.cfg.due(clock)

    def record_clock(self, seconds: float) -> None: ...

    def record_cost(self, seconds: float) -> None: ...

    def record_loss(self) -> None: ...

    def taken(self, clock: int) -> None: ...

    def abandoned(self) -> None: ...

    def replan(self, now: float) -> None:
        """Nothing to choose: the period is fixed."""
        return None


def rework_estimate(age_clocks: int, recovery: str, unsaved_sq: dict[str, float], memory: bool = False) -> float:
    """Clocks a loss now would cost (an estimate, shown live): the checkpoint's age under full
    recovery; under partial, the age times the largest share one worker holds of the unsaved
    change (``unsaved_sq``: each owner's squared norm of current minus saved, at the newest
    checkpoint), the age at most 1 with the memory tier (a buddy's copy is of the last clock)."""
    if age_clocks <= 0:
        return 0.0
    if recovery == "full":
        return float(age_clocks)
    if memory:
        age_clocks = min(age_clocks, 1)
    total = math.sqrt(sum(unsaved_sq.values())) if unsaved_sq else 0.0
    if total <= 0:
        return float(age_clocks) / max(len(unsaved_sq), 1) if unsaved_sq else float(age_clocks)
    return float(age_clocks) * max(math.sqrt(v) for v in unsaved_sq.values()) / total
