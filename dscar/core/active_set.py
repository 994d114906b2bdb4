"""How many of the cluster's workers a fit keeps active (``dscar.active-workers``: "auto"); the others
stand by (pure: no Dask here).

A worker is not free. Every clock each active worker is handed work, commits it, applies its
partitions' updates and takes part in the clock end: a fixed cost a clock that its share of the
step work must pay for (issue 43: on 2 cores, LDA K=20 on Reuters, ALS on 20k ratings and MLR on
digits ran 1.25-3x slower on 2 workers than on 1). So a fit whose work per clock is small runs on
fewer workers, and a large one on all of them.

The model of a clock on ``k`` active workers (``predicted_clock_s``): the step work (every shard
step's seconds, ``monitor.step_seconds`` of the attempts' timings) split ``k`` ways; plus, once a clock
spans more than one worker process, a cross-worker cost (``CROSS_WORKER_COST_S``: pulls from another
owner's partitions, staged updates fetched across, the clock end's reads of other owners); plus a
per-worker part paid ``k`` times (the scheduler's serial share of each worker's commits and applies).
The step work and the per-worker part are measured on the fit's first clock (``measured_costs``).
Only the serial part grows with ``k``: a model that charged the whole cross-worker cost to every worker
would shrink a fit of 100 ms steps on 256 workers to about 100 of them (bench.hollow measures ~1 ms a
worker a clock at W = 256 on 2 cores, not 10).
The rule (``choose``):

* candidates run from ``floor`` (what the data needs: the fewest workers whose memory holds the
  tables, or the user's minimum) to ``ceiling`` (the workers there are, at most one per shard);
* the count that minimises the predicted clock wins, but the current count changes only when the
  winner's predicted clock is at least ``MIN_GAIN`` shorter: the model leaves out what a second
  worker adds that a one-worker clock cannot show (pulls from another owner's partitions, cores
  shared with the scheduler), and a change is made once, never undone by noise;
* the count a fit starts with (``initial_count``) comes from the data's size at the cheapest
  measured step rate (``shard_count.STEP_S_PER_MIB``), so it errs toward fewer workers; the first
  clock's measurement then corrects it, once (the coordinator: ``Elastic.resize``).
  A default shard count is chosen for the count a fit starts on (``driver.active_start``), so such a
  fit grows only as far as its shards allow (``ActiveSet.ceiling``); an explicit ``n_shards`` lets it
  grow to one worker a shard.

Which workers stand by (``split``): those owning the fewest rows, so the hand-off copies least.
A standby worker owns nothing and runs nothing; it comes back through the join path when a loss
or a retirement leaves fewer active workers than the decided count (``rejoiners``).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .shard_count import MIB, STEP_S_PER_MIB

#: what a clock pays, once, as soon as it spans more than one worker process (seconds): what a one-worker
#: clock cannot show (pulls from another owner's partitions, staged updates fetched across, the clock end's
#: reads of other owners, the other process's share of the cores). Issue 43: profiling one LDA clock,
#: "a second worker adds ~10 ms of fixed cost a clock"; ``bench.overhead`` (trivial model) 2 workers x 16
#: shards 9.7-11.2 ms a clock at load 6 (5 ms quiet) against 3.95 ms on 1 worker. With it a second worker
#: is taken where the step work of a clock is above ~24 ms (``MIN_GAIN``), near issue 43's line between its
#: small cases and those a second worker must speed up (a 20 ms one-worker clock)
CROSS_WORKER_COST_S = 10e-3
#: the serial cost a worker adds to a clock, before a clock is measured (seconds): the scheduler's share of
#: its commits and applies (``bench.hollow``: scheduler CPU 30 ms a clock at W = 64, 220 ms at W = 256, on 2
#: cores: ~0.5-0.9 ms a worker); used for a fit's start from its data's size
START_PER_WORKER_S = 1e-3
#: the predicted clock time a change of the active count must save (relative) to be made: a measured
#: clock's noise (a garbage collection, a busy core) never moves it, and once made it is kept
MIN_GAIN = 0.10
#: the settings of ``dscar.active-workers``
MODES = ("auto", "all")


def predicted_clock_s(parallel_s: float, per_worker_s: float, k: int, cross_s: float = CROSS_WORKER_COST_S) -> float:
    """The part of a clock that depends on the active count ``k``: the parallel part split ``k`` ways,
    the per-worker part paid by each, and ``cross_s`` once the clock spans two workers or more."""
    if k < 1:
        raise ValueError(f"a fit keeps at least one worker active, not {k}")
    return parallel_s / k + per_worker_s * k + (cross_s if k > 1 else 0.0)


def measured_costs(step_work_s: float, clock_s: float, k: int,
                   cross_s: float = CROSS_WORKER_COST_S) -> tuple[float, float]:
    """``(parallel_s, per_worker_s)`` of a clock that took ``clock_s`` seconds on ``k`` active workers
    whose shard steps took ``step_work_s`` in all (the parallel part, ``step_work_s / k`` of the clock);
    the rest of the clock, less the cross-worker cost where ``k`` > 1, is the per-worker part, ``k``
    times over (so ``predicted_clock_s`` at ``k`` gives the measured clock back, where it is above it).
    Measured on one worker, the whole rest counts per worker: it errs toward fewer workers."""
    if k < 1:
        raise ValueError(f"a clock ran on at least one worker, not {k}")
    step_work_s, clock_s = max(0.0, float(step_work_s)), max(0.0, float(clock_s))
    rest = clock_s - min(step_work_s / k, clock_s) - (cross_s if k > 1 else 0.0)
    return step_work_s, max(0.0, rest) / k


def bounds(floor: int, ceiling: int) -> tuple[int, int]:
    """``(floor, ceiling)`` made consistent: at least one worker, and the floor never above the ceiling
    (more workers than there are cannot be asked for)."""
    hi = max(1, int(ceiling))
    return min(max(1, int(floor)), hi), hi


def best_count(parallel_s: float, per_worker_s: float, floor: int, ceiling: int) -> int:
    """The count in ``[floor, ceiling]`` with the shortest predicted clock (a tie: the larger count,
    which a loss hurts less)."""
    lo, hi = bounds(floor, ceiling)
    return min(range(lo, hi + 1), key=lambda k: (predicted_clock_s(parallel_s, per_worker_s, k), -k))


def choose(parallel_s: float, per_worker_s: float, current: int, floor: int, ceiling: int, *,
           min_gain: float = MIN_GAIN) -> int:
    """The active count after a measured clock (``measured_costs``) run on ``current`` workers:
    ``best_count``'s when it saves at least ``min_gain`` of the predicted clock, else ``current``
    (moved into ``[floor, ceiling]`` when outside it)."""
    for name, v in (("parallel", parallel_s), ("per-worker", per_worker_s)):
        if not v >= 0:
            raise ValueError(f"the {name} part of a clock is a number of seconds >= 0, not {v!r}")
    lo, hi = bounds(floor, ceiling)
    now = min(max(int(current), lo), hi)
    best = best_count(parallel_s, per_worker_s, lo, hi)
    if predicted_clock_s(parallel_s, per_worker_s, best) <= (1 - min_gain) * predicted_clock_s(parallel_s, per_worker_s, now):
        return best
    return now


def initial_count(data_bytes: float | None, floor: int, ceiling: int, *, step_s_per_mib: float = STEP_S_PER_MIB,
                  per_worker_s: float = START_PER_WORKER_S) -> int:
    """The active count a fit starts with: from the data's size at ``step_s_per_mib`` (the cheapest
    measured step rate, so it errs toward fewer workers, which the first clock's measurement corrects
    upward); all of them (``ceiling``) when the size is unknown."""
    lo, hi = bounds(floor, ceiling)
    if data_bytes is None:
        return hi
    return best_count(max(0.0, data_bytes) / MIB * step_s_per_mib, per_worker_s, lo, hi)


def split(load: Mapping[str, int], k: int) -> tuple[list[str], list[str]]:
    """``(active, standby)``: of the workers in ``load`` (worker -> rows it owns), the ``k`` owning the
    most stay active (ties by name), the others stand by, so the hand-off moves the fewest rows."""
    order = sorted(load, key=lambda w: (-load[w], w))
    k = max(1, min(int(k), len(order)))
    return sorted(order[:k]), sorted(order[k:])


def rejoiners(standby: Iterable[str], n_active: int, wanted: int) -> list[str]:
    """The standby workers that rejoin (by name) when ``n_active`` workers are active and ``wanted`` are
    decided: as many as are missing, as many as stand by."""
    return sorted(standby)[:max(0, int(wanted) - int(n_active))]


def mode(value: object) -> str:
    """``dscar.active-workers``'s value checked: "auto" or "all"."""
    if value not in MODES:
        raise ValueError(f"dscar.active-workers must be one of {', '.join(map(repr, MODES))}, not {value!r}")
    return str(value)


@dataclass
class ActiveSet:
    """One fit's active count and standby workers (the coordinator's state; decided by this module)."""

    #: "auto" (decided here) or "all" (every worker active, none stands by)
    mode: str = "all"
    #: the fewest workers kept active (what the tables' memory needs, or the user's minimum)
    floor: int = 1
    #: the most workers kept active: the fewest shards of a data phase (a worker without one runs nothing)
    ceiling: int = 1 << 30
    #: the active count decided (None: all); standby workers rejoin while fewer are active
    wanted: int | None = None
    #: the measured decision was made (once a fit)
    decided: bool = False
    #: the workers standing by: in the cluster and the job, owning nothing, running nothing
    standby: set[str] = field(default_factory=set)
