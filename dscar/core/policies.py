"""Straggler mitigation policies (no Dask here).

Each policy is a small class with one decision method, in the shape of
distributed's ``ActiveMemoryManagerPolicy``: the coordinator calls it with a
read-only ``ControllerView`` and carries out what it returns. Dynamic sharding
itself is not a policy: it is the pull model, always on.

* ``BackupPolicy`` (``"backup"``): when the TODO queue is empty and an idle
  worker asks for work, start a second attempt of a shard that has run longer
  than ``k`` x the median shard time; the first attempt to commit wins. A
  backup starts from the shard's state as of the start of the current data
  pass, copied from its holder (an attempt's new state is only staged, and is
  installed when the pass is applied, for the committed attempt only).
* ``AdaptiveBatchPolicy`` (``"adaptive"``, AntDT-DD): per-worker batch scale
  proportional to measured speed, mean 1, so the global batch stays fixed.
  Algorithms with minibatches read it as ``ctx.batch_scale``.
* ``RestartPolicy`` (``"restart"``, AntDT-ND kill-and-restart): at a clock
  boundary, a persistent straggler hands its partitions to others and is
  restarted (or retired when it has no Nanny).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Iterable, Iterator

from ..errors import InvalidInputError
from .monitor import ThroughputMonitor


@dataclass(frozen=True)
class Running:
    shard: int
    worker: str
    elapsed_s: float
    n_attempts: int  # attempts of the shard started this clock (running or failed), the first included
    workers: tuple[str, ...] = ()  # the workers of every live attempt of the shard (empty: only ``worker`` known)


@dataclass
class ControllerView:
    """What a policy may look at."""

    clock: int
    workers: list[str]
    #: shards that may start now (under SSP: of clocks the window lets start); backups wait for none
    todo: int
    #: every running shard as its longest-running attempt, the longest running first (a job's view
    #: builds them as they are read: a policy that stops early reads a few, not every one)
    running: Collection[Running]
    monitor: ThroughputMonitor
    stragglers: dict[str, str] = field(default_factory=dict)  # at clock boundaries
    idle_worker: str | None = None  # the worker asking for work, if any

    def longest_running(self, fewer_attempts_than: int) -> Iterator[Running]:
        """The running shards with fewer than ``fewer_attempts_than`` attempts this clock, the longest
        running first (a job's view answers from its queue's index, without looking at the others)."""
        indexed = getattr(self.running, "longest_running", None)
        if indexed is not None:
            return indexed(fewer_attempts_than)
        return iter(sorted((r for r in self.running if r.n_attempts < fewer_attempts_than), key=lambda r: -r.elapsed_s))

    def oldest_elapsed(self, fewer_attempts_than: int) -> float | None:
        """The time of the first of ``longest_running(fewer_attempts_than)`` (None: there is none); a
        job's view answers without building the running shards."""
        indexed = getattr(self.running, "oldest_elapsed", None)
        if indexed is not None:
            return indexed(fewer_attempts_than)
        first = next(self.longest_running(fewer_attempts_than), None)
        return None if first is None else first.elapsed_s


@dataclass(frozen=True)
class Backup:
    shard: int
    worker: str


@dataclass(frozen=True)
class SetBatchScale:
    scales: dict[str, float]


@dataclass(frozen=True)
class Restart:
    worker: str
    reason: str


class Policy:
    """Base class: ``when`` is ``"idle"`` (a worker asks for work) or ``"clock"`` (between clocks)."""

    name = "policy"
    when = "idle"

    def decide(self, view: ControllerView) -> list:
        raise NotImplementedError

    def decide_idle(self, view: ControllerView) -> tuple[list, float]:
        """``decide``, and for how many seconds from ``view``'s time an empty answer holds while nothing
        the view shows changes but the time (0.0: none; ask again at every poll). An idle-time policy is
        asked on every idle poll, and mostly nothing it reads has changed since: ``Dispatch.idle_policies``
        keeps the empty answer for that long, until the job's state changes."""
        return self.decide(view), 0.0

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class BackupPolicy(Policy):
    name = "backup"
    when = "idle"

    def __init__(self, k: float = 2.0, max_attempts: int = 3, min_s: float = 0.02):
        if k <= 0 or max_attempts < 2 or min_s < 0:
            raise InvalidInputError("backup needs k > 0, max_attempts >= 2 and min_s >= 0")
        #: a shard is late once it has run k x the median step time ...
        self.k = k
        #: ... and at least min_s seconds (a backup moves data: not worth it for a millisecond)
        self.min_s = min_s
        #: attempts a shard may have in one clock, the first included (backups that failed count)
        self.max_attempts = max_attempts

    def decide(self, view: ControllerView) -> list:
        return self.decide_idle(view)[0]

    def decide_idle(self, view: ControllerView) -> tuple[list, float]:
        if view.todo or view.idle_worker is None:
            return [], 0.0  # (shards to start, or no asker: said again at once, not kept)
        med = view.monitor.median_step()
        if med is None:
            return [], math.inf  # (until a step is measured: a change of the monitor)
        late_after = self._late_after(med)
        oldest = view.oldest_elapsed(self.max_attempts)
        if oldest is None:
            return [], math.inf  # (until an attempt runs: a change of the queue)
        if oldest <= late_after:
            # (the loop below would stop at its first shard: nothing is late, and nothing turns late
            # before the longest running does; shown at its item's pace, it turns late no sooner)
            return [], late_after - oldest
        idle = view.idle_worker
        for r in view.longest_running(self.max_attempts):  # the first one it may back up is the latest
            if r.elapsed_s <= late_after:
                break  # (and so is every one after it)
            if r.worker != idle and idle not in r.workers:
                return [Backup(r.shard, idle)], 0.0
        return [], 0.0  # (late shards, each the asker's own: another asker may back one up)

    def due_in(self, view: ControllerView) -> float | None:
        """Seconds until ``decide`` may start a backup at the earliest (the longest-running shard turns
        late), or None while none will by time alone. An attempt's time may be shown slowed by its
        batch's pace: then this is early, never late (a waiting poll looks once too often, not too late)."""
        med = view.monitor.median_step()
        if view.todo or med is None:
            return None
        oldest = view.oldest_elapsed(self.max_attempts)
        return None if oldest is None else max(0.0, self._late_after(med) - oldest)

    def _late_after(self, median_step: float) -> float:
        """Seconds after which a running attempt counts as late (``k`` typical steps, at least ``min_s``)."""
        return max(self.k * median_step, self.min_s)


class AdaptiveBatchPolicy(Policy):
    name = "adaptive"
    when = "clock"

    def __init__(self, min_scale: float = 0.05):
        self.min_scale = min_scale

    def decide(self, view: ControllerView) -> list:
        speeds = view.monitor.speeds()
        live = [w for w in view.workers if w in speeds]
        if len(live) < 2:
            return []
        mean = sum(speeds[w] for w in live) / len(live)
        raw = {w: max(self.min_scale, speeds[w] / mean) for w in live}
        norm = sum(raw.values()) / len(raw)
        return [SetBatchScale({w: s / norm for w, s in raw.items()})]


class RestartPolicy(Policy):
    name = "restart"
    when = "clock"

    def __init__(self, max_restarts: int = 1):
        self.max_restarts = max_restarts
        self._done = 0

    def decide(self, view: ControllerView) -> list:
        if self._done >= self.max_restarts or len(view.workers) < 2:
            return []
        for w, kind in sorted(view.stragglers.items()):
            if kind == "persistent" and w in view.workers:
                self._done += 1
                return [Restart(w, "persistent straggler")]
        return []


POLICIES = {p.name: p for p in (BackupPolicy, AdaptiveBatchPolicy, RestartPolicy)}

#: on unless turned off; chosen by measurement (bench/stragglers.py)
DEFAULT_POLICIES = ("backup",)


def make_policies(spec: "Iterable[str | Policy] | None") -> list[Policy]:
    """Policies from names or instances; None gives the defaults, ``[]`` none."""
    if spec is None:
        spec = DEFAULT_POLICIES
    if isinstance(spec, (str, Policy)):
        spec = [spec]
    out = []
    for p in spec:
        if isinstance(p, Policy):
            out.append(p)
        elif isinstance(p, str) and p in POLICIES:
            out.append(POLICIES[p]())
        else:
            raise InvalidInputError(f"unknown policy {p!r}; known: {sorted(POLICIES)} or a dscar.core.policies.Policy")
    return out
