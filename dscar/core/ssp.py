"""Stale-synchronous clocks: which clocks are open, what is applied, what a loss does (no Dask here).

Under ``consistency="ssp"`` with staleness ``s`` a clock is no barrier: a shard's
attempt of clock ``t`` may start while shards of clocks ``t - s … t - 1`` still run
elsewhere. This module is the specification of that window, the SSP counterpart
of ``dscar.core.clock`` (which stays the BSP machine, and the one for algorithms with
data phases). The coordinator feeds it what happened and carries out the actions
it returns.

Rules (``check`` asserts them, ``tests/test_ssp.py`` drives them with Hypothesis):

* **The window.** ``floor`` is the newest finished clock (every clock up to it
  is DONE or SKIPPED). A shard's attempt of clock ``t`` starts only when
  ``t <= floor + 1 + s`` (and ``t <= limit``, the newest clock the driver
  allows), and only when the same shard's update of clock ``t - 1`` is applied.
  So a read in clock ``t`` sees every update of clocks ``<= t - s - 1``, the
  shard's own earlier updates (read-my-writes: ``bench.staleness`` shows LDA and
  SGD need them) and whatever else was applied by then. With ``s = 0`` this is
  BSP: clock ``t + 1`` starts only after clock ``t`` finished. A worker reads from
  its pulled copy while the copy serves (``copy_serves``): new enough for the
  clocks ``<= t - s - 1``, and holding the shard's own update either because it
  was pulled after that update was applied or because this worker's attempt
  made it and added it to the copy when granted (``dscar.worker.pull_cache``).
* **Eager apply.** A committed attempt's update is applied without waiting for
  its clock's other shards: whenever nothing is being applied, every commit
  waiting is applied in one batch (``ApplyBatch``), whatever clocks it spans.
  One batch is in flight at a time, and never beside a clock-end step: a clock
  end reads its clock's reductions complete and assigns values that no
  concurrent apply can then overwrite.
* **Exactly once.** Each shard's update of each clock is put in one batch at most
  (``applied`` records it); a shard moves to its next clock only when its batch
  is applied. An update that a loss may have left applied on some owners and not
  others is *written off*: never applied again, its shard moves on, and its clock
  is SKIPPED (no clock-end step, no metrics), as BSP skips a clock lost while
  applying.
* **Clock ends in order.** Clock ``t``'s clock-end step runs when every shard's
  update of ``t`` is applied or written off and clock ``t - 1`` has finished; it
  finishes the clock (DONE) and raises ``floor``, which opens clock
  ``floor + 1 + s``. A clock with a write-off or a lost reduction is SKIPPED
  without its step.
* **Epochs.** A loss that needs a recovery raises the epoch; an attempt carries
  the epoch it started under, and a commit of an older epoch is refused. So
  nothing read before a restore is applied after it. Such a loss voids every
  running attempt and every commit not yet in a batch (their shards start again
  at the same clock); updates already applied stay (SCAR: other partitions keep
  their progress, the lost ones come back from the checkpoint). A loss that
  takes only staged updates (no partitions, no shard state) voids that worker's
  waiting commits and running attempts, nothing else.
* **Losses while applying** write off the batch in flight when the lost worker
  held one of its updates or owned a partition being applied to. A loss that
  needs a **restore** skips every open clock that had an update applied: what is
  restored (a partition from its checkpoint, tables rebuilt from older shard
  states, reduction sums) no longer holds those updates. A **clock-end step** under way when a recovery starts, or whose
  worker is lost, skips its clock.
* **Rebuild pass.** After a recovery, an algorithm with ``rebuild_tables``
  rebuilds them in one pass over every shard (from each shard's state as of its
  last applied clock) before any clock's shard runs again, as in BSP; not before
  the first batch was applied (nothing to rebuild yet). The pass runs under an
  epoch of its own, raised again when it is applied: no attempt of a clock
  shares an epoch with a rebuild commit of its shard.
* **A consistent cut.** A checkpoint is taken at a clock end, when no batch is in
  flight: its tables hold exactly the updates listed by ``cut()`` (shard ->
  newest clock applied, written-off updates counted as applied), and each
  shard's saved state is as of that clock.
* **A resume from a cut.** The manifest keeps that cut; a window resumed from it
  (``resume_from``) starts each shard at the clock after its own cut, counts its
  updates up to the cut as applied (never handed out again: exactly once across
  a resume) and skips the open clocks the cut reaches into (their reductions
  were not saved, as after a restore).
"""
from __future__ import annotations

import bisect
import enum
import math
from collections import Counter
from dataclasses import dataclass, field

from .clock import ClockError
from .shards import _Shard  # (a shard's one record: its queue fields and its place in the window)


class ShardPhase(str, enum.Enum):
    """Where a shard's update of its current clock is."""

    TODO = "todo"  # may start once its clock is open
    RUNNING = "running"  # an attempt is running (backups are the shard queue's business)
    COMMITTED = "committed"  # an attempt committed; its update waits for the next batch
    APPLYING = "applying"  # its update is in the batch in flight


#: the phases as module names: the decisions read them all the time, and an enum member's lookup
#: through its class costs ~75 ns in CPython 3.11 (a global's ~7)
_TODO, _RUNNING, _COMMITTED, _APPLYING = ShardPhase.TODO, ShardPhase.RUNNING, ShardPhase.COMMITTED, ShardPhase.APPLYING


class ClockStatus(str, enum.Enum):
    OPEN = "open"  # shards of it run or wait
    CLOCK_END = "clock-end"  # its clock-end step runs
    DONE = "done"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class ApplyBatch:
    """Every live owner applies these committed updates: ``(shard, clock, worker that holds it)``."""

    batch: int
    epoch: int
    updates: tuple[tuple[int, int, str], ...]
    rebuild: bool = False  # the rebuild pass's contributions (the rebuild tables start from zero)


@dataclass(frozen=True)
class RunClockEnd:
    clock: int
    epoch: int


@dataclass(frozen=True)
class SkipClock:
    clock: int
    reason: str


@dataclass(frozen=True)
class StartRecovery:
    epoch: int


@dataclass(frozen=True)
class StartRebuild:
    epoch: int


Action = ApplyBatch | RunClockEnd | SkipClock | StartRecovery | StartRebuild


@dataclass(slots=True)
class ClockWindow:
    """The open clocks of a stale-synchronous job and each shard's place in them. (Slotted: its ~35 fields
    are more than CPython 3.11 shares the keys of in an instance dict, so each read of one went through a
    dict lookup, ~19 ns, not a slot's ~6; the decisions read a few dozen a hand-out and a commit.)"""

    #: data shards (one data phase: SSP over phases is not offered)
    n_shards: int
    #: how many clocks a shard may run ahead of the newest finished clock + 1
    staleness: int
    #: the algorithm names rebuild tables (recomputed after a recovery)
    has_rebuild: bool = False
    #: commits to gather before a batch is sent, unless one is needed sooner (``_next``): an apply
    #: costs a round trip to every owner, and one per commit would cost more than it saves (the
    #: engine asks for two per worker: LDA, 4 workers, 32 shards, no straggler, 10 clocks took
    #: 1.53 s with one per worker, 1.26-1.32 s with two, against BSP's 1.16-1.24 s)
    min_batch: int = 1
    #: a ``flush`` (an idle worker) sends the commits waiting once there are ``min_batch //
    #: flush_share`` of them (at least one): at scale some worker is always idle, and a batch per
    #: flush would apply a few commits a round trip, each batch an apply message to every owner (a
    #: clock's batches, and so its messages per worker, would grow with W). With ``min_batch`` two
    #: commits a worker, a clock of k shards a worker makes at most about 4k batches this way.
    flush_share: int = 8
    #: the newest finished clock: every clock up to it is DONE or SKIPPED
    floor: int = 0
    #: the newest clock the driver allows to start (its stopping rule and ``max_clocks``)
    limit: int = 0
    #: ``top``, kept as ``floor`` and ``limit`` change (``_bounds``): every hand-out, its members and every idle poll
    #: compare with it
    _top: int = field(default=0, repr=False, compare=False)
    #: raised by every loss that starts or extends a recovery, and when the recovery ends
    epoch: int = 0
    #: losses are being recovered: nothing starts, commits, applies or ends meanwhile
    recovering: bool = False
    #: the rebuild pass must run before any clock's shard (set by a restore)
    needs_rebuild: bool = False
    #: shards still to run in the rebuild pass under way (None: no rebuild pass)
    rebuilding: set[int] | None = None
    #: some batch was applied: tables may hold the data's contributions (a rebuild has work)
    applied_before: bool = False
    #: the batch in flight (None: nothing being applied)
    in_flight: ApplyBatch | None = None
    #: the clock whose clock-end step runs (None: none)
    clock_end: int | None = None
    #: a clock end just finished: nothing is applied until ``go_on`` (the cut is being saved)
    holding: bool = False
    #: a retiring worker's partitions are being handed off: no batch or clock end starts until
    #: ``resume`` (an update applied to the old owner after its copy would be lost)
    paused: bool = False
    #: (shard, clock) of every update put in a batch (applied, or written off), of clocks from ``floor`` on
    applied: set[tuple[int, int]] = field(default_factory=set)
    #: clock -> why it will be skipped, for open clocks that will be
    skip_reasons: dict[int, str] = field(default_factory=dict)
    #: clock -> DONE or SKIPPED, for finished clocks
    finished: dict[int, ClockStatus] = field(default_factory=dict)
    _shards: list[_Shard] = field(default_factory=list)
    #: records to keep each shard's place on (None: the window makes its own): the shard queue's
    #: (``dscar.core.shards``), which carry the same fields, so that a decision reads one record a shard
    records: list | None = field(default=None, repr=False, compare=False)
    #: raised by every change of the tables (a batch applied, a clock end, which may assign): a
    #: worker's pulled copy is as new as the version it was pulled at
    version: int = 0
    #: clock -> the version when it finished (every update of it and of the clocks before is in
    #: tables of that version), for the clocks a read may still need (``read_floor``)
    finish_version: dict[int, int] = field(default_factory=dict)
    _batches: int = 0
    _urgent: bool = False
    _rebuild_done: list[tuple[int, str]] = field(default_factory=list)
    _first_floor: int = 0  # (the clocks up to it were an earlier fit's: a resume)
    #: ``stop`` was called: only then may a committed update's clock lie past ``limit`` (a commit past it
    #: is refused), and only then does ``_next`` look for one (every commit looks)
    _stopped: bool = False
    # Indexes of the shards' places, kept by ``_move`` (the only writer of a shard's clock and phase), so
    # that no decision scans every shard (``check`` compares them with a scan):
    #: clock -> how many TODO shards it has (no zero): counts, not sets of the shards, which every hand-out's
    #: member and every shard moving on changed (a cold slot each, at thousands of shards); the shards
    #: themselves are only listed by ``startable_by_clock``, from the records
    _n_todo_at: dict[int, int] = field(default_factory=dict)
    #: the clocks of ``_n_todo_at``, sorted (None: a clock came or went since they were last sorted): every
    #: hand-out and idle poll asks ``startable_clocks``, and the clocks change a few times a clock
    _clocks: list[int] | None = field(default=None, repr=False, compare=False)
    #: clock -> how many shards' current clock it is (every shard's clock is ``floor + 1`` or later)
    _n_at: dict[int, int] = field(default_factory=dict)
    #: clock -> how many COMMITTED shards it has
    _n_committed_at: dict[int, int] = field(default_factory=dict)
    #: COMMITTED shards (their updates wait for a batch)
    _committed: set[int] = field(default_factory=set)
    #: RUNNING shards
    _n_running: int = 0
    #: shards that went (back) to TODO, or to another clock while TODO, since ``moved_back`` was last asked
    #: (read it, do not change it: every commit asks whether it holds any, without a frame)
    moved: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.n_shards < 1:
            raise ValueError("n_shards must be >= 1")
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0, not {self.staleness}")
        records = [_Shard() for _ in range(self.n_shards)] if self.records is None else self.records
        if len(records) != self.n_shards:
            raise ValueError(f"{len(records)} records for a window of {self.n_shards} shards")
        for s in records:
            s.clock, s.phase, s.worker, s.seen, s.writer = self.floor + 1, _TODO, None, 0, None
        self._shards, self.records = list(records), None  # (the records, not the list: kept only here)
        self._first_floor = self.floor
        self._n_todo_at = {self.floor + 1: self.n_shards}
        self._n_at = {self.floor + 1: self.n_shards}
        self._bounds()

    # ------------------------------------------------------------ queries
    @property
    def top(self) -> int:
        """The newest clock a shard may start now."""
        return self._top

    def _bounds(self) -> None:
        """``floor`` or ``limit`` changed: so may ``top``."""
        self._top = min(self.floor + 1 + self.staleness, self.limit)

    def shard_clock(self, shard: int) -> int:
        return self._shards[shard].clock

    def phase(self, shard: int) -> ShardPhase:
        return self._shards[shard].phase

    def startable(self) -> list[int]:
        """Shards whose next attempt may start now (their update's clock is open), in order."""
        return sorted(i for _, shards in self.startable_by_clock() for i in shards)

    def startable_by_clock(self) -> list[tuple[int, set[int]]]:
        """``startable`` as ``(clock, shards)``, oldest clock first, from a scan of the shards (the
        decisions ask ``startable_clocks``, ``any_startable`` or ``n_startable``, which do not list them).
        In a rebuild pass every TODO shard is startable (each of them is still to rebuild)."""
        if self.recovering or self.needs_rebuild:
            return []
        top = math.inf if self.rebuilding is not None else self.top
        by_clock: dict[int, set[int]] = {}
        for i, s in enumerate(self._shards):
            if s.phase is _TODO and s.clock <= top:
                by_clock.setdefault(s.clock, set()).add(i)
        return sorted(by_clock.items())

    def startable_clocks(self) -> list[int]:
        """The clocks of ``startable_by_clock``, oldest first (without pairing each with its shards:
        every hand-out and idle poll asks; the list may be the window's own: read it, do not change it)."""
        if self.recovering or self.needs_rebuild:
            return []
        clocks = self._clocks
        if clocks is None:
            clocks = self._clocks = sorted(self._n_todo_at)
        if self.rebuilding is not None:
            return clocks
        top = self._top
        if not clocks or clocks[-1] <= top:  # (no list to filter)
            return clocks
        return clocks[:bisect.bisect_right(clocks, top)]  # (sorted: those up to ``top`` are a prefix)

    def any_startable(self) -> bool:
        """Whether ``startable_by_clock`` lists any shard (without listing them)."""
        if self.recovering or self.needs_rebuild or not self._n_todo_at:
            return False
        if self.rebuilding is not None:
            return True
        oldest = min(self._n_todo_at)
        return oldest <= self._top

    def n_startable(self) -> int:
        """How many shards ``startable_by_clock`` lists (without listing them: every idle poll's policy
        view asks)."""
        if self.recovering or self.needs_rebuild or not self._n_todo_at:
            return 0
        if self.rebuilding is not None:
            return sum(self._n_todo_at.values())
        top, n = self._top, 0
        for clock, count in self._n_todo_at.items():
            if clock <= top:
                n += count
        return n

    def may_start(self, shard: int) -> bool:
        """Whether ``shard`` is ``startable`` (without listing them)."""
        s = self._shards[shard]
        if self.recovering or self.needs_rebuild or s.phase is not _TODO:
            return False
        return shard in self.rebuilding if self.rebuilding is not None else s.clock <= self.top

    def updates_up_to(self, clock: int) -> int:
        """How many shard updates of clocks up to ``clock`` are still to be applied (each shard's
        from its current clock on)."""
        return sum(n * (clock - c + 1) for c, n in self._n_at.items() if c <= clock)

    def moved_back(self) -> list[int]:
        """The shards that went back to TODO (or on to their next clock) since the last call: what
        the shard queue must reopen (``SspSchedule``), without a scan of every shard."""
        moved, self.moved = self.moved, []
        return moved

    def read_floor(self, shard: int) -> int:
        """The oldest table version holding every update of clocks ``<= t - s - 1`` (``t``: the
        shard's next clock). A worker keeps its pulled copy while it is at least this new and holds
        the shard's own update (``own_update``, ``copy_serves``): a read is as stale as SSP allows
        it to be, not staler, and a pull of the whole table per work item is avoided."""
        return self.finish_version.get(self._shards[shard].clock - 1 - self.staleness, 0)

    def own_update(self, shard: int) -> tuple[int, str | None]:
        """The shard's update of its previous clock: the table version that holds it, and the
        worker whose attempt it was (None when it was written off or there is none). That
        worker may hold it in its copy without a pull (``copy_serves``)."""
        s = self._shards[shard]
        return s.seen, s.writer

    def member_fields(self, shards: list[int], worker: str, start: bool = False) -> tuple[list[tuple[int, int, bool]], int, int]:
        """For a work item of ``worker`` whose members run ``shards`` (started, or backed up): per shard,
        the clock it runs, ``own_update``'s version and whether that update was ``worker``'s attempt; then
        the item's newest clock and its ``read_floor`` (the newest of its shards'). ``start``: each shard
        is started first, as ``start`` would (the members of a new item), with the window's bounds read
        once: starting a shard changes none of them, nor any field of another shard. One look at each
        shard: every hand-out asks."""
        records, rebuilding = self._shards, self.rebuilding
        if start:
            if self.recovering or self.needs_rebuild:
                for shard in shards[:1]:
                    self.start(shard)  # (it raises)
            top = self._top  # (``may_start``'s bound)
        members, newest, read_floor = [], 0, 0
        finish_version, back = self.finish_version, 1 + self.staleness
        for shard in shards:
            s = records[shard]
            clock = s.clock
            if start:
                if s.phase is not _TODO or (clock > top if rebuilding is None else shard not in rebuilding):
                    self.start(shard)  # (it raises)
                # ``_move(shard, clock, RUNNING)`` from TODO in the same clock, as ``start``
                self._todo_left(clock)
                self._n_running += 1
                s.phase = _RUNNING
            members.append((clock, s.seen, s.writer == worker))
            if clock > newest:
                newest = clock
            floor = finish_version.get(clock - back, 0)
            if floor > read_floor:
                read_floor = floor
        return members, newest, read_floor

    def open_clocks(self) -> list[int]:
        """Clocks that have begun (some shard may run them) and are not finished."""
        return list(range(self.floor + 1, self.top + 1))

    def cut(self) -> list[int]:
        """Per shard, the newest clock whose update the tables hold (a consistent cut when no
        batch is in flight)."""
        return [s.clock - 1 for s in self._shards]

    @property
    def done(self) -> bool:
        """Every clock up to ``limit`` finished."""
        return self.floor >= self.limit and not self.recovering

    # -------------------------------------------------------- transitions
    def resume_from(self, cut: list[int]) -> None:
        """The job resumes from a checkpoint of clock ``floor`` whose tables hold each shard's
        updates up to ``cut[shard]`` (``ClockWindow.cut`` when it was taken): each shard starts at
        the clock after its cut, and a clock some shard's cut reaches past ``floor`` is skipped
        (its reduction sums were not saved). A cut of ``floor`` everywhere (BSP, or a manifest
        without one) changes nothing. Only before anything started."""
        if self.applied or self.in_flight is not None or any(
                s.phase is not _TODO or s.clock != self.floor + 1 for s in self._shards):
            raise ClockError("resume_from after the window started")
        if len(cut) != self.n_shards:
            raise ClockError(f"a cut of {len(cut)} shards for a window of {self.n_shards}")
        for shard, c in enumerate(cut):
            if not self.floor <= c <= self.floor + self.staleness:
                raise ClockError(f"shard {shard}'s cut {c} is outside clocks {self.floor} .. "
                                 f"{self.floor + self.staleness} (the checkpoint's clock + staleness)")
        for shard, c in enumerate(cut):
            self._move(shard, c + 1, _TODO)
            self.applied |= {(shard, k) for k in range(max(1, self.floor), c + 1)}
        for c in range(self.floor + 1, max(cut, default=self.floor) + 1):
            self._note_skip(c, "the checkpoint resumed from holds updates of the clock, not its reductions")

    def allow(self, limit: int) -> list[Action]:
        """The driver allows clocks up to ``limit``."""
        self.limit = max(self.limit, limit)
        self._bounds()
        return self._next()

    def stop(self, clock: int) -> None:
        """The fit ends after ``clock`` (a finished clock): no later clock starts or ends; updates
        of later clocks already applied stay in the model."""
        self.limit = max(clock, self.floor)
        self._bounds()
        self._stopped = True

    def start(self, shard: int) -> int:
        """The first attempt of ``shard`` starts (backups are the shard queue's); returns its clock
        (the attempt carries ``epoch``)."""
        s = self._shards[shard]
        clock = s.clock
        if s.phase is not _TODO or self.recovering or self.needs_rebuild or (
                clock > self._top if self.rebuilding is None
                else shard not in self.rebuilding):  # (``may_start``, inline: every hand-out's member asks)
            raise ClockError(f"shard {shard} ({s.phase.value}, clock {clock}) may not start now")
        # ``_move(shard, clock, RUNNING)`` from TODO in the same clock: its count stays, and it is not moved back
        self._todo_left(clock)
        self._n_running += 1
        s.phase = _RUNNING
        return clock

    def give_back(self, shard: int) -> None:
        """No attempt of ``shard`` runs any more (they failed, were lost or given back): it may start again."""
        s = self._shards[shard]
        if s.phase is _RUNNING:
            self._move(shard, s.clock, _TODO)

    def commit(self, shard: int, clock: int, worker: str, epoch: int) -> list[Action]:
        """An attempt of ``shard`` in ``clock`` on ``worker``, started under ``epoch``, commits (the
        shard queue granted it: the first of its attempts to ask). Refused (``[]``, the shard
        unchanged) unless the shard runs that clock under this epoch, and the clock is allowed."""
        s = self._shards[shard]
        if self.recovering or epoch != self.epoch or s.phase is not _RUNNING:
            return []
        if self.rebuilding is not None:
            if shard not in self.rebuilding:
                return []
            self.rebuilding.discard(shard)
            self._rebuild_done.append((shard, worker))
            self._move(shard, s.clock, _COMMITTED, worker)  # (its update is no clock's: see ``_next``)
            return self._send_rebuild_batch() if not self.rebuilding else []
        if s.clock != clock:
            return []
        if clock > self.limit:  # the fit stopped before this clock: its update is not applied
            self._move(shard, s.clock, _TODO)
            return []
        return self.commit_accepted(shard, clock, worker)

    def commit_accepted(self, shard: int, clock: int, worker: str) -> list[Action]:
        """``commit`` of an attempt that ``accepts`` took, the window unchanged since, without asking
        again (every commit asks ``accepts`` first, before the queue grants it)."""
        if self.rebuilding is not None:
            return self.commit(shard, clock, worker, self.epoch)
        s = self._shards[shard]
        # ``_move(shard, clock, COMMITTED, worker)`` from RUNNING in the same clock (its count stays)
        self._n_running -= 1
        s.phase, s.worker = _COMMITTED, worker
        self._committed.add(shard)
        self._n_committed_at[clock] = self._n_committed_at.get(clock, 0) + 1
        return self._next()

    def accepts(self, shard: int, clock: int, epoch: int) -> bool:
        """Whether a commit of ``shard`` in ``clock`` under ``epoch`` would be taken now."""
        s = self._shards[shard]
        return (not self.recovering and epoch == self.epoch and s.phase is _RUNNING
                and (self.rebuilding is not None or (s.clock == clock and clock <= self.limit)))

    def batch_applied(self, batch: int) -> list[Action]:
        """Every owner applied ``batch``."""
        if self.in_flight is None or self.in_flight.batch != batch or self.recovering:
            return []
        b, self.in_flight = self.in_flight, None
        self.applied_before = True
        self.version += 1
        if b.rebuild:
            self._end_rebuild()
            # the clocks go on under a new epoch, as BSP starts a pass after its rebuild pass: the rebuild
            # batch's commits were tagged with the shards' next clocks, and an attempt of such a clock under
            # the rebuild's epoch would read as one that lost to them (``ShardStore.lost``)
            self.epoch += 1
            for s in self._shards:  # the rebuilt tables are what every read needs now
                s.seen, s.writer = self.version, None
            return self._next()
        for shard, clock, worker in b.updates:
            self._advance(shard, clock, worker)
        return self._next()

    def clock_end_done(self, clock: int, epoch: int) -> bool:
        """Clock ``clock``'s clock-end step reported under ``epoch``: True if its metrics count."""
        if self.clock_end != clock or epoch != self.epoch or self.recovering:
            return False
        self.clock_end = None
        self.version += 1  # (a clock end may assign)
        self._finish(clock, ClockStatus.DONE)
        self.holding = True
        return True

    def go_on(self) -> list[Action]:
        """After a clock end: batches and clock ends may go on (the coordinator takes its
        checkpoint or memory copy before, while the tables hold the cut)."""
        self.holding = False
        return self._next()

    def lose(self, worker: str, *, restores: bool, reductions_lost: bool = False,
             owned_in_flight: bool = False) -> list[Action]:
        """``worker`` was lost. ``restores``: it took partitions or shard state with it (a
        recovery is needed); ``reductions_lost``: one was a reduction partition;
        ``owned_in_flight``: it owned a partition the batch in flight applies to."""
        out: list[Action] = []
        b = self.in_flight
        if b is not None and (restores or owned_in_flight or any(w == worker for _, _, w in b.updates)):
            self.in_flight = None
            if b.rebuild:
                self.needs_rebuild = True  # the rebuild pass runs again
                self._end_rebuild()
            else:
                for shard, clock, _ in b.updates:  # some owners may have applied these, others not
                    self._note_skip(clock, "a worker was lost while the clock's updates were applied")
                    self._advance(shard, clock)
        if restores:
            self.epoch += 1
            self.needs_rebuild = self.needs_rebuild or (self.has_rebuild and self.applied_before)
            if self.rebuilding is not None:
                self.needs_rebuild = True
                self._end_rebuild()
            for i, s in enumerate(self._shards):  # whatever ran or waits read what is being restored
                if s.phase in (_RUNNING, _COMMITTED):
                    self._move(i, s.clock, _TODO)
            # updates of open clocks applied before the loss are gone from what is restored (a partition
            # back to its checkpoint, tables rebuilt from older shard states): those clocks cannot count
            why = ("a reduction partition was lost" if reductions_lost else "a restore took back updates") \
                + " of the clock applied before the loss"
            for c in sorted({c for _, c in self.applied if c > self.floor}):
                self._note_skip(c, why)
            if self.clock_end is not None:
                self._note_skip(self.clock_end, "the clock-end step read a table being restored")
                self.clock_end = None
            if not self.recovering:
                self.recovering = True
                out.append(StartRecovery(self.epoch))
            return out
        for i in sorted(self._committed):  # its waiting commits (their updates were there); its running
            if self._shards[i].worker == worker:  # attempts are the caller's (``give_back``)
                self._move(i, self._shards[i].clock, _TODO)
        if self.rebuilding is not None:
            self.rebuilding |= {i for i, w in self._rebuild_done if w == worker}
            self._rebuild_done = [(i, w) for i, w in self._rebuild_done if w != worker]
        return out + ([] if self.recovering else self._next())

    def clock_end_failed(self, clock: int) -> list[Action]:
        """The clock-end step of ``clock`` was cut short (its worker lost): the clock is skipped."""
        if self.clock_end != clock:
            return []
        self.clock_end = None
        self._note_skip(clock, "the clock-end step was cut short by a loss")
        return [] if self.recovering else self._next()

    def recovered(self) -> list[Action]:
        """Every loss so far is recovered: rebuild, then go on."""
        if not self.recovering:
            raise ClockError("recovered() without a recovery")
        self.recovering = False
        self.epoch += 1
        return self._next()

    # ------------------------------------------------------------ helpers
    def _advance(self, shard: int, clock: int, writer: str | None = None) -> None:
        """The shard's update of ``clock`` is applied (by ``writer``'s attempt) or written off (None)."""
        s = self._shards[shard]
        self.applied.add((shard, clock))
        if s.clock == clock:
            self._move(shard, clock + 1, _TODO)
            s.seen, s.writer = self.version, writer

    def _todo_left(self, clock: int) -> None:
        """A TODO shard of ``clock`` left TODO: its count falls (a clock with none left is dropped)."""
        left = self._n_todo_at[clock] - 1
        if left:
            self._n_todo_at[clock] = left
        else:
            del self._n_todo_at[clock]
            self._clocks = None

    def _move(self, shard: int, clock: int, phase: ShardPhase, worker: str | None = None) -> None:
        """``shard``'s update is now that of ``clock``, in ``phase`` (COMMITTED or APPLYING: that of
        ``worker``'s attempt); the indexes follow."""
        s = self._shards[shard]
        old_clock, old_phase = s.clock, s.phase
        if old_phase is _TODO:
            self._todo_left(old_clock)
        elif old_phase is _RUNNING:
            self._n_running -= 1
        elif old_phase is _COMMITTED:
            self._committed.discard(shard)
            self._n_committed_at[old_clock] -= 1
            if not self._n_committed_at[old_clock]:
                del self._n_committed_at[old_clock]
        self._n_at[old_clock] -= 1
        if not self._n_at[old_clock]:
            del self._n_at[old_clock]
        s.clock, s.phase, s.worker = clock, phase, worker
        self._n_at[clock] = self._n_at.get(clock, 0) + 1
        if phase is _TODO:
            count = self._n_todo_at.get(clock)
            if count is None:
                self._n_todo_at[clock] = 1
                self._clocks = None
            else:
                self._n_todo_at[clock] = count + 1
            if old_phase is not _TODO or old_clock != clock:
                self.moved.append(shard)
        elif phase is _RUNNING:
            self._n_running += 1
        elif phase is _COMMITTED:
            self._committed.add(shard)
            self._n_committed_at[clock] = self._n_committed_at.get(clock, 0) + 1

    def _finish(self, clock: int, status: ClockStatus) -> None:
        """Clock ``clock`` (= floor + 1) finished; what is kept of clocks before it goes."""
        self.floor = clock
        self._bounds()
        self.finished[clock] = status
        self.finish_version[clock] = self.version
        for c in [c for c in self.finish_version if c < clock - self.staleness]:
            del self.finish_version[c]
        self.applied = {(i, c) for i, c in self.applied if c >= clock}

    def _end_rebuild(self) -> None:
        self.rebuilding, self._rebuild_done = None, []
        for i, s in enumerate(self._shards):
            if s.phase in (_RUNNING, _COMMITTED):
                self._move(i, s.clock, _TODO)

    def _note_skip(self, clock: int, reason: str) -> None:
        if clock > self.floor:
            self.skip_reasons.setdefault(clock, reason)

    def _send_rebuild_batch(self) -> list[Action]:
        self._batches += 1
        self.in_flight = ApplyBatch(self._batches, self.epoch, tuple((s, 0, w) for s, w in self._rebuild_done), True)
        self._rebuild_done = []
        return [self.in_flight]

    def _next(self) -> list[Action]:
        """Whatever can happen now: finish or skip clocks, start a rebuild, run a clock end (before
        any batch: the window cannot move on without it), or send a batch; at most one batch or
        clock end at a time."""
        if self.recovering or self.holding or self.paused or self.in_flight is not None or self.clock_end is not None:
            return []
        out: list[Action] = []
        t, n_at = self.floor + 1, self._n_at
        # (``t in n_at``: a shard's update of ``t`` is still to apply; then no clock finishes, is skipped or
        # ends, and without a rebuild only a batch may be due: most looks, every commit's among them)
        if t not in n_at or self.rebuilding is not None or self.needs_rebuild:
            while t <= self.limit and t not in n_at and t in self.skip_reasons:
                self._finish(t, ClockStatus.SKIPPED)
                out.append(SkipClock(t, self.skip_reasons.pop(t)))
                t = self.floor + 1
            if self.rebuilding is not None:
                return out
            if self.needs_rebuild:
                self.needs_rebuild = False
                if self.has_rebuild and self.applied_before:
                    self.rebuilding, self._rebuild_done = set(range(self.n_shards)), []
                    self.epoch += 1
                    return out + [StartRebuild(self.epoch)]
            if t <= self.limit and t not in n_at:  # first: later clocks wait on it
                self.clock_end = t
                self.finished[t] = ClockStatus.CLOCK_END
                return out + [RunClockEnd(t, self.epoch)]
        committed, n_committed_at = self._committed, self._n_committed_at
        if not committed:  # (nothing waits to be applied: no batch)
            return out
        n_waiting = len(committed)
        if self._stopped and max(n_committed_at) > self.limit:  # (a stopped fit's later clocks: not applied)
            n_waiting = sum(n for c, n in n_committed_at.items() if c <= self.limit)
        # the commits waiting go out now (they are due) on ``min_batch`` of them, no attempt left running
        # (nothing else will come), a ``flush`` once a share of ``min_batch`` waits (``flush_share``), or
        # the oldest open clock wholly committed (its clock end waits for them); tested here, not in a
        # method of its own: every commit asks, and most wait
        if n_waiting and (n_waiting >= self.min_batch or not self._n_running
                          or self._urgent and n_waiting >= self.min_batch // self.flush_share  # (n_waiting >= 1)
                          or n_at.get(t, 0) == n_committed_at.get(t, 0)):
            shards = self._shards
            waiting = [(i, shards[i].clock, shards[i].worker) for i in sorted(committed)
                       if shards[i].clock <= self.limit]
            self._batches += 1
            self._urgent = False
            # ``_move(i, clock, APPLYING, worker)`` of each, from COMMITTED in the same clock, inline (a batch
            # holds about 2 W updates): its count of the clock stays, its committed count goes
            for i, clock, worker in waiting:
                s = shards[i]
                s.phase, s.worker = _APPLYING, worker
                committed.discard(i)
                left = n_committed_at[clock] - 1
                if left:
                    n_committed_at[clock] = left
                else:
                    del n_committed_at[clock]
            self.in_flight = ApplyBatch(self._batches, self.epoch, tuple(waiting))
            return out + [self.in_flight]
        return out

    def pause(self) -> None:
        """No batch or clock end starts until ``resume`` (those under way finish): a hand-off waits
        for the tables to hold still, then copies them."""
        self.paused = True

    def resume(self) -> list[Action]:
        """Batches and clock ends go on after a ``pause``."""
        self.paused = False
        return self._next()

    def unapplied_writers(self) -> set[str]:
        """The workers whose committed updates are not applied yet (waiting for a batch, or in the
        batch in flight): their staged updates are still needed."""
        out = {self._shards[i].worker for i in self._committed} | {w for _, w in self._rebuild_done}
        if self.in_flight is not None:
            out |= {w for _, _, w in self.in_flight.updates}
        return {w for w in out if w is not None}

    def flush(self) -> list[Action]:
        """A worker found nothing to start: apply the commits waiting as soon as a share of a batch
        waits (``flush_share``; at once with a few workers)."""
        self._urgent = True
        return self._next()

    def check(self) -> None:
        """Assert the invariants in the module docstring."""
        assert self.floor <= max(self.limit, self.floor)
        assert self._top == min(self.floor + 1 + self.staleness, self.limit)
        for i, s in enumerate(self._shards):
            assert s.clock > self.floor or s.clock == self.floor + 1, (i, s)
            assert s.clock <= self.floor + 2 + self.staleness, (i, s)  # started within the window
            assert all((i, c) in self.applied for c in range(max(1, self.floor), s.clock)), (i, s)
            assert (i, s.clock) not in self.applied, (i, s)
            if s.phase is _APPLYING:
                assert self.in_flight is not None and any(u[0] == i for u in self.in_flight.updates), i
        for c in range(self._first_floor + 1, self.floor + 1):
            assert c in self.finished and self.finished[c] in (ClockStatus.DONE, ClockStatus.SKIPPED), c
        assert not (self.in_flight is not None and self.clock_end is not None)
        todo: dict[int, set[int]] = {}
        for i, s in enumerate(self._shards):
            if s.phase is _TODO:
                todo.setdefault(s.clock, set()).add(i)
        assert self._n_todo_at == {c: len(ids) for c, ids in todo.items()}, (self._n_todo_at, todo)
        assert self._n_at == dict(Counter(s.clock for s in self._shards))
        committed = {i for i, s in enumerate(self._shards) if s.phase is _COMMITTED}
        assert self._committed == committed
        assert self._n_committed_at == dict(Counter(self._shards[i].clock for i in committed))
        assert self._stopped or self.rebuilding is not None or all(c <= self.limit for c in self._n_committed_at)
        assert self._n_running == sum(1 for s in self._shards if s.phase is _RUNNING)
        if self.rebuilding is not None:  # (so in a rebuild pass every TODO shard is startable)
            assert {i for shards in todo.values() for i in shards} <= self.rebuilding
        if self.clock_end is not None:
            assert self.clock_end == self.floor + 1
            assert all(s.clock > self.clock_end for s in self._shards)
        assert self.any_startable() == bool(self.startable_by_clock())
        assert self.n_startable() == sum(len(shards) for _, shards in self.startable_by_clock())
        for worker in {s.writer for s in self._shards}:  # (a work item of every shard, as each writer's)
            members, newest, read_floor = self.member_fields(list(range(self.n_shards)), worker)
            assert members == [(s.clock, *self.own_update(i)[:1], self.own_update(i)[1] == worker)
                               for i, s in enumerate(self._shards)]
            assert newest == max(s.clock for s in self._shards)
            assert read_floor == max(self.read_floor(i) for i in range(self.n_shards))
        assert self.startable_clocks() == [c for c, _ in self.startable_by_clock()]
        assert self._clocks is None or self._clocks == sorted(self._n_todo_at), (self._clocks, sorted(self._n_todo_at))
        assert math.isfinite(self.epoch)


def copy_serves(copy_version: int, written_back: set[tuple[int, int]], read_floor: int,
                members: list[tuple[int, int, int, bool]]) -> bool:
    """Whether a worker's pulled copy of the tables serves a work item's reads under SSP.

    The copy holds every update applied when it was pulled (it is at least ``copy_version``
    new) plus the worker's own granted updates added to it since (``written_back``: (shard,
    clock), a write-back cache). The item's reads need ``read_floor`` (every update of clocks
    ``<= t - s - 1``) and, per member ``(shard, clock, seen, mine)``, the shard's own update of
    ``clock - 1``: in the pull (``seen <= copy_version``) or written back by this worker (``mine``:
    the applied update was this worker's attempt). Without the write-back, a worker whose
    shards' updates are applied one batch at a time pulls the whole table for almost every
    item (4 workers, 32 shards: ~3 pulls per worker per clock instead of 1)."""
    if copy_version < read_floor:
        return False
    return all(seen <= copy_version or (mine and (shard, clock - 1) in written_back)
               for shard, clock, seen, mine in members)
