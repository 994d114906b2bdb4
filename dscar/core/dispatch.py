"""Who runs which shard attempt: batches, moves, stragglers and the policies (no Dask here).

``Dispatch`` is the part of a job's control state that shapes work items whatever the
consistency model: how many of its own shards a worker gets at once (by its measured step
time), whether a shard is worth moving from its holder, whether a straggler is left out of a
pass's tail, which unstarted batch members an idle worker may take back, and what the straggler
policies decide (backups when idle; batch scales and restarts at clock ends). The job's schedule
(``dscar.core.schedule``) says which shards may run now and asks this part how to hand them out.

Invariants:

- ``batched`` names only workers with members, and only members that may not have started (a
  commit, a failure, a release or a pass start drops them): asking one back never stops work. It
  changes only through ``set_batched``, ``attempt_started``, ``voided``, ``released``, ``forget`` or a whole
  new dict set as ``batched`` (it is a view of the workers' records: ``dscar.core.workers``), which keep
  its index (``BatchIndex``) and the queue's waiting attempts (``ShardQueue.set_waiting``: the policies'
  view of the started ones) in step;
- ``running_items`` holds a worker's shard-pass item until it commits or fails, whatever clock it
  is of: the monitor's evidence of a worker that does not finish;
- a lost worker is forgotten here at once (``forget``): nothing waits on it or is asked of it.
"""
from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple

from .policies import Backup, ControllerView, Policy, Restart, Running, SetBatchScale
from .shards import Attempt, ShardQueue
from .workers import RecordView, WorkerRecords

if TYPE_CHECKING:
    from .job import JobState

class SspFields(NamedTuple):
    """What an SSP work item carries of the clock window (``SspSchedule``): per member ``(clock, seen,
    mine)`` (``protocol.Member``), the item's newest clock, the window's version and floor, and the
    oldest table version its reads may use. (A named tuple: one is made per hand-out.)"""

    members: list[tuple[int, Any, bool]]
    clock: int
    version: int
    floor: int
    read_floor: int


#: a work item holds at least this much shard work by the worker's measured step time (and at least
#: the worker's share of the pass: ``ThroughputMonitor.pass_share``)
BATCH_TARGET_S = 0.01
#: at most this many shard attempts in one work item
MAX_BATCH = 64
#: a worker's share of a pass goes in items of at most about this much work by its step time: a
#: commit is the job's visible progress (the stall watch, the dashboard), so one comes this often
SHARE_MAX_S = 2.0
#: a straggler is left out of a pass's tail only where that saves at least this long (seconds): for
#: steps of microseconds the hand-out noise, and moving the shard's data to another worker, cost more
HOLD_BACK_MIN_S = 0.005
#: an idle worker asks batch members back only where they are at least this much of their worker's work
#: by its measured step (seconds): less, it runs them before the release's round trip, the hand-out and
#: the shard's data move would let another start (bench.overhead's microsecond steps: ~1 release a clock
#: at 2 workers x 16 shards, each a round trip for nothing)
ASK_BACK_MIN_S = 0.002


class RunningAttempts:
    """The queue's running shards as a policy sees them (``Running``: each shard's longest-running
    attempt), the longest running first, each built when it is read: the backup policy, asked on
    every idle poll at a pass's tail, reads the oldest few it may back up and stops (a list of every
    running attempt per poll is O(W) a decision; so is skipping, one by one, the shards that have all
    the attempts they may have: ``longest_running`` does not look at them).

    ``waiting``: an attempt that is a batch member which may not have started is not shown (its
    shard shows its next attempt, if any); with ``started_only`` the queue's index of the shards
    with a started attempt is read (``ShardQueue.set_waiting`` says the same as ``waiting``), so the
    members are not even stepped over: at a pass's tail most running shards are such members, and
    an idle poll stepped over all of them to find the longest running. ``pace``: how many attempts
    the item of a worker holds; an attempt's time is shown divided by it. The order stays by start
    time, so with batches of different sizes a policy that stops at the first attempt that is not
    late may look again at its next poll before it sees a later one (it backs up the earlier one
    first as it ages)."""

    __slots__ = ("queue", "now", "waiting", "pace", "started_only")

    def __init__(self, queue: ShardQueue, now: float, waiting: Callable[[Attempt], bool] | None = None,
                 pace: Callable[[str], int] | None = None, started_only: bool = False):
        self.queue = queue
        self.now = now
        self.waiting = waiting
        self.pace = pace
        #: ``waiting`` says what the queue's waiting attempts say (``ShardQueue.set_waiting``): its index of
        #: the shards with a started attempt is read, and the shards it would skip are not looked at
        self.started_only = started_only

    def __iter__(self) -> Iterator[Running]:
        return self.longest_running()

    def longest_running(self, fewer_attempts_than: int | None = None) -> Iterator[Running]:
        """The running shards (with fewer than ``fewer_attempts_than`` attempts started this pass), the
        longest running first."""
        queue, now, waiting, started_only = self.queue, self.now, self.waiting, self.started_only
        for a in queue.longest_running(fewer_attempts_than, started_only=started_only):
            others = queue.running_attempts(a.shard)
            # (a shard the queue shows with one attempt shows a started one)
            if waiting is not None and not (started_only and len(others) == 1) and waiting(a):
                shown = [b for b in others if not waiting(b)]
                if not shown:
                    continue
                a = min(shown, key=lambda b: (b.started, b.attempt))
            elapsed = now - a.started
            if self.pace is not None:
                elapsed /= self.pace(a.worker)
            yield Running(a.shard, a.worker, elapsed, queue.attempts_started(a.shard),
                          tuple(b.worker for b in others))

    def oldest_elapsed(self, fewer_attempts_than: int | None = None) -> float | None:
        """The time ``longest_running`` shows first (None: none), without building it: an idle poll
        asks whether the longest running is late, and at a pass's tail it is mostly not."""
        if self.started_only:
            oldest = self.queue.oldest_started(fewer_attempts_than)
            if oldest is None:
                return None
            a, n_attempts = oldest
            if self.waiting is None or n_attempts == 1 or not self.waiting(a):
                elapsed = self.now - a.started
                return elapsed / self.pace(a.worker) if self.pace is not None else elapsed
        first = next(self.longest_running(fewer_attempts_than), None)
        return None if first is None else first.elapsed_s

    def __len__(self) -> int:
        return self.queue.n_doing

    def __contains__(self, item: object) -> bool:
        return any(r == item for r in self)


class JobView(ControllerView):
    """A job's ``ControllerView``, one per ``Dispatch``, read live: its clock, startable shards and
    stragglers are the job's when a policy reads them, not copied in at every view (every idle poll
    asks the backup policy, which reads the startable shards and the oldest running attempt, nothing
    else); ``Dispatch.view`` sets the rest. Its monitor and its running attempts' readers are bound once
    (a job's monitor is its own for its life; a new queue makes a new view)."""

    def __init__(self, dispatch: "Dispatch", running: RunningAttempts):
        self._dispatch, self._job = dispatch, dispatch.job
        self.running = running
        self.monitor = dispatch.job.monitor
        self.workers: list[str] = []
        self.idle_worker: str | None = None
        # (``ControllerView``'s readers, asked of ``running`` without a frame of their own)
        self.longest_running = running.longest_running  # type: ignore[method-assign]
        self.oldest_elapsed = running.oldest_elapsed  # type: ignore[method-assign]

    @property
    def clock(self) -> int:  # type: ignore[override]
        return self._job.clock

    @property
    def todo(self) -> int:  # type: ignore[override]
        return self._job.schedule.n_startable

    @property
    def stragglers(self) -> dict[str, str]:  # type: ignore[override]
        return self._dispatch.stragglers


#: the end mark of a ``_descending`` key: above every flipped character
_END = chr(0x10FFFF)


def _descending(name: str) -> str:
    """A key that orders names the other way round (``a < b`` iff ``key(a) > key(b)``): a min-heap
    on it pops the largest name first. Each character ``c`` becomes ``U+10FFFE - c``, and a name's
    prefix sorts before it, so the end mark (U+10FFFF) is above every flipped character (a name holds
    no U+10FFFF). A string, not a tuple of negated code points: one object whose comparison is a loop
    in C, where a tuple's compares an int object per character (at 4,096 workers most of them cold
    reads, and the heap compares keys on every tie of member counts)."""
    return "".join([chr(0x10FFFE - ord(c)) for c in name]) + _END


class BatchIndex:
    """The workers with batch members that may not have started, the most members first (ties: the
    last name): ``Dispatch.ask_back``'s pick without a scan of the workers (an idle worker at a
    pass's tail asks on every poll; a scan is O(W) a decision).

    A heap of ``(-members, name key, worker)`` entries, one pushed at every change of a worker's
    count; an entry whose count is no longer its worker's is stale and dropped when it comes to
    the top (lazy deletion). The heap is rebuilt when stale entries outnumber the live ones. Every
    worker with members has a fresh entry or is ``_changed``: those are the only ones a rebuild or a
    reset looks at (the members are the workers' records', ``WorkerRecord.members``)."""

    def __init__(self, records: WorkerRecords):
        #: worker -> its record: its members (``WorkerRecord.members``), its name key (``WorkerRecord.key``,
        #: kept while it is not forgotten: a worker is batched again at nearly every hand-out, and its key
        #: costs a step per character of its name) and whether it is listed in ``_changed`` (``WorkerRecord.batch_changed``)
        self.records = records
        #: how many workers have members
        self.n_batched = 0
        self._heap: list[tuple[int, str, str]] = []
        #: workers whose members changed since the heap was last read, each once (its record's ``batch_changed``):
        #: their entries are pushed then (``_settle``). Only an idle poll at a pass's tail reads it (``most``),
        #: while every hand-out and a commit of each batch member change a worker's count: a push at each change
        #: was work for nothing in most passes (two of a 4-member batch's commits pushed an entry gone stale at
        #: once). A list and a flag, not a set: between reads it names most workers, and a set's insert was a
        #: cold read at thousands of them, where the flag is in the record the caller holds
        self._changed: list[str] = []

    def _entry(self, worker: str) -> tuple[int, str, str] | None:
        """``worker``'s fresh entry (None: it has no members); it is no longer listed as changed."""
        record = self.records[worker]
        record.batch_changed = False
        members = record.members
        if not members:
            return None
        key = record.key
        if key is None:
            key = record.key = _descending(worker)
        return -len(members), key, worker

    def rebuild(self) -> None:
        """One fresh entry for every worker with members, from those the heap or ``_changed`` names."""
        named = {e[2] for e in self._heap}
        named.update(self._changed)
        self._heap = [e for e in map(self._entry, named) if e is not None]
        heapq.heapify(self._heap)
        self._changed = []

    def reset(self, batched: dict[str, list[tuple[int, int]]]) -> None:
        """Every worker's members are ``batched``'s now (none for a worker it does not name)."""
        records = self.records
        for e in self._heap:
            records[e[2]].members = None
        for w in self._changed:
            records[w].members = None
        self.n_batched = 0
        for w, members in batched.items():
            if members:
                records[w].members = members
                self.n_batched += 1
                self.changed(w)
        self.rebuild()

    def changed(self, worker: str) -> None:
        """``worker``'s members changed (or it has none now): its entry follows when the heap is read."""
        record = self.records[worker]
        if not record.batch_changed:
            record.batch_changed = True
            self._changed.append(worker)

    def _settle(self) -> None:
        """The entries of the workers changed since the last read are pushed (the heap rebuilt when they
        are many, or when stale entries outnumber the live ones)."""
        changed = self._changed
        if not changed:
            return
        if 2 * len(changed) > self.n_batched:
            self.rebuild()
            return
        heap = self._heap
        for entry in map(self._entry, changed):
            if entry is not None:
                heapq.heappush(heap, entry)
        changed.clear()
        if len(heap) > 2 * self.n_batched + 32:
            self.rebuild()

    def forget(self, worker: str) -> None:
        """``worker`` is gone (it has no members): its key goes too."""
        record = self.records.get(worker)
        if record is not None:
            record.key = None

    def _fresh(self, entry: tuple[int, str, str]) -> bool:
        members = self.records[entry[2]].members
        return members is not None and len(members) == -entry[0]

    def most(self, skip: Callable[[str], bool]) -> str | None:
        """The worker with the most members (ties: the last name) that ``skip`` does not rule out."""
        if self._changed:
            self._settle()
        heap, passed, out, records = self._heap, [], None, self.records
        seen: set[str] = set()
        while heap:
            entry = heap[0]
            w = entry[2]
            members = records[w].members  # (``_fresh``, inline: every idle poll at a pass's tail asks)
            if w in seen or members is None or len(members) != -entry[0]:
                heapq.heappop(heap)
            elif skip(w):
                seen.add(w)
                passed.append(heapq.heappop(heap))
            else:
                out = w
                break
        for entry in passed:
            heapq.heappush(heap, entry)
        return out

    def check(self) -> None:
        """Every worker with members has a fresh entry; no fresh entry names one without; ``n_batched`` counts
        them; no record is left marked changed."""
        self._settle()
        fresh = {e[2] for e in self._heap if self._fresh(e)}
        batched = {w for w, r in self.records.items() if r.members}
        assert fresh == batched, (fresh, batched)
        assert self.n_batched == len(batched), (self.n_batched, batched)
        flagged = {w for w, r in self.records.items() if r.batch_changed}
        assert not flagged, flagged  # (settled: nobody listed as changed)


class Dispatch:
    """Work items, moves, stragglers and policies for one fit."""

    def __init__(self, job: JobState, policies: list[Policy] | None = None):
        #: the job this part hands work out for (its queue, monitor, schedule, live workers)
        self.job = job
        #: seconds a moved shard's data took to arrive and be prepared (the moved attempts' ``data_s``,
        #: smoothed); None until a shard has moved
        self.move_s: float | None = None
        #: straggler policies (backup at idle time; adaptive batch and restart at clock ends)
        self.policies = list(policies or ())
        #: the queue keeps its index of the started attempts (``ShardQueue.set_waiting``) only for an
        #: idle-time policy, which reads it on every idle poll; without one a commit does not pay for it
        self._track_started = any(p.when == "idle" for p in self.policies)
        #: worker -> batch scale (adaptive-batch policy)
        self.batch_scale: dict[str, float] = {}
        #: worker -> "transient" | "persistent"
        self.stragglers: dict[str, str] = {}
        #: workers a policy decided to restart at the next clock boundary
        self.pending_restarts: list[str] = []
        #: worker -> its record (``dscar.core.workers``), the monitor's table: a hand-out and a commit read
        #: and write what is the worker's here (``seen``, ``running``, ``members``, ``item``) and the
        #: monitor reads its steps in the same record, one dict entry, not one in each of six dicts
        self.records: WorkerRecords = job.monitor.records
        #: ``batched`` (the records' members), the most members first
        self._batch_index = BatchIndex(self.records)
        #: worker -> id of the last work item handed to it (its record's ``item``): a release names it, so
        #: a worker asked before that item reached it gives the members back all the same (``ShardRunner.release``)
        self.item_of: RecordView = RecordView(self.records, "item")
        #: work items handed out so far (item ids count up from 1)
        self.items_handed = 0
        #: worker -> (hand-out time, shards) of the shard-pass work item it is running (its record's
        #: ``running``), until it commits or fails (whatever clock it is of): the monitor's evidence of a
        #: worker that does not finish, since backups may win its shards and close the pass without it
        self.running_items: RecordView = RecordView(self.records, "running")
        #: when each worker last asked for work or committed (its record's ``seen``; ``worth_moving``: a
        #: holder that stopped asking)
        self.last_seen: RecordView = RecordView(self.records, "seen")
        #: what the policies see (``view``: built once, then told the workers, the time and the asker at each view)
        self._view: JobView | None = None
        #: the policies that decide when a worker is idle (``idle_policies``; every idle poll asks them)
        self._idle = tuple(p for p in self.policies if p.when == "idle")
        #: raised by every change of ``running_items`` that may show an attempt as running longer (an item
        #: ended or holds fewer: its pace); with the queue's and the monitor's ``changes``, what the idle
        #: policies see is as it was while they hold
        self.changes = 0
        #: (queue, changes, since, until): the idle policies found nothing to start at ``since`` and find
        #: nothing before ``until`` while the queue and the changes are these (None: not known)
        self._quiet: tuple[ShardQueue, int, float, float] | None = None

    @property
    def batched(self) -> RecordView:
        """worker -> (shard, attempt) of the members of its last work item that may not have started
        (the first of a batch starts at once); a pass start, a commit or a failure drops them. Read-only:
        the records' ``members``, which change through ``set_batched`` and the rest (the index follows)."""
        return RecordView(self.records, "members")

    @batched.setter
    def batched(self, value: dict[str, list[tuple[int, int]]]) -> None:
        self._batch_index.reset(value)
        if self._track_started:
            queue = self.job.queue
            queue.clear_waiting()
            for worker, members in value.items():
                if members:
                    queue.set_waiting(worker, members, ())

    def _mark(self, worker: str, old: list[tuple[int, int]] | None, new: list[tuple[int, int]] | None) -> None:
        """``worker``'s members went from ``old`` to ``new``: the queue's waiting attempts follow
        (``RunningAttempts.started_only``). ``batched`` is what the queue was last told, so its list
        before a change is the diff's other side (no copy of it is kept)."""
        if not old:  # (most hand-outs: its earlier members have all started; no set difference to take)
            if new:
                self.job.queue.set_waiting(worker, new, ())
            return
        before, after = set(old), set(new) if new else set()
        if before != after:
            self.job.queue.set_waiting(worker, after - before, before - after)

    def forget(self, worker: str) -> None:
        """``worker`` is lost: its batch members, running item, batch scale and straggler flag go."""
        record = self.records[worker]
        old, record.members = record.members, None
        if old:
            self._batch_index.n_batched -= 1
        self._batch_index.changed(worker)
        if self._track_started:
            self._mark(worker, old, None)
        self._batch_index.forget(worker)
        self.item_done(worker)
        self.batch_scale.pop(worker, None)
        self.stragglers.pop(worker, None)

    def leave_to_others(self, worker: str, n_left: int | None = None) -> bool:
        """Whether the other workers would finish every shard still to do before ``worker`` finished
        one (by the monitor's step times): then it starts no more this clock, and the pass does not
        wait at its tail for a straggler's step (``s`` times slower: up to ``s`` fast steps).

        The others' time for the ``n`` shards left is about ``n / sum(speed)`` plus one step of the
        slowest of them (a shard is not divisible), plus ``HOLD_BACK_MIN_S``, so a healthy cluster's
        noise never crosses it. The caller gives every worker one attempt a clock first, so a
        straggler that recovers is measured again. Dynamic sharding only: a static shard waits for
        its holder anyway. ``n_left``: the shards the others may run before the pass waits for
        ``worker``'s (default: every shard still to do)."""
        queue = self.job.queue
        if queue.sharding != "dynamic":
            return False
        # the others' summed speed and slowest step, from the monitor's running figures: it forgets a
        # lost worker (``JobState.forget_worker``), so every worker it measures is live, and this is O(1)
        return self.job.monitor.outlasts_others(worker, queue.n_todo if n_left is None else n_left, HOLD_BACK_MIN_S)

    def worth_moving(self, worker: str, now: float, holder: str, backlog: int) -> bool:
        """Whether ``worker``, out of shards of its own, should take one of ``holder``'s ``backlog``
        TODO shards: only if it would finish it, data move included, before the holder would (its
        current step half done, then the backlog), by the monitor's step times and ``move_s``.
        Delay scheduling, as Spark's locality wait: a shard that runs in 80 ms and takes 200 ms to
        move (ALS, 600k ratings) waits for its holder; a straggler's shards still move.

        Yes while anything is unmeasured, for a holder that is gone or held back (a straggler the
        others are to relieve: ``_held_back``), and for one that is late: its work item has run over
        twice its expected time, or it has neither asked for work nor committed for a step's time (a
        hung worker that stopped asking would otherwise keep its shards forever)."""
        mine, theirs = self.job.monitor.mean_step(worker), self.job.monitor.mean_step(holder)
        if (self.move_s is None or mine is None or theirs is None or holder not in self.job._worker_set
                or self.job.schedule.held_back(holder)):
            return True
        record = self.records[holder]
        running = record.running
        if running is not None and now - running[0] > 2 * running[1] * theirs:
            return True
        if running is None and (record.seen is None or now - record.seen > theirs):
            return True
        return self.move_s + mine < (backlog + 0.5) * theirs

    def note_move(self, attempt: Attempt | None, timings: dict | None) -> None:
        """A finished attempt that copied its shard from another worker measured a move: ``move_s``."""
        if attempt is not None and attempt.fetch_from and timings and "data_s" in timings:
            moved = float(timings["data_s"])
            self.move_s = moved if self.move_s is None else 0.5 * (self.move_s + moved)

    def batch_size(self, worker: str) -> int:
        """How many of its own shards ``worker`` gets in one work item: enough to run about
        ``BATCH_TARGET_S`` by its measured step time, and at least its share of a pass
        (``ThroughputMonitor.pass_share``, up to ``SHARE_MAX_S`` of steps); one before it has a step time. A short step
        then costs one commit per batch, not one per shard, and k long ones a clock one commit, not k.
        Under SSP too: each member is a shard the window lets start, at its own clock, and a shard's
        next clock waits for the batch's commit, as a BSP clock waits for its pass (a worker with k
        shards a clock then runs its clock in one item, not k, and the window's hand-out is paid once).
        A batch does not pin its shards: members not started yet are released to an idle worker
        (``releasable``), so dynamic sharding still moves work away from a worker that suddenly slows
        down."""
        job = self.job
        step, share = job.monitor.pass_share(worker, len(job._workers), len(job.queue.active))
        if step is None:
            return 1
        if (most := int(SHARE_MAX_S / step)) < share:
            share = most
        if (least := int(BATCH_TARGET_S / step)) > share:
            share = least
        return 1 if share < 1 else MAX_BATCH if share > MAX_BATCH else share

    def item_done(self, worker: str) -> None:
        """``worker``'s running item ended (committed, failed, or the worker is gone)."""
        self.records[worker].running = None
        self.changes += 1

    def live(self, shard: int, attempt: int, worker: str) -> bool:
        """Whether that attempt may still commit (not beaten, failed or given back): a lost-race stop
        of a live attempt was a wrong verdict (under BSP a pass being applied keeps its run id)."""
        return any(a.attempt == attempt and a.worker == worker for a in self.job.queue.running_attempts(shard))

    def attempt_started(self, worker: str, shard: int, attempt: int) -> None:
        """``worker`` has started batch member ``(shard, attempt)`` (it commits or fails): not asked back."""
        record = self.records[worker]  # (its members read without ``batched``'s view: every commit asks)
        members = record.members
        if members and (shard, attempt) in members:
            members.remove((shard, attempt))
            index = self._batch_index
            if not members:
                record.members = None
                index.n_batched -= 1
            if not record.batch_changed:  # (``BatchIndex.changed``, inline: every commit of a member)
                record.batch_changed = True
                index._changed.append(worker)
            if self._track_started and (shard, attempt) not in members:  # (``_mark`` without the set diff)
                self.job.queue.unwait(shard, attempt, worker)

    def voided(self, attempt: Attempt) -> None:
        """``attempt`` can no longer commit (a recovery voided it, its shard starts again): if it was a
        batch member, it is none any more (asking it back would find nothing)."""
        self.attempt_started(attempt.worker, attempt.shard, attempt.attempt)

    def set_batched(self, worker: str, members: list[tuple[int, int]]) -> None:
        """``batched`` keeps only workers with members (``ask_back`` looks at each of them)."""
        index, record = self._batch_index, self.records[worker]
        old = record.members
        if members:
            record.members = members
            if not old:
                index.n_batched += 1
            if not record.batch_changed:  # (``BatchIndex.changed``, inline: every hand-out of a batch)
                record.batch_changed = True
                index._changed.append(worker)
        else:  # (its index entries go stale, and are dropped when read)
            record.members = None
            if old:
                index.n_batched -= 1
        if self._track_started:  # (every hand-out ends here: it pays for its own changes of the index)
            queue = self.job.queue
            if old:
                self._mark(worker, old, members)
            elif members:  # (``_mark`` with no old members, inline: most hand-outs of a batch)
                queue.set_waiting(worker, members, ())
            queue.settle_started()

    def ask_back(self, asker: str) -> tuple[str, list[tuple[int, int]]] | None:
        """The worker with the most batch members that may not have started, and the later half of
        them, to ask back for ``asker`` (None: nobody has any, or they are less than ``ASK_BACK_MIN_S``
        of its work by its measured step: it runs them before a release would move them -- unless
        ``asker`` has no step measured yet, a joiner: it takes some, and is measured). From
        ``BatchIndex``: O(log W)."""
        lost = self.job.losses.lost
        victim = self._batch_index.most(lambda w: w == asker or w in lost)
        if victim is None:
            return None
        members = self.records[victim].members
        later = members[len(members) // 2:]  # type: ignore[index]
        monitor = self.job.monitor
        step = monitor.mean_step(victim)
        if step is not None and len(later) * step < ASK_BACK_MIN_S and monitor.mean_step(asker) is not None:
            return None
        return victim, later

    def released(self, worker: str, asked: list[tuple[int, int]], released: list[tuple[int, int]],
                 now: float) -> None:
        """``worker`` gave back the ``released`` members of those ``asked`` (it never started them);
        the others have started, or the answer came too late to be heard (then the worker's commit
        names them again): they are not asked for again."""
        done = {(int(s), int(a)) for s, a in asked}
        back = [(int(s), int(a)) for s, a in released if self.job.queue.release(int(s), int(a), worker)]
        record = self.records[worker]
        self.set_batched(worker, [m for m in record.members or () if m not in done])
        if back:
            if (running := record.running) is not None:  # its item now holds fewer
                record.running = (running[0], max(1, running[1] - len(back)))
                self.changes += 1
            self.job.event(now, "batch-released", worker=worker, shards=sorted(s for s, _ in back))
        self.job.schedule.given_back(s for s, _ in back)

    def item(self, batch: list[Attempt], rebuild: bool, window: SspFields | None = None, *,
             clock: int | None = None, run: int | None = None) -> dict:
        """The work item message for ``batch`` (its first member's worker runs them in order);
        ``window``: under SSP, what each member and the item carry of the clock window. ``clock`` and
        ``run``: the job's clock and run id, when the caller has them at hand (default: asked of the job).

        The message is ``protocol.WorkItem(...).to_msg()`` with ``protocol.Member`` members, built as
        the dicts those make (keys in their order, the optional ones only when set) without building the
        dataclasses first: every hand-out makes one, and the dataclasses cost it about as much as the
        rest of the hand-out (tests/test_dispatch_item.py holds the two equal)."""
        job = self.job
        if window is not None:  # (its fields unpacked once: a named tuple's field is read through a descriptor)
            fields, window_clock, version, floor, read_floor = window
        else:
            fields, window_clock, version, floor, read_floor = [None] * len(batch), None, None, None, None
        item_clock = clock if clock is not None else job.clock if window is None else window_clock
        phases, restore, queue = job.cfg.phase_names, job.losses.restore_state, job.queue
        one_phase = len(queue.phase_ranges) == 1
        phase = phases[0] or None
        members = []
        for (shard, attempt, _, _, fetch_from, backup), ssp in zip(batch, fields):
            if not one_phase:
                phase = phases[queue.phase_of(shard)] or None
            if ssp is not None and not restore:  # (an SSP member whose fields are all set: one dict, in key order)
                clock, seen, mine = ssp
                if clock is not None and seen is not None and mine is not None:
                    members.append({"shard": shard, "attempt": attempt, "fetch_from": fetch_from, "backup": backup,
                                    "phase": phase, "clock": clock, "seen": seen, "mine": mine})
                    continue
            m = {"shard": shard, "attempt": attempt, "fetch_from": fetch_from, "backup": backup, "phase": phase}
            if restore and (state_file := restore.get(shard)) is not None:
                m["state_file"] = state_file
            if ssp is not None:
                clock, seen, mine = ssp
                if clock is not None:
                    m["clock"] = clock
                if seen is not None:
                    m["seen"] = seen
                if mine is not None:
                    m["mine"] = mine
            members.append(m)
        self.items_handed = item_id = self.items_handed + 1
        worker = batch[0].worker
        self.records[worker].item = item_id
        msg = {"op": "rebuild" if rebuild else "shard", "job": job.cfg.job_id, "item": item_id,
               "clock": item_clock, "run": job.run_id if run is None else run, "owners": job.pmap.to_msg(),
               "batch_scale": self.batch_scale.get(worker, 1.0), "shards": members}
        if rebuild and job.losses.restored_rows:
            msg["restored"] = {t: [list(r) for r in rs] for t, rs in job.losses.restored_rows.items()}
        if version is not None:
            msg["version"] = version
        if floor is not None:
            msg["floor"] = floor
        if read_floor is not None:
            msg["read_floor"] = read_floor
        return msg

    def view(self, workers: list[str], now: float, idle_worker: str | None = None) -> ControllerView:
        """What a straggler policy sees (``dscar.core.policies``). Batch members that may not have started
        (``batched``) are not shown running: they wait behind their batch's earlier members, and an
        idle worker asks them back (``ask_back``) rather than back them up; asked once, they show.
        An attempt of a batch of n commits with the batch's last: its time is shown as the item's
        pace (the item's time over n), so it looks late once the item has run k times n steps, not
        k steps (else every batch's first member would look late before its batch could end)."""
        view, queue = self._view, self.job.queue
        if view is None or view.running.queue is not queue:
            view = self._view = JobView(self, RunningAttempts(queue, now, self._waiting, self._item_size,
                                                              started_only=self._track_started))
        # (one view, told what changed: every idle poll asks, and what it shows is read live from the
        # queue, the monitor and the job anyway)
        view.workers, view.idle_worker = workers, idle_worker
        view.running.now = now
        return view

    def _waiting(self, a: Attempt) -> bool:
        """``a`` is a member of a batch that may not have started yet."""
        record = self.records.get(a.worker)
        return record is not None and (a.shard, a.attempt) in (record.members or ())

    def _item_size(self, worker: str) -> int:
        """How many attempts the shard-pass item ``worker`` is running holds (1: none, or one)."""
        record = self.records.get(worker)
        running = None if record is None else record.running
        return max(1, running[1]) if running is not None else 1

    def idle_policies(self, worker: str, now: float) -> Attempt | None:
        """``worker`` is idle: a backup attempt an idle-time policy starts for it (None: none).

        Most idle polls find what the policies read as the previous poll left it: a policy that
        found nothing says for how long that holds (``Policy.decide_idle``), and until then, while
        the queue, the monitor and the running items' pace are unchanged (their ``changes``), the
        answer is kept, not asked again."""
        job = self.job
        queue = job.queue
        quiet = self._quiet
        if (quiet is not None and quiet[0] is queue and quiet[2] <= now < quiet[3]
                and quiet[1] == queue.changes + job.monitor.changes + self.changes):
            return None
        view = self.view(job.workers, now, worker)
        holds = math.inf
        for policy in self._idle:
            actions, quiet_s = policy.decide_idle(view)
            for action in actions:
                if isinstance(action, Backup):
                    a = queue.start_backup(action.shard, action.worker, now)
                    job.event(now, "backup-attempt", shard=a.shard, attempt=a.attempt, worker=worker,
                              policy=policy.name)
                    return a
            if quiet_s < holds:
                holds = quiet_s
        # (less a margin far above the rounding of ``now`` less a start: the time it turns due is early, never late)
        until = now + holds - 1e-12 * (1.0 + abs(now))
        self._quiet = (queue, queue.changes + job.monitor.changes + self.changes, now, until) if until > now else None
        return None

    def clock_policies(self, now: float) -> None:
        """A clock ended: the monitor names its stragglers, and the clock-end policies decide
        (batch scales now; restarts at the next clock's start)."""
        running = {w: (now - t0, n) for w, (t0, n) in self.running_items.items()}
        stragglers = self.job.monitor.end_clock(running)
        for w, kind in stragglers.items():
            if self.stragglers.get(w) != kind:
                self.job.event(now, "straggler", worker=w, straggler=kind)
        for w in sorted(self.stragglers.keys() - stragglers.keys()):
            self.job.event(now, "straggler-recovered", worker=w)
        self.stragglers = stragglers
        for policy in self.policies:
            if policy.when != "clock":
                continue
            for action in policy.decide(self.view(self.job.workers, now)):
                if isinstance(action, SetBatchScale):
                    self.batch_scale = dict(action.scales)
                    self.job.event(now, "batch-scale", scales=self.batch_scale, policy=policy.name)
                elif isinstance(action, Restart) and action.worker not in self.pending_restarts:
                    self.pending_restarts.append(action.worker)
                    self.job.event(now, "restart-planned", worker=action.worker, reason=action.reason,
                                   policy=policy.name)
