"""Per-worker speed over a sliding window, and straggler classification (no Dask here).

The coordinator feeds it one ``record`` per finished attempt — committed or not:
a backup that wins a slow worker's shard must not hide how slow that worker is —
with the attempt's step time (injected slowdowns included), and asks it at each
clock's end who is slow.

* a worker's first attempt of a job is its *warm-up*: it pays one-time costs
  (compiling kernels, filling caches) and is compared only with the other
  workers' warm-ups, never mixed into its step time;
* a worker's *step time* is the median of its last ``window`` attempts after the
  warm-up (a median: one garbage-collection pause or one cold cache is not a trend);
* a worker is a *straggler* while its step time is more than ``1 / fraction``
  times the median of the *other* workers' step times and longer by at least
  ``min_gap_s`` (noise on millisecond steps is not a straggler), or while the
  work item it is running has lasted that long already per shard and at least
  ``stuck_after_s`` in all (a worker that stopped finishing is slow too, and a
  backup that wins its shards must not hide it; but a one-off pause of a fraction
  of a second, a kernel loaded on first use or a collection, spans many short
  clocks and is not a straggler); a worker still in its warm-up is held against
  the others' warm-ups;
* a worker is reported as a straggler once it has been slow at ``confirm_after``
  consecutive clock ends (one slow clock on a busy machine is noise, not a straggler);
  it is *persistent* once slow for ``persistent_after`` consecutive clocks, else
  *transient*.

Comparing with the others, not with a median that includes the worker itself,
is what lets a 2x slower worker be seen among 2 workers as among 16.
"""
from __future__ import annotations

import bisect
import statistics
from array import array
from collections import defaultdict
from dataclasses import dataclass

from .workers import WorkerRecord, WorkerRecords


#: the parts of an attempt's timings (``ShardRunner._attempt``) that are the worker's own step: not
#: ``data_s`` (a shard's data moving to the worker is not its slowness), not ``compute_cpu_s`` (a part
#: of ``compute_s``: the step's CPU, less than its wall time while it waits for a core)
STEP_PARTS = ("pull_s", "compute_s", "push_s")


def step_seconds(timings: dict[str, float]) -> float:
    """An attempt's step time, as the monitor records it."""
    get = timings.get  # (the parts of ``STEP_PARTS`` summed in its order, without a generator: every commit asks)
    return float(get("pull_s", 0.0) + get("compute_s", 0.0) + get("push_s", 0.0))


@dataclass(frozen=True)
class WorkerStats:
    worker: str
    shards: int  # attempts in the window
    mean_step_s: float  # the typical (median) step time over the window
    speed: float  # shards per second of busy time
    straggler: str | None  # None, "transient" or "persistent"


class ThroughputMonitor:
    def __init__(self, *, window: int = 8, fraction: float = 0.6, persistent_after: int = 3,
                 min_gap_s: float = 0.002, confirm_after: int = 2, stuck_after_s: float = 1.0):
        if not 0 < fraction < 1:
            raise ValueError(f"straggler fraction must be in (0, 1), got {fraction}")
        if window < 1 or persistent_after < 1 or confirm_after < 1:
            raise ValueError("window, persistent_after and confirm_after must be >= 1")
        if confirm_after > persistent_after:
            raise ValueError("confirm_after must be <= persistent_after")
        if min_gap_s < 0 or stuck_after_s < 0:
            raise ValueError(f"min_gap_s and stuck_after_s must be >= 0, got {min_gap_s}, {stuck_after_s}")
        #: attempts per worker the step time is taken over
        self.window = window
        #: a straggler's speed is below this fraction of the others'
        self.fraction = fraction
        #: consecutive slow clocks that make a straggler persistent
        self.persistent_after = persistent_after
        #: a straggler's step is at least this much longer than the others' (seconds)
        self.min_gap_s = min_gap_s
        #: consecutive slow clocks before a worker is reported as a straggler
        self.confirm_after = confirm_after
        #: a running work item is evidence of slowness once it has run this long (seconds)
        self.stuck_after_s = stuck_after_s
        #: worker -> its record (``dscar.core.workers``): its warm-up step (``warmup``), its last ``window``
        #: step times after it, oldest first (``steps``: an array of doubles, one block a worker; not a
        #: ``deque(maxlen=window)``, which allocates a block of 64 slots, ~760 bytes a worker, 3 MB of cold
        #: memory at 4,096 workers; nor a list, whose floats are objects of their own, each made at its
        #: commit), and their median (``mean``, kept as steps arrive: asked on every hand-out). The job's
        #: dispatch keeps its own fields of each worker in the same records: a commit reads one
        self.records = WorkerRecords()
        self._slow_clocks: dict[str, int] = defaultdict(int)  # consecutive clocks as a straggler
        #: how many workers have a ``mean``
        self._n_measured = 0
        #: the mean step of every worker with one, sorted: the slowest and the median without a scan (floats,
        #: not (mean, worker) pairs: the statistics read values only, and a float compares and moves
        #: cheaper; which worker holds a value is its record's)
        self._by_step: list[float] = []
        #: the summed speeds of the measured workers, kept as their step times change
        self._speed_sum = 0.0
        #: ``median_step()`` since ``_by_step`` last changed (False: not known): an idle poll asks the
        #: backup policy, which asks it, far more often than a worker's mean step changes
        self._median: float | None | bool = False
        #: raised by every change of a worker's typical step time (``median_step`` and the rest read those)
        self.changes = 0

    def record(self, worker: str, step_s: float, record: WorkerRecord | None = None) -> None:
        """``worker`` took ``step_s`` for a step. ``record``: its record, when the caller has it at hand
        (a commit read it already: a second read of a dict of W workers is one more cold read)."""
        step_s = float(step_s)
        if step_s < 1e-9:  # (``max(step_s, 1e-9)`` as a comparison: every commit records)
            step_s = 1e-9
        if record is None:
            record = self.records[worker]
        steps = record.steps  # (a worker with steps is past its warm-up)
        if steps is None:
            if record.warmup is None:
                record.warmup = step_s
                return
            steps = record.steps = array("d")
        steps.append(step_s)
        if len(steps) > self.window:
            gone = steps[0]
            del steps[0]
            # the middle pair of the sorted window (so its median) stands when the step that left it and the one
            # that came are equal, or both below the pair, or both above it: no sort (most commits)
            if gone == step_s or (gone < record.low and step_s < record.low) or (
                    gone > record.high and step_s > record.high):
                return
        ordered = sorted(steps)  # (the median of a few: ``statistics.median`` costs more than it)
        n = len(ordered)
        half = n // 2
        record.low, record.high = low, high = ordered[(n - 1) // 2], ordered[half]
        mean = high if n % 2 else (low + high) / 2
        if record.mean != mean:
            self._set_mean(record, mean)

    def _set_mean(self, record: WorkerRecord | None, mean: float | None) -> None:
        """``record``'s worker's typical step is ``mean`` now (None: none; ``record`` None: a worker never seen)."""
        self._median = False
        self.changes += 1
        old = None if record is None else record.mean
        if old is not None:
            del self._by_step[bisect.bisect_left(self._by_step, old)]  # (a copy of ``old``: any one is)
            self._speed_sum -= 1.0 / old
            self._n_measured -= 1
        if mean is not None:
            record.mean = mean  # type: ignore[union-attr]
            bisect.insort(self._by_step, mean)
            self._speed_sum += 1.0 / mean
            self._n_measured += 1
        elif record is not None:
            record.mean = None
        if not self._n_measured:
            self._speed_sum = 0.0

    def forget(self, worker: str) -> None:
        record = self.records.get(worker)
        if record is not None:
            record.warmup = record.steps = None
        self._slow_clocks.pop(worker, None)
        self._set_mean(record, None)

    def mean_step(self, worker: str) -> float | None:
        """The worker's typical step time (median over the window), None before its first attempt."""
        record = self.records.get(worker)
        return None if record is None else record.mean

    def _seen(self) -> list[str]:
        """The workers with a step recorded (a warm-up, or more), in the order their records were made."""
        return [w for w, r in self.records.items() if r.warmup is not None]

    def median_step(self, exclude: str | None = None) -> float | None:
        """Median over workers (but ``exclude``) of their typical step time."""
        if exclude is None and self._median is not False:
            return self._median
        steps = self._by_step  # (sorted: the median by position, a copy of ``exclude``'s value skipped)
        mine = None if exclude is None else self.mean_step(exclude)
        skip = None if mine is None else bisect.bisect_left(steps, mine)
        n = len(steps) - (skip is not None)
        if n == 0:
            return None

        def nth(i: int) -> float:
            return steps[i if skip is None or i < skip else i + 1]

        median = nth(n // 2) if n % 2 else (nth(n // 2 - 1) + nth(n // 2)) / 2
        if skip is None:
            self._median = median
        return median

    def n_measured(self) -> int:
        """Workers with a typical step time."""
        return self._n_measured

    def slowest_step(self, exclude: str) -> float | None:
        """The longest typical step time of the workers but ``exclude`` (None: none measured)."""
        steps = self._by_step
        if not steps:
            return None
        if self.mean_step(exclude) != steps[-1]:
            return steps[-1]
        return steps[-2] if len(steps) > 1 else None  # (``exclude`` holds the largest: the next one, maybe equal)

    def outlasts_others(self, worker: str, n: int, margin_s: float) -> bool:
        """Whether ``worker``'s typical step is longer than the other measured workers take to run ``n``
        steps between them (``n`` over their summed speed) plus the slowest one's step plus ``margin_s``
        (False while it, or fewer than two workers, is not measured). ``Dispatch.leave_to_others``' rule,
        asked on nearly every poll of a worker that started a shard in the pass: one call, O(1)."""
        record = self.records.get(worker)  # (``mean_step``, inline: nearly every poll asks)
        mine = None if record is None else record.mean
        if mine is None or self._n_measured < 2:
            return False
        steps = self._by_step  # (``slowest_step(worker)``, inline: two or more measured)
        slowest = steps[-1] if mine != steps[-1] else steps[-2]
        return mine > n / (self._speed_sum - 1.0 / mine) + slowest + margin_s

    def pass_share(self, worker: str, n_workers: int, n_shards: int) -> tuple[float | None, int]:
        """``worker``'s typical step (None before its first attempt: then a share of 0), and how many of a
        pass's ``n_shards`` it runs by its speed's share of the ``n_workers`` live workers' (one not measured
        yet counted as fast as it): a worker with k shards a clock gets them in one item, so they cost one
        grant and one commit, not k (``Dispatch.batch_size``). A slow worker's share is small, and members it
        has not started are released to a worker that runs out (``Dispatch.ask_back``). One call: every
        hand-out asks."""
        record = self.records.get(worker)
        step = None if record is None else record.mean
        if step is None:
            return None, 0
        speed = 1.0 / step
        unmeasured = n_workers - self._n_measured
        if unmeasured < 0:
            unmeasured = 0
        total = self._speed_sum + unmeasured * speed
        return step, round(n_shards * speed / total) if total > 0 else 1

    def total_speed(self) -> float:
        """The summed speeds (shards per second) of every measured worker."""
        return self._speed_sum

    def speeds(self) -> dict[str, float]:
        return {w: 1.0 / m for w, r in self.records.items() if (m := r.mean)}

    def is_slow(self, worker: str, running_s: float = 0.0) -> bool:
        """``running_s``: a lower bound on the step time of the work item ``worker`` is running."""
        record = self.records.get(worker)
        if record is None or record.warmup is None:  # still in its warm-up: like is compared with like
            warmups = [r.warmup for w, r in self.records.items() if r.warmup is not None and w != worker]
            others, own = (statistics.median(warmups) if warmups else None), running_s
        else:
            others, own = self.median_step(exclude=worker), max(self.mean_step(worker) or 0.0, running_s)
        if others is None:
            return False
        return own * self.fraction > others and own - others >= self.min_gap_s

    def end_clock(self, running: dict[str, tuple[float, int]] | None = None) -> dict[str, str]:
        """Close a clock: update the consecutive-slow counters; return the stragglers.
        ``running``: per busy worker, ``(seconds, shards)`` of the work item it is running."""
        running = {w: t / max(n, 1) for w, (t, n) in (running or {}).items() if t >= self.stuck_after_s}
        out = {}
        for w in {*self._seen(), *running}:
            if self.is_slow(w, running.get(w, 0.0)):
                self._slow_clocks[w] += 1
                if self._slow_clocks[w] >= self.confirm_after:
                    out[w] = "persistent" if self._slow_clocks[w] >= self.persistent_after else "transient"
            else:
                self._slow_clocks[w] = 0
        return dict(sorted(out.items()))  # (in workers' order, not the hash order of the set above)

    def stats(self) -> list[WorkerStats]:
        speeds = self.speeds()
        out = []
        for w in sorted(self._seen()):
            slow = self._slow_clocks.get(w, 0)
            kind = None if slow < self.confirm_after else (
                "persistent" if slow >= self.persistent_after else "transient")
            m = self.mean_step(w)
            out.append(WorkerStats(w, len(self.records[w].steps or ()), m or 0.0, speeds.get(w, 0.0), kind))
        return out
