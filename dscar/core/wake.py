"""Which waiting long polls a change wakes (no Dask here).

A worker with nothing to do waits in a long poll (``Coordinator._h_next``). Waking every waiting poll
on every change (a commit, a grant, an effect) reruns W polls per change: O(W^2) rechecks a clock, the
thundering herd of a large cluster. ``WaitLine`` says instead which polls a change can concern:

- a change that may give every worker something (a clock or pass begins, shards are placed, a recovery
  or a membership change ends) wakes ``everyone``;
- any other change wakes the waiting workers that hold TODO shards of their own (``owners``: each may
  take its own) and the longest-waiting other one (the head of the line): work that any worker may take
  (a clock-end step, a shard worth moving, a backup, batch members to ask back) goes to one of them;
- that head's wake is passed on down the line: by a poll that got an item (there may be more such
  work), and by one that found nothing at most ``MISSES`` times a change (the work may be one it alone
  may not take: a straggler held back, the late worker a backup is for, the asker of its own batch
  members, a joiner warming up; never one that ``MISSES + 1`` waiters in a row may not take). So a
  change costs the waiting owners, the items handed out and at most ``MISSES + 1`` polls more;
- an owner's wake is not passed on: the shards it takes are its own, no sign of more work for others;
- a BSP commit that completes no pass and leaves no shard TODO wakes nobody (``commit_wakes``): a
  waiting poll could then take only a backup, which turns due with time (below), or batch members to
  ask back, which a commit never adds. At the end of a step the W commits of a clock come together, and
  each woke ``MISSES + 1`` waiting polls to find nothing: about 4 W looks a clock on the scheduler's
  loop, in the burst that ends the clock.

Time-driven decisions (a backup turning due, a late holder's shard turning movable) wake the head of
the line at the time they turn due (``due``), and every poll still looks again at its timeout.

Invariant: a worker is in the line at most once; ``wake`` takes the woken out of it (a woken poll that
still finds nothing joins it again, at its end).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, AbstractSet, Iterable

if TYPE_CHECKING:
    from .job import JobState

#: how many times in a row a wake is passed on by polls that found nothing
MISSES = 2
#: how often the head of the line looks again, at most, while a backup may turn due (it is woken when
#: the next one does, by the idle policy's ``due_in``)
IDLE_RECHECK_S = 0.02
#: how often the head of the line looks again while a pass has shards to do (a late holder's may turn movable)
MOVE_RECHECK_S = 1.0


@dataclass(frozen=True)
class Woken:
    """A poll woken, and how many more misses its wake may be passed on after (None: an owner's wake,
    not passed on)."""

    worker: str
    misses_left: int | None


class WaitLine:
    """The workers waiting in a long poll, in the order they began waiting."""

    def __init__(self) -> None:
        #: waiting worker -> None, in the order they began waiting (a dict keeps the order, O(1) removal)
        self._line: dict[str, None] = {}

    def __len__(self) -> int:
        return len(self._line)

    def __contains__(self, worker: object) -> bool:
        return worker in self._line

    def __iter__(self):
        return iter(list(self._line))

    def wait(self, worker: str) -> None:
        """``worker``'s poll found nothing and waits (at the end of the line, unless it is in it already)."""
        self._line.setdefault(worker, None)

    def leave(self, worker: str) -> None:
        """``worker``'s poll returned (an item, its timeout, its worker gone)."""
        self._line.pop(worker, None)

    def wake(self, *, everyone: bool = False, owners: AbstractSet[str] | Iterable[str] = (),
             spare: int = 1, misses: int = MISSES) -> list[Woken]:
        """The polls a change wakes, taken out of the line: every one (``everyone``), or the waiting
        ``owners`` (workers with TODO shards of their own) and the first ``spare`` others."""
        if everyone:
            woken = list(self._line)
        else:
            line = self._line
            if not isinstance(owners, AbstractSet):
                owners = set(owners)
            # (the smaller side is scanned: few waiters at a pass's start, few owners at its tail)
            mine = ([w for w in line if w in owners] if len(line) <= len(owners)
                    else sorted(w for w in owners if w in line))  # (not the set's hash order)
            woken = list(mine)
            if spare > 0:
                taken = set(mine)
                for w in line:
                    if len(woken) - len(mine) >= spare:
                        break
                    if w not in taken:
                        woken.append(w)
        for w in woken:
            del self._line[w]
        return [Woken(w, None if w in owners and not everyone else misses) for w in woken]

    def pass_on(self, woken: Woken, got_item: bool) -> list[Woken]:
        """A woken poll looked: the wake it passes on (to the head of the line), if any. One that got an
        item passes its wake on as it came (there may be more); one that found nothing, with one miss
        fewer; an owner's, none."""
        if woken.misses_left is None or (not got_item and woken.misses_left <= 0):
            return []
        return self.wake(spare=1, misses=woken.misses_left if got_item else woken.misses_left - 1)


def commit_wakes(job: "JobState", effects: list) -> bool:
    """Whether a commit whose decision is ``effects`` may have made work for a waiting poll, so its
    change wakes polls (``WaitLine.wake``): always under SSP (a commit moves the clock window);
    under BSP, when it has effects (its pass is complete) or shards are TODO (given back, or queued
    again after a stopped attempt)."""
    return bool(effects) or job.consistency != "bsp" or bool(job.queue.n_todo)


def owners(jobs: Iterable["JobState"]) -> set[str]:
    """The workers that hold shards they may start now (under SSP, of a clock the window lets start):
    a change wakes their waiting polls first."""
    found: set[str] = set()
    for job in jobs:
        if job.handing_out and job.queue.n_todo:
            ssp = job.consistency == "ssp" and job.window.rebuilding is None
            found |= job.queue.holders_with_todo(job.window.top if ssp else float("inf"))
    return found


def recheck_s(jobs: Iterable["JobState"], now: float) -> float:
    """Seconds until the head of the line must look again though nothing woke it, because a decision
    turns due with time: a backup (when an idle policy says one may, ``due_in``; at least
    ``IDLE_RECHECK_S`` apart, and every ``IDLE_RECHECK_S`` for a policy that cannot say), a late
    holder's shard worth moving (``MOVE_RECHECK_S`` while a pass has shards to do). inf: none (a job
    between clocks, or no job, costs no look)."""
    due, moves = float("inf"), False
    for job in jobs:
        if not job.handing_out:
            continue
        moves = moves or bool(job.queue.n_todo)
        idle = [p for p in job.policies if p.when == "idle"]
        if not idle or not job.queue.n_doing:
            continue
        view = job.dispatch.view(job.workers, now)
        for p in idle:
            d = p.due_in(view) if hasattr(p, "due_in") else 0.0
            if d is not None:
                due = min(due, max(IDLE_RECHECK_S, d))
    return min(due, MOVE_RECHECK_S) if moves else due
