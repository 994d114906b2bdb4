"""The shard service: a per-clock state machine over data shards (no Dask here).

Every clock, every shard goes ``TODO -> DOING -> DONE``. A shard in DOING has one
or more *attempts* (a requeue after a worker loss, later a backup attempt for a
tail straggler); the first attempt that asks to commit wins and the shard is
DONE, later attempts are refused. This is what makes a shard's update applied
exactly once per clock.

Invariants (checked by ``check()`` and the tests):

* a shard is in exactly one of TODO, DOING, DONE;
* a DOING shard has at least one live attempt, a TODO or DONE shard none;
* a DONE shard has exactly one committed attempt, and it is never replaced;
* a shard whose data is held by no worker is only handed out when the data
  can be re-read by any worker (``reloadable``), else it waits for placement.

Locality: ``next_shard`` prefers a TODO shard whose data the asking worker
already holds, then takes one from the worker with the largest TODO backlog
(that worker is behind; its shard moves to the asking worker) when the caller
finds the move worth its cost (``worth_moving``). With
``sharding="static"`` (the BSP baseline) a worker only gets the shards it
holds; shards whose holder was lost go to anyone. Each hand-out is among the
TODO shards of one *tier* (``set_tier``): under BSP every shard is in tier 0,
under SSP a shard's tier is the clock of its next update, so the oldest open
clock's shards are handed out first. Indexes by tier and holder, and of the
running shards by attempts started (all of them, and those with an attempt that is
not a waiting batch member: ``set_waiting``), answer without a scan of the shards.

The data (and shard state) of a shard follows its commits: the *holder* is the
worker whose store has the shard's data and state as of the last applied pass
(placed there, or its attempt committed). An attempt on another worker copies
them from the holder and keeps the copy (a backup too); the holder keeps its own
until the pass is applied. The committed attempt's worker is the holder from its
commit on, so a pass a loss voids runs again from it. So a requeued, refused or
stale attempt never leaves the holder without the data, and the holder never
points at a worker that has not received it yet.

Phases: a clock may make several passes, each over its own contiguous range
of shard ids (``phases``: the number of shards of each, in order; default one
phase of all shards). Only the *active* phase's shards are handed out and
counted by ``complete``; ``next_phase`` moves on once it is complete. Shards
of later phases wait in TODO (not in the hand-out set), shards of earlier
phases stay DONE. ``begin_clock(clock, phase=None)`` activates every shard at
once (a rebuild pass over all the data).
"""
from __future__ import annotations

import bisect
import enum
import heapq
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from ..errors import ShardFailedError


def _merge_by_start(runs: list[Iterator[tuple[float, int, int]]]) -> Iterator[tuple[float, int, int]]:
    """The entries of sorted ``runs`` merged by start, ties in the order of the runs (as
    ``heapq.merge`` with a key, which costs more to set up than a few runs take to merge)."""
    heads = [next(run, None) for run in runs]
    while True:
        best, head = -1, None
        for i, entry in enumerate(heads):
            if entry is not None and (head is None or entry[0] < head[0]):
                best, head = i, entry
        if head is None:
            return
        heads[best] = next(runs[best], None)
        yield head


class ShardStatus(str, enum.Enum):
    TODO = "todo"
    DOING = "doing"
    DONE = "done"


#: the statuses as module names: the decisions read them all the time, and an enum member's lookup
#: through its class costs ~75 ns in CPython 3.11 (a global's ~7)
_TODO, _DOING, _DONE = ShardStatus.TODO, ShardStatus.DOING, ShardStatus.DONE


class Attempt(NamedTuple):
    """One attempt of a shard, immutable (a named tuple: one is made per hand-out, and a frozen
    dataclass's ``__init__`` costs three times a tuple's)."""

    shard: int
    attempt: int
    worker: str
    started: float
    fetch_from: str | None  # the shard's holder, when not this attempt's worker: it copies from there
    backup: bool = False  # a second attempt of a DOING shard (a tail straggler's)


#: ``Attempt(...)`` without its ``__new__``, a Python function (a frame per hand-out): the fields in order, all six
_new_attempt = tuple.__new__


class LastNameSet:
    """A set of worker names that knows its last (the largest) name: the holders of one backlog size
    (``ShardQueue._by_size``), whose last one gives up a shard when the asker has none of its own. A
    sorted list kept it by position, but each change moved the names after it (O(W) a change, and a
    change comes with most hand-outs and commits); here a change is O(1). The last name is kept as
    names arrive and forgotten when it leaves; the read after that finds it again with one ``max``
    over the set (in C: ~0.02 us a name), and only a worker that takes another's shard reads it."""

    __slots__ = ("_names", "_last")

    def __init__(self) -> None:
        #: the names in the set
        self._names: set[str] = set()
        #: the largest name, None: not known (the set is empty, or the last one left since the last read)
        self._last: str | None = None

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def add(self, name: str) -> None:
        self._names.add(name)
        if self._last is not None and name > self._last:
            self._last = name

    def discard(self, name: str) -> None:
        self._names.discard(name)
        if name == self._last:
            self._last = None

    def last(self) -> str:
        """The largest name (the set is not empty)."""
        if self._last is None:
            self._last = max(self._names)
        return self._last


@dataclass(slots=True)
class _Shard:
    status: ShardStatus = _TODO
    holder: str | None = None
    #: its live attempts, oldest first: the first on the record itself, the others (a backup's) in a tuple.
    #: Most shards never have two, and a dict of attempts by number was two more objects a hand-out
    #: writes and a commit reads (the dict and its keys), cold at thousands of shards
    attempt: Attempt | None = None  # None: no live attempt (then ``more`` is empty too)
    more: tuple[Attempt, ...] = ()
    committed: Attempt | None = None
    next_attempt: int = 0
    failures: list[str] = field(default_factory=list)
    started: int = 0  # attempts started in the active pass
    #: the queue's indexes of the running shards, kept here (the record a decision has read already),
    #: not in dicts by shard id: at 16,384 shards each such dict is one more cache miss a commit
    run_key: tuple[int, float] | None = None  # its key in ``ShardQueue._running`` (DOING only)
    entered: int = 0  # when it entered its ``_running`` bucket (the order of equal starts)
    shown: list | None = None  # its entry in ``ShardQueue._started`` (``[start, entered, shard, bucket]``)
    #: its live attempt that is a batch member which may not have started (``ShardQueue.set_waiting``; None:
    #: none). A member is the first attempt of a TODO shard, so a shard has at most one; a mark on its
    #: record, not a set of (shard, attempt, worker) keys, is what a hand-out writes and a commit clears
    waiting: Attempt | None = None
    #: under SSP, the clock window's fields of the shard (``dscar.core.ssp.ClockWindow``, which keeps them on
    #: the queue's record when the job gives it those, on records of this type of its own when alone): one
    #: record a shard, not two. At 4,096 workers a hand-out's member and a commit each read both, and the
    #: second was one more cold read, and 16,384 more objects for every full garbage collection to visit
    clock: int = 0  # the clock of its next (or running, or waiting) update
    phase: Any = None  # its ``ssp.ShardPhase`` in that clock
    worker: str | None = None  # the worker whose committed attempt holds its update
    seen: int = 0  # the table version that holds its previous clock's update (read-my-writes)
    writer: str | None = None  # the worker whose attempt that update was (None: written off, or none yet)

    def live(self) -> tuple[Attempt, ...]:
        """Its live attempts, oldest first."""
        a = self.attempt
        return () if a is None else (a, *self.more) if self.more else (a,)

    def find(self, number: int) -> Attempt | None:
        """Its live attempt ``number`` (None: not live)."""
        a = self.attempt
        if a is None or a.attempt == number:
            return a
        for a in self.more:
            if a.attempt == number:
                return a
        return None

    def add(self, a: Attempt) -> None:
        if self.attempt is None:
            self.attempt = a
        else:
            self.more += (a,)

    def drop(self, number: int) -> None:
        """Live attempt ``number`` is live no more (it is live)."""
        if self.waiting is not None and self.waiting.attempt == number:
            self.waiting = None
        if self.attempt.attempt == number:
            more = self.more
            self.attempt, self.more = (more[0], more[1:]) if more else (None, ())
        else:
            self.more = tuple(a for a in self.more if a.attempt != number)


#: an entry of ``ShardQueue._started``'s shard, and whether it is live (not set to -1): the compaction's test in C
_SHARD, _NOT_STALE = itemgetter(2), (0).__le__


class ShardQueue:
    """Per-clock shard states, attempts, commits and data locality."""

    def __init__(self, n_shards: int, *, reloadable: bool, max_failures: int = 3,
                 sharding: str = "dynamic", phases: "list[int] | tuple[int, ...] | None" = None):
        if n_shards < 1:
            raise ValueError("n_shards must be >= 1")
        if sharding not in ("dynamic", "static"):
            raise ValueError(f"sharding must be 'dynamic' or 'static', not {sharding!r}")
        phases = [n_shards] if phases is None else [int(n) for n in phases]
        if sum(phases) != n_shards or min(phases) < 1:
            raise ValueError(f"phases {phases} must be shard counts >= 1 that add up to n_shards={n_shards}")
        self.n_shards = n_shards
        #: a list of ``_started`` is rebuilt without its stale entries once they are half of it and
        #: this many more (a few stale entries cost the reads less than rebuilding small lists). An
        #: instance's field, not the class's: CPython 3.11 caches the lookup of the one, not the other
        self.stale_slack = 64
        self.reloadable = reloadable
        self.sharding = sharding
        self.max_failures = max_failures
        self.clock = 0
        self.phase_sizes = tuple(phases)
        starts = [sum(phases[:i]) for i in range(len(phases))]
        self.phase_ranges = tuple(range(a, a + n) for a, n in zip(starts, phases))
        self.phase: int | None = 0  # the active phase; None: every shard is active (a rebuild pass)
        #: the shard ids of the active phase (all of them in a rebuild pass), kept as ``phase`` changes
        #: (``_activate``): not a property, whose frame every hand-out's batch size paid for
        self.active: range = self.phase_ranges[0]
        self._shards = [_Shard() for _ in range(n_shards)]
        #: how many shards of the active phase are TODO (read it, do not change it; a count, not a set of them,
        #: which every hand-out's member changed, a cold slot at thousands of shards): the shards themselves
        #: are those of the ``_local`` buckets
        self.n_todo = 0
        #: each shard's tier: TODO shards are handed out one tier at a time (``next_shard``); under
        #: SSP a shard's tier is the clock of its next update, under BSP every shard's is 0
        self._tier = [0] * n_shards
        #: the TODO shards of the active phase by (tier, holder) (holder None: unheld): a worker's own shards
        #: without a scan
        self._local: dict[tuple[int, str | None], set[int]] = {}
        #: tier -> backlog size -> the holders (not None) with that many TODO shards of the tier:
        #: the longest backlog's last holder without a scan of the holders
        self._by_size: dict[int, dict[int, LastNameSet]] = {}
        #: shards of the active phase that are DONE: ``complete`` without a scan
        self._n_done = 0
        #: how many shards are DOING (the only ones with attempts): a count, not a set of them, which every
        #: hand-out's member and every commit changed (a cold slot each, at thousands of shards); the few
        #: readers of the shards themselves (``running``, once a stall-watch tick or a hand-off) scan the records
        self._n_doing = 0
        #: attempts started -> {shard: start of its longest-running live attempt} of every DOING shard
        #: that started that many this pass, in start order (attempts start as time goes on: an entry
        #: is appended, in O(1); one that is not in order marks its bucket ``_unsorted``, sorted when
        #: next read): the longest-running shards with fewer than n attempts without a scan
        #: (``longest_running``: the backup policy's view). Not kept once ``_started`` is (``_started_on``: its
        #: readers read that; a read without it builds this from the records): a commit pays for one index
        self._running: dict[int, dict[int, float]] = {}
        self._unsorted: set[int] = set()
        #: a DOING shard's key in ``_running`` is its record's ``run_key``: (attempts started, start of its
        #: oldest live attempt); its ``entered``, when it entered its bucket (this count then): the
        #: bucket's order of equal starts
        self._n_entered = 0
        #: the batch members that may not have started (``Dispatch.batched``, which keeps them in step through
        #: ``set_waiting``) are marked on their records (``_Shard.waiting``): ``longest_running(started_only=True)``
        #: hides them
        #: the ``_running`` entries of the shards with a live attempt that is not waiting, per bucket, as
        #: lists of ``[start, entered, shard, bucket]`` in order (``entered`` is unique: two entries never compare
        #: further; the bucket rides along so that a record's ``shown`` is the entry itself, no pair to read at
        #: its commit): at a pass's tail most running shards are batch members that have not started, and the
        #: backup policy's view steps over none of them. An
        #: entry that goes is left in its list, stale (its shard set to -1: telling a stale entry reads
        #: the entry, not its shard's record, cold at thousands of shards), until half or more of the
        #: list is (``stale_slack``; deleting from a list of W entries moved the ones after it: O(W) a
        #: commit); as the oldest entry goes, the head moves past the stale ones, which are cut off the
        #: list's front in one slice once they are a quarter of it (entries go about in the order they
        #: came: most never wait for a scan). A live entry is its shard's record's (``shown``), and a
        #: bucket is listed while it has a live one
        self._started: dict[int, list[list]] = {}
        #: bucket -> index in its list before which every entry is stale (the reads start there)
        self._started_head: dict[int, int] = {}
        #: bucket -> how many entries of its list are stale
        self._started_stale: dict[int, int] = {}
        #: shards whose place in ``_started`` may have changed since it was last placed: it follows
        #: them when read, at the end of a hand-out (``settle_started``) and of a ``commit``
        #: (``_flush_started``: each decision pays for its own changes). A batch member is shown when
        #: its attempt starts, hidden as the hand-out marks it waiting, shown again when its commit
        #: unmarks it and gone as it commits: each pair cancels out in this set, and is never paid
        self._started_dirty: set[int] = set()
        #: ``_started`` is kept (from the first waiting attempt on): until then it would be ``_running``,
        #: which ``longest_running`` reads in its place (SSP's items of one shard never pay for it)
        self._started_on = False
        self._attempts_clock: int | None = None  # attempt numbers restart only with a new clock
        #: raised by every change of the attempts (started, committed, failed, released, dropped, reopened)
        #: and of their waiting marks: what an idle-time policy reads of the queue is as it was while this holds
        #: (``Dispatch.idle_policies`` keeps an empty answer for as long)
        self.changes = 0

    # ---------------------------------------------------------------- clocks
    @property
    def n_phases(self) -> int:
        return len(self.phase_sizes)

    def _activate(self, phase: int | None) -> None:
        """``phase`` is the active one (None: every shard)."""
        self.phase = phase
        self.active = range(self.n_shards) if phase is None else self.phase_ranges[phase]

    def phase_of(self, shard: int) -> int:
        if len(self.phase_ranges) == 1:  # (asked for every member of every work item)
            return 0
        return next(i for i, r in enumerate(self.phase_ranges) if shard in r)

    def begin_clock(self, clock: int, phase: int | None = 0) -> None:
        """Put every shard in TODO for ``clock`` and activate ``phase`` (None: all shards).

        Between clocks the previous one must be complete; starting again in the
        same clock (after a rebuild pass) is allowed at any phase.
        """
        if self.clock and clock != self.clock and not self.complete:
            raise RuntimeError(f"clock {self.clock} is not complete")
        if phase is not None and not 0 <= phase < self.n_phases:
            raise ValueError(f"phase {phase} outside 0..{self.n_phases - 1}")
        self.clock = clock
        self.changes += 1
        self._running, self._unsorted, self._started = {}, set(), {}
        self._started_head, self._started_stale, self._started_dirty = {}, {}, set()
        for s in self._shards:
            s.status = _TODO
            s.attempt, s.more = None, ()
            s.run_key = s.shown = s.waiting = None
            s.committed = None
            s.next_attempt = 0 if clock != self._attempts_clock else s.next_attempt
            if s.failures:  # (a new list only where there were failures: a shard moving on allocates nothing)
                s.failures = []
            s.started = 0
        self._attempts_clock = clock
        self._activate(phase)
        self._n_done = 0
        self._n_doing = 0
        self._todo_reset(self.active)

    def next_phase(self) -> int:
        """Activate the next phase (the active one must be complete); returns its index."""
        if self.phase is None or self.phase + 1 >= self.n_phases:
            raise RuntimeError(f"no phase after {self.phase}")
        if not self.complete:
            raise RuntimeError(f"phase {self.phase} of clock {self.clock} is not complete")
        self._activate(self.phase + 1)
        self.changes += 1
        self._n_done = sum(1 for i in self.active if self._shards[i].status is _DONE)
        self._todo_reset(self.active)
        return self.phase

    @property
    def last_phase(self) -> bool:
        return self.phase is None or self.phase == self.n_phases - 1

    def restart_clock(self) -> None:
        """Run the active phase again from TODO (its staged updates were discarded).

        Earlier phases, already applied, stay DONE. Attempt numbers keep counting
        up, so a stale attempt can never be taken for a new one.
        """
        self.reopen(self.active)

    def reopen(self, shards) -> None:
        """Put ``shards`` back in TODO with no attempt and no commit (a pass runs again, or under SSP
        a shard moves on to its next clock). Holders stay; attempt numbers keep counting up."""
        active, records, in_todo = self.active, self._shards, self._in_todo
        self.changes += 1
        added, fresh = [], set()
        for i in shards:
            s = records[i]
            todo = i in fresh or s.status is _TODO and in_todo(i)  # (among ``n_todo`` already, or listed twice)
            if s.status is _DONE and i in active:
                self._n_done -= 1
            elif s.status is _DOING:
                self._n_doing -= 1
            s.attempt, s.more, s.waiting = None, (), None
            s.status = _TODO
            s.committed = None
            if s.failures:  # (a new list only where there were failures: a shard moving on allocates nothing)
                s.failures = []
            s.started = 0
            self._reindex(i)
            if not todo:
                fresh.add(i)
                added.append(i)
        self.n_todo += len(added)
        self._add_locals(added)

    def _add_locals(self, shards: list[int]) -> None:
        """``_add_local`` for each of ``shards`` (new among ``n_todo``), a bucket at a time: each holder's
        backlog size changes once, not once a shard (an SSP batch applied, or a loss, reopens
        thousands of shards, most of them of a few hundred (tier, holder) buckets)."""
        groups: dict[tuple[int, str | None], list[int]] = {}
        tiers, records = self._tier, self._shards
        for i in shards:
            key = (tiers[i], records[i].holder)
            group = groups.get(key)
            if group is None:
                groups[key] = [i]
            else:
                group.append(i)
        local = self._local
        for key, ids in groups.items():
            bucket = local.get(key)
            if bucket is None:
                bucket = local[key] = set()
            old = len(bucket)
            bucket.update(ids)
            if len(bucket) != old:
                self._resize(key[0], key[1], old, len(bucket))

    @property
    def complete(self) -> bool:
        """Every shard of the active phase is DONE (``active``'s size, without building it: every commit asks)."""
        phase = self.phase
        return self._n_done == (self.n_shards if phase is None else self.phase_sizes[phase])

    def status(self, shard: int) -> ShardStatus:
        return self._shards[shard].status

    def _in_todo(self, shard: int) -> bool:
        """Whether ``shard`` is among the ``n_todo`` (in its bucket of ``_local``)."""
        bucket = self._local.get((self._tier[shard], self._shards[shard].holder))
        return bucket is not None and shard in bucket

    def counts(self) -> dict[str, int]:
        """Shards of the active phase per status."""
        out = {st.value: 0 for st in ShardStatus}
        for i in self.active:
            out[self._shards[i].status.value] += 1
        return out

    # -------------------------------------------------------------- locality
    def set_holder(self, shard: int, worker: str | None) -> None:
        s = self._shards[shard]
        if s.holder != worker and self._in_todo(shard):
            self._drop_local(s.holder, shard)
            self._add_local(worker, shard)
        s.holder = worker

    def set_tier(self, shard: int, tier: int) -> None:
        """``shard`` is handed out with the other shards of ``tier`` (``next_shard``)."""
        if self._tier[shard] != tier:
            todo = self._in_todo(shard)
            if todo:
                self._todo_discard(shard)
            self._tier[shard] = tier
            if todo:
                self._todo_add(shard)

    def tier(self, shard: int) -> int:
        return self._tier[shard]

    def _todo_add(self, shard: int) -> None:
        if not self._in_todo(shard):
            self.n_todo += 1
            self._add_local(self._shards[shard].holder, shard)

    def _todo_discard(self, shard: int) -> None:
        if self._in_todo(shard):
            self.n_todo -= 1
            self._drop_local(self._shards[shard].holder, shard)

    def _add_local(self, holder: str | None, shard: int) -> None:
        tier = self._tier[shard]
        bucket = self._local.setdefault((tier, holder), set())
        if shard not in bucket:
            bucket.add(shard)
            self._resize(tier, holder, len(bucket) - 1, len(bucket))

    def _drop_local(self, holder: str | None, shard: int) -> None:
        tier = self._tier[shard]
        bucket = self._local.get((tier, holder))
        if bucket is not None and shard in bucket:
            bucket.discard(shard)
            self._resize(tier, holder, len(bucket) + 1, len(bucket))
            if not bucket:
                del self._local[(tier, holder)]

    def _resize(self, tier: int, holder: str | None, old: int, new: int) -> None:
        """``holder``'s backlog in ``tier`` went from ``old`` to ``new`` shards (``_by_size``)."""
        if holder is None:
            return
        sizes = self._by_size.get(tier)  # (not ``setdefault``: its default is built on every call)
        if sizes is None:
            sizes = self._by_size[tier] = {}
        # (``LastNameSet.discard`` and ``add``, inline on its fields: two of these a hand-out, three frames each)
        if old:
            same = sizes[old]
            names = same._names
            names.discard(holder)
            if holder == same._last:
                same._last = None
            if not names:
                del sizes[old]
        if new:
            same = sizes.get(new)
            if same is None:
                same = sizes[new] = LastNameSet()
            same._names.add(holder)
            if same._last is not None and holder > same._last:
                same._last = holder
        if not sizes:
            del self._by_size[tier]

    def _todo_reset(self, shards) -> None:
        todo = set(shards)
        self.n_todo = len(todo)
        self._local = {}
        self._by_size = {}
        self._add_locals(list(todo))

    def holder(self, shard: int) -> str | None:
        return self._shards[shard].holder

    def held_by(self, worker: str) -> list[int]:
        return [i for i, s in enumerate(self._shards) if s.holder == worker]

    def holders_with_todo(self, max_tier: float = float("inf")) -> set[str]:
        """The workers holding TODO shards of a tier up to ``max_tier``, from the index of backlogs by
        tier (``_by_size``): the waiting polls a change wakes first (``dscar.core.wake``). O(tiers +
        those holders): under SSP most holders' TODO shards wait in a tier past the window's top (their
        next clock), and a scan of every holder's bucket made each change cost O(W)."""
        found: set[str] = set()
        for tier, sizes in self._by_size.items():
            if tier <= max_tier:
                for holders in sizes.values():
                    found.update(holders)
        return found

    def unplaced(self) -> list[int]:
        """Shards whose data no worker holds (only meaningful when not reloadable)."""
        return [i for i, s in enumerate(self._shards) if s.holder is None]

    # ------------------------------------------------------------ hand-outs
    def next_shard(self, worker: str, now: float, *, local_only: bool = False, tier: int = 0,
                   worth_moving: Callable[[str, float, str, int], bool] | None = None) -> Attempt | None:
        """Start an attempt of the best TODO shard of ``tier`` for ``worker`` (with ``local_only``, only
        of one it holds), or None. ``worth_moving(worker, now, holder, backlog)``: whether ``worker`` should
        take one of ``holder``'s ``backlog`` TODO shards, moving its data (default: yes; asked with the
        hand-out's own ``worker`` and ``now``, so a caller passes one function, not one bound to them per
        hand-out: ``Dispatch.worth_moving``).

        Its own shard first (the lowest id); else an unheld one when shards are reloadable (the
        highest id); else, with dynamic sharding, the highest id of the holder with the longest
        backlog (ties: the last name). Each from an index: no scan of the shards or the holders."""
        if not self.n_todo:
            return None
        key = (tier, worker)
        local = self._local.get(key)
        if local:
            return self._start([min(local)], worker, now, key, local, True)[0]
        if local_only:
            return None
        return self._take_other(worker, now, tier, worth_moving)

    def next_batch(self, worker: str, now: float, n: int, *, tier: int = 0,
                   worth_moving: Callable[[str, float, str, int], bool] | None = None) -> list[Attempt]:
        """``next_shard(worker, now, tier=tier, worth_moving=worth_moving)`` (empty: None), and when that is
        one of the worker's own shards, up to ``n - 1`` more of them (``take_own``) in the same call: a
        batch's hand-out looks its bucket up and resizes its backlog once, not twice."""
        if not self.n_todo:
            return []
        key = (tier, worker)
        local = self._local.get(key)
        if local:
            return self._take_own(key, local, worker, now, n, True)
        a = self._take_other(worker, now, tier, worth_moving)
        return [] if a is None else [a]

    def _take_other(self, worker: str, now: float, tier: int,
                    worth_moving: Callable[[str, float, str, int], bool] | None) -> Attempt | None:
        """``next_shard`` for a worker with no TODO shard of its own in ``tier``: an unheld one, or another's."""
        if self.reloadable and (tier, None) in self._local:
            victim = None
        else:
            sizes = self._by_size.get(tier)
            if self.sharding == "static" or not sizes:
                return None
            victim = sizes[max(sizes)].last()
        key = (tier, victim)
        ids = self._local[key]
        if victim is not None and worth_moving is not None and not worth_moving(worker, now, victim, len(ids)):
            return None
        return self._start([max(ids)], worker, now, key, ids, True)[0]

    def take_own(self, worker: str, now: float, n: int, tier: int = 0) -> list[Attempt]:
        """Start attempts of up to ``n`` of the TODO shards of ``tier`` that ``worker`` holds, the lowest ids
        first: ``next_shard(worker, now, local_only=True, tier=tier)`` called until it finds none or ``n``
        started, in one call (a batch's members)."""
        key = (tier, worker)
        local = self._local.get(key)
        if not local or n < 1:
            return []
        return self._take_own(key, local, worker, now, n, False)

    def _take_own(self, key: tuple[int, str | None], local: set[int], worker: str, now: float, n: int,
                  first: bool) -> list[Attempt]:
        """``take_own`` from ``worker``'s bucket ``local`` (not empty) at ``key``; ``first``: the lowest id is
        the item's first attempt (placed in ``_started`` at once, as ``next_shard``'s), the others members."""
        size = len(local)  # (a small bucket sorted and cut: ``heapq.nsmallest`` is Python, ~4x the sort of a few)
        ids = [min(local)] if n <= 1 else sorted(local) if n >= size else sorted(local)[:n] if size <= 64 \
            else heapq.nsmallest(n, local)
        return self._start(ids, worker, now, key, local, first)

    def _start(self, ids: list[int], worker: str, now: float, key: tuple[int, str | None], bucket: set[int],
               first: bool) -> list[Attempt]:
        """The first attempts of TODO shards ``ids`` start on ``worker``, in order; ``bucket`` is the ``_local``
        set that holds them, at ``key`` (their tier and holder). ``first``: ``ids[0]`` is a hand-out's first
        attempt, placed in ``_started`` now (no round through ``_started_dirty``); the others are a batch's later
        members, which their hand-out may mark waiting next (``set_waiting``): their places wait for that.
        One loop for a batch: the queue's counts and the holder's backlog change once by the batch, not once
        a member (every hand-out starts one or more)."""
        records, started_on, entered = self._shards, self._started_on, self._n_entered
        started = []
        for shard in ids:
            s = records[shard]
            holder = s.holder
            number = s.next_attempt
            fetch_from = holder if holder is not None and holder != worker else None
            a = _new_attempt(Attempt, (shard, number, worker, now, fetch_from, False))
            s.next_attempt = number + 1
            s.started = k = s.started + 1
            s.attempt = a  # (a TODO shard has no live attempt)
            s.status = _DOING
            # ``_todo_discard(shard)`` with the bucket known: out of TODO and its bucket (the counts and the
            # holder's backlog size after the loop)
            bucket.discard(shard)
            # ``_reindex`` for a TODO shard's first attempt (a TODO shard has no ``_running`` entry to drop)
            s.run_key = (k, now)
            entered += 1
            s.entered = entered
            if started_on:
                if first:
                    self._place_started(shard)
                else:
                    self._started_dirty.add(shard)
            else:
                running = self._running.get(k)
                if running is None:
                    running = self._running[k] = {}
                elif running and next(reversed(running.values())) > now:
                    self._unsorted.add(k)
                running[shard] = now
            first = False
            started.append(a)
        n = len(started)
        self._n_entered = entered
        self.changes += n
        self._n_doing += n
        self.n_todo -= n
        left = len(bucket)
        self._resize(key[0], key[1], left + n, left)  # (the bucket's holder: its shards')
        if not left:
            del self._local[key]
        return started

    def start_backup(self, shard: int, worker: str, now: float) -> Attempt:
        """A second attempt of a DOING shard on ``worker``; it copies the holder's data."""
        s = self._shards[shard]
        if s.status is not _DOING:
            raise ValueError(f"shard {shard} is {s.status.value}, not doing: no backup")
        if any(a.worker == worker for a in s.live()):
            raise ValueError(f"shard {shard} already runs on {worker}")
        fetch_from = s.holder if s.holder not in (None, worker) else None
        a = Attempt(shard, s.next_attempt, worker, now, fetch_from, backup=True)
        s.next_attempt += 1
        s.started += 1
        s.add(a)
        self.changes += 1
        self._reindex(shard)
        return a

    def attempts_started(self, shard: int) -> int:
        """Attempts of ``shard`` started in this clock's active pass (running, failed or refused)."""
        return self._shards[shard].started

    def running_attempts(self, shard: int) -> list[Attempt]:
        return list(self._shards[shard].live())

    def running_attempt(self, shard: int, attempt: int) -> Attempt | None:
        """That live attempt of ``shard`` (None: it is not running)."""
        return self._shards[shard].find(attempt)

    @property
    def n_doing(self) -> int:
        """DOING shards."""
        return self._n_doing

    def _doing(self) -> list[int]:
        """The DOING shards, in order (a scan of the records: see ``_n_doing``)."""
        return [i for i, s in enumerate(self._shards) if s.status is _DOING]

    def longest_running(self, fewer_started_than: int | None = None, *,
                        started_only: bool = False) -> Iterator[Attempt]:
        """The longest-running live attempt of every DOING shard, the longest running first (time does
        not go back); with ``fewer_started_than``, only of the shards that started fewer attempts this
        pass, the others not even looked at. ``started_only``: only of the shards with a live attempt
        that is not waiting (``set_waiting``), in the same order, the others not looked at either. Do
        not change the queue while iterating."""
        if started_only and self._started_on:
            self._flush_started()
            runs = [self._live_started(k) for k in sorted(self._started)
                    if fewer_started_than is None or k < fewer_started_than]
            for e in (runs[0] if len(runs) == 1 else _merge_by_start(runs)):
                s = self._shards[e[2]]
                if not s.more:
                    yield s.attempt
                else:
                    yield min(s.live(), key=lambda a: (a.started, a.attempt))
            return
        running = self._running if not self._started_on else self._running_from_records()
        buckets = []
        for k in sorted(running):
            if fewer_started_than is not None and k >= fewer_started_than:
                break
            if k in self._unsorted:
                running[k] = dict(sorted(running[k].items(), key=lambda e: e[1]))
                self._unsorted.discard(k)
            buckets.append((start, shard) for shard, start in running[k].items())
        for _, shard in heapq.merge(*buckets, key=lambda e: e[0]):
            yield min(self._shards[shard].live(), key=lambda a: (a.started, a.attempt))

    def _running_from_records(self) -> dict[int, dict[int, float]]:
        """``_running`` as it would be kept, from the running shards' records: each bucket in the order
        of (start, entered) (a kept bucket's, once sorted stably by start)."""
        shards, running = self._shards, {}
        for i in sorted(self._doing(), key=lambda i: (shards[i].run_key[1], shards[i].entered)):
            k, start = shards[i].run_key
            running.setdefault(k, {})[i] = start
        return running

    def oldest_started(self, fewer_started_than: int | None = None) -> tuple[Attempt, int] | None:
        """What ``longest_running(fewer_started_than, started_only=True)`` yields first, and how many
        live attempts its shard has, without a generator (the backup policy asks on every idle poll
        whether the longest running is late)."""
        if not self._started_on:  # (nothing waits: every running shard shows)
            a = next(self.longest_running(fewer_started_than), None)
            return None if a is None else (a, len(self._shards[a.shard].live()))
        if self._started_dirty:
            self._flush_started()
        best, head = -1, None
        for k, started in self._started.items():  # (a few buckets: attempts started a pass, 1 ... max)
            if fewer_started_than is None or k < fewer_started_than:
                i = self._started_head[k]  # ``_first_started(k)``, inline: the first live entry (a listed bucket has one)
                first = started[i]
                if first[2] < 0:
                    while started[i][2] < 0:
                        i += 1
                    self._started_head[k] = i
                    first = started[i]
                if head is None or first[0] < head[0] or (first[0] == head[0] and k < best):
                    best, head = k, first
        if head is None:
            return None
        s = self._shards[head[2]]
        if not s.more:
            return s.attempt, 1
        attempts = s.live()
        return min(attempts, key=lambda a: (a.started, a.attempt)), len(attempts)

    def _reindex(self, shard: int) -> None:
        """``shard``'s attempts changed: its place in ``_running`` follows."""
        s = self._shards[shard]
        key = None
        if s.status is _DOING and s.attempt is not None:
            oldest = s.attempt.started if not s.more else min(a.started for a in s.live())
            key = (s.started, oldest)
        old = s.run_key
        if old != key:
            if old is not None:
                self._unrun(shard)
            if key is not None:
                if not self._started_on:
                    bucket = self._running.setdefault(key[0], {})
                    if bucket and next(reversed(bucket.values())) > key[1]:
                        self._unsorted.add(key[0])
                    bucket[shard] = key[1]
                s.run_key = key
                self._n_entered += 1
                s.entered = self._n_entered
        self._reshow(shard)

    def _unrun(self, shard: int) -> None:
        """``shard`` runs no more: its ``_running`` entry goes (its ``_started`` one when next placed)."""
        s = self._shards[shard]
        old = s.run_key
        if old is not None:
            s.run_key = None
            if self._started_on:
                return
            bucket = self._running[old[0]]
            del bucket[shard]
            if not bucket:
                del self._running[old[0]]
                self._unsorted.discard(old[0])

    def _reshow(self, shard: int) -> None:
        """``shard``'s attempts, its ``_running`` entry or its waiting attempts changed: its place in
        ``_started`` follows when the index is next read."""
        if self._started_on:
            self._started_dirty.add(shard)

    def _flush_started(self) -> None:
        """``_started`` follows every shard that changed since it was last placed."""
        if self._started_dirty:
            for shard in self._started_dirty:
                self._place_started(shard)
            self._started_dirty.clear()

    #: a decision that started, marked or dropped attempts ends (a hand-out: ``Dispatch.set_batched``): the
    #: index of the started attempts follows them now, so each decision pays for its own changes, not the
    #: next idle poll that reads the index (a batch's members, started and marked waiting in the same
    #: hand-out, cancel out first)
    settle_started = _flush_started

    def _place_started(self, shard: int) -> None:
        """``shard``'s place in ``_started``, from its attempts, ``_running`` entry and waiting
        attempts. A ``_running`` bucket is in the order of (start, entered): appended in that order,
        and sorted stably by start when it is not (``longest_running``)."""
        s = self._shards[shard]
        key, old = s.run_key, s.shown
        waiting = s.waiting
        if key is not None and (waiting is None or s.attempt is not waiting or s.more):  # (one live attempt waits at most)
            k, start, entered = key[0], key[1], s.entered
            if old is not None:
                if old[0] == start and old[1] == entered and old[3] == k:
                    return
                s.shown = None
                self._unshow(old)
            e = s.shown = [start, entered, shard, k]
            started = self._started.get(k)
            if started is None:
                self._started[k], self._started_head[k], self._started_stale[k] = [e], 0, 0
            elif started[-1] < e:
                started.append(e)
            else:
                i = bisect.bisect_left(started, e)
                started.insert(i, e)
                if i < self._started_head[k]:
                    self._started_head[k] = i
        elif old is not None:
            s.shown = None
            self._unshow(old)

    def _unshow(self, e: list) -> None:
        """The entry ``e`` of ``_started`` goes stale."""
        k = e[3]
        e[2] = -1
        started = self._started[k]
        stale = self._started_stale[k] + 1
        n = len(started)
        if stale == n:
            del self._started[k], self._started_head[k], self._started_stale[k]
            return
        head = self._started_head[k]
        if started[head] is e:  # the oldest went: the head moves past the stale ones (a listed bucket has a live one)
            head += 1
            while started[head][2] < 0:
                head += 1
            if 4 * head >= n + self.stale_slack:  # (the stale front, cut in one slice: no entry read)
                del started[:head]
                stale -= head
                head = 0
            self._started_head[k] = head
        self._started_stale[k] = stale
        if 2 * stale >= len(started) + self.stale_slack:  # (a compaction reads each entry: twice per stale one)
            self._compact_started(k)

    def _live_started(self, k: int) -> Iterator[list]:
        """The live entries of bucket ``k`` of ``_started``, in order."""
        started = self._started[k]
        for i in range(self._started_head[k], len(started)):
            e = started[i]
            if e[2] >= 0:
                yield e

    def _first_started(self, k: int) -> list:
        """The first live entry of bucket ``k`` of ``_started`` (a listed bucket has one); the stale
        ones before it are not looked at again."""
        started, i = self._started[k], self._started_head[k]
        while started[i][2] < 0:
            i += 1
        self._started_head[k] = i
        return started[i]

    def _compact_started(self, k: int) -> None:
        """Bucket ``k``'s list without its stale entries."""
        # (``_live_started``'s entries, filtered in C: a list may hold thousands, and SSP's commits each paid
        # ~75 bytecodes for a Python loop over them)
        rest = self._started[k][self._started_head[k]:]
        self._started[k] = list(compress(rest, map(_NOT_STALE, map(_SHARD, rest))))
        self._started_head[k] = self._started_stale[k] = 0

    def set_waiting(self, worker: str, added: Iterable[tuple[int, int]], removed: Iterable[tuple[int, int]]) -> None:
        """``worker``'s batch members ``added`` ((shard, attempt) pairs) may not have started; those
        ``removed`` have, or are no members any more (``Dispatch.batched`` says so). A pair that names no
        live attempt of ``worker`` marks nothing (it never will: attempt numbers are not reused)."""
        if added and not self._started_on:  # the first attempt to wait: ``_started`` is kept from now on
            self._started_on = True
            self._started_dirty.update(self._doing())  # (the shards with a ``run_key``)
            self._running, self._unsorted = {}, set()
        on, dirty, shards = self._started_on, self._started_dirty, self._shards
        self.changes += 1
        for shard, attempt in removed:
            s = shards[shard]
            a = s.waiting
            if a is not None and a.attempt == attempt and a.worker == worker:
                s.waiting = None
                if on:
                    dirty.add(shard)
        for shard, attempt in added:
            s = shards[shard]
            a = s.attempt
            if a is None or a.attempt != attempt:
                a = s.find(attempt)
                if a is None:
                    continue
            if a.worker != worker or s.waiting is a:
                continue
            s.waiting = a
            if s.shown is None and not s.more:
                dirty.discard(shard)  # hidden before and now (a member started and marked in one hand-out)
            else:
                dirty.add(shard)

    def unwait(self, shard: int, attempt: int, worker: str) -> None:
        """``set_waiting(worker, (), [(shard, attempt)])``: a member started (every commit of one says so)."""
        s = self._shards[shard]
        a = s.waiting
        if a is not None and a.attempt == attempt and a.worker == worker:
            s.waiting = None
            self.changes += 1
            if self._started_on:
                self._started_dirty.add(shard)

    def clear_waiting(self) -> None:
        """No batch member is waiting (``Dispatch.batched`` is a new dict)."""
        shards = self._shards  # (only a running shard has a mark: a commit, a drop and a reopen clear it)
        self.changes += 1
        doing = self._doing()
        for i in doing:
            shards[i].waiting = None
        if self._started_on:
            self._started_dirty.update(doing)  # (the shards with a ``run_key``)

    # --------------------------------------------------------------- results
    def commit(self, shard: int, attempt: int, worker: str) -> bool:
        """Grant the commit to the first live attempt that asks; refuse all others."""
        s = self._shards[shard]
        a = s.attempt
        if a is not None and a.attempt != attempt:  # (``find``, inline: every commit asks)
            a = s.find(attempt)
        if s.status is not _DOING or a is None or a.worker != worker:
            return False
        s.committed = a
        s.attempt = s.waiting = None
        self.changes += 1
        if s.more:
            s.more = ()
        s.status = _DONE
        self._n_doing -= 1
        self._n_done += 1  # (a DOING shard is an active one)
        s.holder = worker  # the committed data and state live here now (not a TODO shard: no index)
        if self._started_on:  # (``_unrun``, then ``_flush_started``, inline: every commit pays them)
            s.run_key = None
            dirty = self._started_dirty
            if dirty:  # (its attempt's unwait and its commit cancel out: a member never shown costs nothing)
                dirty.discard(shard)
                if dirty:
                    self._flush_started()
            shown = s.shown
            if shown is not None:  # (``_place_started`` of a shard with no ``run_key``: its entry goes)
                s.shown = None
                self._unshow(shown)
        else:
            self._unrun(shard)  # (``_reindex`` for a shard that is DONE)
        return True

    def fail(self, shard: int, attempt: int, worker: str, reason: str, *, count: bool = True,
             lost_data: bool = False) -> None:
        """An attempt raised: back to TODO, or ShardFailedError past ``max_failures``.

        ``count=False``: the attempt failed because another worker was lost under it
        (not the shard's fault); it is retried without counting. A failure that leaves
        another attempt of the shard running is not counted either: that attempt may
        still commit (a backup that could not copy the data yet is no fault of the shard).
        ``lost_data``: the attempt found the shard's data nowhere: the shard is unheld now. A
        late report (of an attempt already superseded: its shard committed, or ran again)
        changes nothing, its holder included: the shard's data is where the winner left it.
        """
        s = self._shards[shard]
        a = s.find(attempt)
        if a is None or a.worker != worker:
            return  # a late report of an attempt already superseded
        if lost_data:
            s.holder = None
        s.drop(attempt)
        self.changes += 1
        self._reindex(shard)
        if count and s.attempt is None:
            s.failures.append(f"{worker}: {reason}")
        if len(s.failures) >= self.max_failures:
            raise ShardFailedError(shard, self.clock, s.failures)
        if s.attempt is None:
            s.status = _TODO
            self._n_doing -= 1
            self._todo_add(shard)

    def release(self, shard: int, attempt: int, worker: str) -> bool:
        """Take back an attempt its worker never started (a batch member another worker may run
        now): back to TODO, its data still where it was, and nothing counted against the shard."""
        s = self._shards[shard]
        a = s.find(attempt)
        if a is None or a.worker != worker or s.status is not _DOING:
            return False
        s.drop(attempt)
        s.started -= 1
        self.changes += 1
        if s.attempt is None:
            s.status = _TODO
            self._n_doing -= 1
            self._todo_add(shard)
        self._reindex(shard)
        return True

    def worker_lost(self, worker: str) -> list[Attempt]:
        """Return every DOING attempt of ``worker`` to TODO and forget its data."""
        self.changes += 1
        requeued = []
        for i, s in enumerate(self._shards):
            if s.holder == worker:
                self.set_holder(i, None)
            lost = [a for a in s.live() if a.worker == worker]
            for a in lost:
                s.drop(a.attempt)
                requeued.append(a)
            if lost and s.attempt is None and s.status is _DOING:  # DOING: an active shard
                s.status = _TODO
                self._n_doing -= 1
                self._todo_add(i)
            if lost:
                self._reindex(i)
        return requeued

    def source_lost(self, worker: str) -> list[Attempt]:
        """``worker`` was lost while attempts were taking their shard's data from it: they can
        never get it. Drop them; a shard left with no attempt goes back to TODO, unheld."""
        self.changes += 1
        doomed = []
        for i, s in enumerate(self._shards):
            gone = [a for a in s.live() if a.fetch_from == worker and not a.backup]
            for a in gone:
                s.drop(a.attempt)
                doomed.append(a)
            if gone and s.attempt is None and s.status is _DOING:
                s.status = _TODO
                self._n_doing -= 1
                self.set_holder(i, None)
                self._todo_add(i)
            if gone:
                self._reindex(i)
        return doomed

    def uncommit(self, worker: str) -> list[int]:
        """``worker`` was lost before the pass was applied: its committed attempts of the active
        pass are void (their updates went with it). Those shards go back to TODO, unheld."""
        self.changes += 1
        undone = []
        for i in self.active:
            s = self._shards[i]
            if s.status is _DONE and s.committed is not None and s.committed.worker == worker:
                s.status, s.committed = _TODO, None
                self._n_done -= 1
                self.set_holder(i, None)
                self._todo_add(i)
                undone.append(i)
        return undone

    def committed_attempt(self, shard: int) -> Attempt | None:
        """The committed attempt of ``shard`` (None: none yet)."""
        return self._shards[shard].committed

    def committed_attempts(self) -> list[tuple[int, int, str]]:
        """(shard, attempt, worker) of every committed attempt of the active phase, in shard order."""
        return [(i, c.attempt, c.worker) for i in self.active if (c := self._shards[i].committed)]

    def committed(self) -> list[tuple[int, int]]:
        """(shard, attempt) of every committed attempt of the active phase, in shard order."""
        return [(i, self._shards[i].committed.attempt) for i in self.active if self._shards[i].committed]

    def committed_by(self) -> dict[str, int]:
        """How many shards of the active phase each worker committed."""
        out: dict[str, int] = {}
        for s in (self._shards[i] for i in self.active):
            if s.committed:
                out[s.committed.worker] = out.get(s.committed.worker, 0) + 1
        return out

    def running(self) -> list[Attempt]:
        """Every live attempt, in shard order (only DOING shards have any)."""
        return [a for i in self._doing() for a in self._shards[i].live()]

    # ------------------------------------------------------------ snapshots
    def snapshot(self) -> dict[str, Any]:
        """JSON-able state; attempts in flight are recorded but restore as TODO."""
        return {
            "clock": self.clock,
            "reloadable": self.reloadable,
            "max_failures": self.max_failures,
            "sharding": self.sharding,
            "phases": list(self.phase_sizes),
            "phase": self.phase,
            "shards": [
                {
                    "status": s.status.value,
                    "holder": s.holder,
                    "committed": None if s.committed is None else [s.committed.attempt, s.committed.worker],
                    "next_attempt": s.next_attempt,
                    "failures": list(s.failures),
                }
                for s in self._shards
            ],
        }

    @classmethod
    def restore(cls, snap: dict[str, Any]) -> "ShardQueue":
        """Rebuild from ``snapshot()``: DONE stays DONE, DOING goes back to TODO."""
        q = cls(len(snap["shards"]), reloadable=snap["reloadable"], max_failures=snap["max_failures"],
                sharding=snap.get("sharding", "dynamic"), phases=snap.get("phases"))
        q.clock = q._attempts_clock = snap["clock"]
        q._activate(snap.get("phase", 0))
        todo = []
        for i, d in enumerate(snap["shards"]):
            s = q._shards[i]
            s.holder = d["holder"]
            s.next_attempt = d["next_attempt"]
            s.failures = list(d["failures"])
            if d["status"] == _DONE.value:
                att, w = d["committed"]
                s.status = _DONE
                s.committed = Attempt(i, att, w, 0.0, None)
            else:
                s.status = _TODO
                if i in q.active:
                    todo.append(i)
        q._todo_reset(todo)
        q._n_doing = 0
        q._n_done = sum(1 for i in q.active if q._shards[i].status is _DONE)
        return q

    def check(self) -> None:
        """Assert the invariants in the module docstring."""
        active = self.active
        assert active == (range(self.n_shards) if self.phase is None else self.phase_ranges[self.phase])
        assert self._n_done == sum(1 for i in active if self._shards[i].status is _DONE)
        assert self._n_doing == len(self._doing())
        assert all(s.attempt is not None or not s.more for s in self._shards)
        keys = {i: (s.started, min(a.started for a in s.live()))
                for i, s in enumerate(self._shards) if s.status is _DOING and s.attempt is not None}
        assert {i: s.run_key for i, s in enumerate(self._shards) if s.run_key is not None} == keys
        running = self._running if not self._started_on else self._running_from_records()
        assert not self._started_on or not self._running and not self._unsorted
        assert running == {k: {i: t for i, (n, t) in keys.items() if n == k} for k, _ in keys.values()}
        for k, bucket in self._running.items():
            assert k in self._unsorted or list(bucket.values()) == sorted(bucket.values()), k
        assert all(s.waiting is None or any(a is s.waiting for a in s.live()) for s in self._shards)
        shown = {i: (t, self._shards[i].entered, i, k) for i, (k, t) in keys.items()
                 if any(a is not self._shards[i].waiting for a in self._shards[i].live())}
        self._flush_started()  # (the index as a read sees it)
        started_key = {i: tuple(s.shown) for i, s in enumerate(self._shards) if s.shown is not None}
        assert started_key == (shown if self._started_on else {}) and (
            self._started_on or all(s.waiting is None for s in self._shards))
        live = {k: sorted(list(e) for e in started_key.values() if e[3] == k) for *_, k in started_key.values()}
        assert {k: list(self._live_started(k)) for k in self._started} == live
        for k, started in self._started.items():  # sorted, each entry once; the stale ones counted, none live before the head
            assert all(a <= b for a, b in zip(started, started[1:])) and len({id(e) for e in started}) == len(started), k
            assert all(self._shards[e[2]].shown is e and e[3] == k for e in started if e[2] >= 0), k
            assert self._started_stale[k] == len(started) - len(live[k]) == sum(e[2] < 0 for e in started), k
            assert all(e[2] < 0 for e in started[:self._started_head[k]]), k
        todo = {i for b in self._local.values() for i in b}
        assert sum(map(len, self._local.values())) == len(todo) == self.n_todo and all(
            self._shards[i].holder == h and self._tier[i] == t for (t, h), b in self._local.items() for i in b)
        held = {(t, h): len(b) for (t, h), b in self._local.items() if h is not None}
        for top in {*self._tier, float("inf")}:  # the index's answer is the shards' own
            want = {self._shards[i].holder for i in todo if self._tier[i] <= top} - {None}
            assert self.holders_with_todo(top) == want, (top, want)
        assert {t: {n: set(same) for n, same in sizes.items()} for t, sizes in self._by_size.items()} == {
            t: {n: {h for (u, h), m in held.items() if u == t and m == n} for (u, _), n in held.items() if u == t}
            for t, _ in held}
        assert all(same.last() == max(same) for sizes in self._by_size.values() for same in sizes.values())
        for i, s in enumerate(self._shards):
            assert (i in todo) == (s.status is _TODO and i in active) == self._in_todo(i), i
            if i not in active:  # an earlier phase (DONE, or TODO after a rebuild pass) or a later one (TODO)
                assert s.status is not _DOING and s.attempt is None, i
                assert s.status is _TODO or i < active.start, i
            if s.status is _DOING:
                assert s.attempt is not None and s.committed is None, i
            elif s.status is _DONE:
                assert s.attempt is None and s.committed is not None, i
            else:
                assert s.attempt is None and s.committed is None, i
