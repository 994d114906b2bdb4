"""Per-worker speed over a sliding window, and straggler classification (no Dask here).

The coordinator feeds it one ``record`` per committed attempt (the attempt's
step time, injected slowdowns included) and asks it, at any time, who is slow.

* speed of a worker = 1 / its mean step time over its last ``window`` commits;
* a worker is a *straggler* while its speed is below ``fraction`` x the median
  speed, or while its running attempt has lasted longer than 1 / (``fraction``
  x median speed) (a worker that stopped committing is slow too);
* a straggler is *persistent* once it has been one for ``persistent_after``
  consecutive clocks, else *transient*.
"""
from __future__ import annotations

import statistics
from collections import defaultdict, deque
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerStats:
    worker: str
    shards: int  # commits in the window
    mean_step_s: float
    speed: float  # shards per second of busy time
    straggler: str | None  # None, "transient" or "persistent"


class ThroughputMonitor:
    def __init__(self, *, window: int = 8, fraction: float = 0.5, persistent_after: int = 3):
        if not 0 < fraction < 1:
            raise ValueError(f"straggler fraction must be in (0, 1), got {fraction}")
        if window < 1 or persistent_after < 1:
            raise ValueError("window and persistent_after must be >= 1")
        self.window, self.fraction, self.persistent_after = window, fraction, persistent_after
        self._steps: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=self.window))
        self._slow_clocks: dict[str, int] = defaultdict(int)  # consecutive clocks as a straggler

    def record(self, worker: str, step_s: float) -> None:
        self._steps[worker].append(max(float(step_s), 1e-9))

    def forget(self, worker: str) -> None:
        self._steps.pop(worker, None)
        self._slow_clocks.pop(worker, None)

    def mean_step(self, worker: str) -> float | None:
        s = self._steps.get(worker)
        return sum(s) / len(s) if s else None

    def median_step(self) -> float | None:
        """Median over workers of their mean step time (the typical shard time)."""
        means = [m for w in self._steps if (m := self.mean_step(w)) is not None]
        return statistics.median(means) if means else None

    def speeds(self) -> dict[str, float]:
        return {w: 1.0 / m for w in self._steps if (m := self.mean_step(w))}

    def is_slow(self, worker: str, running_s: float = 0.0) -> bool:
        speeds = self.speeds()
        if len(speeds) < 2:
            return False
        med = statistics.median(speeds.values())
        too_long = running_s * med * self.fraction > 1.0
        return speeds.get(worker, med) < self.fraction * med or too_long

    def end_clock(self, running: dict[str, float] | None = None) -> dict[str, str]:
        """Close a clock: update the consecutive-slow counters; return the stragglers."""
        running = running or {}
        out = {}
        for w in list(self._steps):
            if self.is_slow(w, running.get(w, 0.0)):
                self._slow_clocks[w] += 1
                out[w] = "persistent" if self._slow_clocks[w] >= self.persistent_after else "transient"
            else:
                self._slow_clocks[w] = 0
        return out

    def stats(self) -> list[WorkerStats]:
        speeds = self.speeds()
        out = []
        for w in sorted(self._steps):
            slow = self._slow_clocks.get(w, 0)
            kind = None if not slow else ("persistent" if slow >= self.persistent_after else "transient")
            m = self.mean_step(w)
            out.append(WorkerStats(w, len(self._steps[w]), m or 0.0, speeds.get(w, 0.0), kind))
        return out
