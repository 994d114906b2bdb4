"""How a fit's clocks progress: one protocol, two schedules (no Dask here).

A ``Schedule`` answers the questions that depend on the consistency model: what may run now
(the next work item for a worker), what a commit grants, when a pass is applied and a clock
ends, what a loss rewinds, where a resume starts. ``BspSchedule`` drives the bulk-synchronous
clock machine (``dscar.core.clock``): one clock at a time, each data phase a pass over every shard.
``SspSchedule`` drives the stale-synchronous clock window (``dscar.core.ssp``): several clocks open
at once, committed updates applied in batches.

Both act on the job they belong to (``dscar.core.job.JobState``): its shard queue (attempts,
first-commit-wins, holders), its dispatch helpers (batches, moves, straggler rules), its tally,
log, losses and checkpoint planner. The job holds exactly one schedule and asks it; nothing
else knows which model runs.

Invariants (both): nothing is handed out while a recovery runs; a commit is granted only to an
attempt of the current run (BSP: the run id; SSP: the epoch) and of the shard's current clock;
a clock's report is given only once it has ended and no snapshot of it is being taken.
Under SSP the window's shard phases and the queue's statuses agree after every action
(``_sync_queue``: a shard the window runs is DOING, one it committed DONE, one it moved on TODO),
kept so by the shards each side names as changed (``ClockWindow.moved_back``, ``given_back``):
no decision scans every shard.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from .clock import Apply, ClockMachine, Recover, RunClockEnd, Skip, Stage, StartPass
from .effects import ApplyPass, BeginClock, Effect, RestartWorker, StartRecovery
from .dispatch import SspFields
from .elastic import ssp_leave_step
from ..errors import ShardFailedError
from .ledger import manifest_cut
from .monitor import step_seconds
from .protocol import RuleHistory
from .shards import Attempt, ShardStatus
from .ssp import ApplyBatch, ClockWindow, ShardPhase, SkipClock, StartRebuild
from .ssp import RunClockEnd as WindowClockEnd
from .ssp import StartRecovery as WindowRecovery

if TYPE_CHECKING:
    from .job import JobState


@dataclass
class EndingClock:
    """A clock whose clock end runs ahead of the next clock (``BspSchedule.applied``): what its report needs
    once the clock end reports, kept apart from the next clock's counts."""

    clock: int
    #: its run id (the clock end's report carries it)
    run: int
    #: the worker its clock end is folded into
    worker: str
    #: when the clock began and when its last pass was applied (the clock end's start)
    began: float
    applied_at: float
    #: its counts (the tally's dicts of that clock: the next clock's begin makes new ones)
    shards_done: dict[str, int]
    timings: dict[str, dict[str, float]]
    stage_s: dict[str, float]
    #: a worker was lost while it ran: an error it reports may be that loss's (its clock is skipped, not failed)
    lost_during: bool = False
    #: the workers whose committed attempts' updates its last apply collects, while that apply is under way (the
    #: next clock began with it: ``BspSchedule.applying``); a loss of one of them skips it
    stagers: frozenset[str] = frozenset()


def _refused(job: "JobState", now: float, worker: str, shard: int, attempt: int, timings: dict | None,
             late: bool) -> None:
    """A commit refused: its event, with the step time it wasted (``late``: a lost backup, an attempt of a
    voided pass or epoch; else another attempt of its shard won)."""
    job.event(now, "commit-refused", shard=shard, attempt=attempt, worker=worker, late=late,
              seconds=round(step_seconds(timings or {}), 4))


#: stages every hand-out reads, as module names (an enum member's lookup through its class costs ~75 ns)
_SHARDS, _REBUILD = Stage.SHARDS, Stage.REBUILD
#: an ``Attempt``'s (shard, attempt) pair, and its shard, read in C (every hand-out lists its members')
_PAIR, _SHARD = itemgetter(0, 1), itemgetter(0)
#: builds an SSP item's ``SspFields`` from a tuple of its fields without the named tuple's ``__new__`` (a Python frame
#: in CPython 3.11; every SSP hand-out makes one), as ``shards._new_attempt`` an ``Attempt``
_new_fields = tuple.__new__
#: the shard statuses and window phases ``SspSchedule`` compares with at every applied batch's shards, as module
#: names (an enum member's lookup through its class costs ~75 ns in CPython 3.11, a global's ~7)
_TODO_STATUS, _DOING_STATUS = ShardStatus.TODO, ShardStatus.DOING
_TODO_PHASE, _RUNNING_PHASE = ShardPhase.TODO, ShardPhase.RUNNING


class Schedule(Protocol):
    """What the job asks whatever the consistency model (``JobState`` forwards these)."""

    #: the worker running the clock-end step, once handed out
    clock_end_worker: str | None

    @property
    def clock(self) -> int:
        """The clock being run (under SSP the oldest open one)."""

    @property
    def run_id(self) -> int:
        """What work and messages are tagged with; older ones are stale (under SSP, the epoch)."""

    @property
    def recovering(self) -> bool:
        """Losses are being recovered: nothing completes meanwhile."""

    @property
    def handing_out(self) -> bool:
        """Shard attempts may be handed out now."""

    @property
    def stage_name(self) -> str:
        """Where the clock is, for reports ("shards", "apply", ...; "ssp" under SSP)."""

    @property
    def n_startable(self) -> int:
        """Shards whose attempt may start now: while there are any, an idle worker takes one of them,
        not a backup (the straggler policies' ``ControllerView.todo``)."""

    def begin(self, clock: int, now: float) -> list[Effect]: ...

    def next_item(self, worker: str, now: float) -> dict | None: ...

    def idle(self, worker: str, now: float) -> list[Effect]: ...

    def held_back(self, worker: str) -> bool: ...

    def releasable(self, asker: str) -> tuple[str, list[tuple[int, int]]] | None: ...

    def given_back(self, shards: Iterable[int] | None = None) -> None: ...

    def commit(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, now: float,
               timings: dict | None = None, rebuild: bool = False) -> tuple[bool, list[Effect]]: ...

    def commit_many(self, worker: str, run_id: int, finished: list[tuple[int, int, int, dict | None]], now: float,
                    rebuild: bool = False) -> tuple[list[bool], list[Effect]]: ...

    def attempt_failed(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, error: str,
                       now: float, lost_data: bool = False, seconds: float = 0.0, stopped: bool = False) -> None: ...

    def applying(self, run_id: int, now: float) -> list[Effect]: ...

    def apply_cut(self, run_id: int, now: float, why: str) -> None: ...

    def applied(self, run_id: int, now: float, batch: int | None = None, ahead: bool = False) -> list[Effect]: ...

    def clock_end_done(self, worker: str, run_id: int, metrics: dict, seconds: float, now: float,
                       clock: int | None = None, stop: bool | None = None) -> list[Effect]: ...

    def clock_end_failed(self, worker: str, run_id: int, error: str, now: float,
                         clock: int | None = None) -> list[Effect]: ...

    def unfold_clock_end(self, worker: str, now: float) -> list[Effect]: ...

    def snapshotted(self, now: float) -> list[Effect]: ...

    def report_for(self, clock: int, drop_older: bool = True) -> dict | None: ...

    def cut(self) -> list[int] | None: ...

    def lose(self, worker: str, now: float) -> list[Effect]: ...

    def recovered(self, now: float) -> list[Effect]: ...

    def rebase(self, manifest: dict) -> None: ...

    def progress(self) -> tuple[Any, bool]: ...

    def snapshot_fields(self) -> tuple[dict[str, Any], dict[str, Any]]: ...

    def counts_pass(self) -> bool: ...

    def stall_fields(self) -> dict[str, Any]: ...


class BspSchedule:
    """Bulk-synchronous clocks: the clock machine's stages, each data phase a pass over every shard
    (the queue's statuses are the pass's)."""

    def __init__(self, job: JobState, resume: dict | None = None):
        cfg = job.cfg
        #: the job this schedule decides for
        self.job = job
        #: the clock state machine: stage, run id, what a loss left to do
        self.machine = ClockMachine(n_phases=len(cfg.phase_names), has_rebuild=bool(cfg.rebuild))
        #: the worker running the clock-end step, once handed out
        self.clock_end_worker: str | None = None
        #: clocks begun so far: a worker whose record's ``handed_in`` is this count was handed a shard attempt
        #: this clock (each gets one, however slow: see ``Dispatch.leave_to_others``); a record, not a set of
        #: W names, is what every hand-out reads
        self.begins = 0
        #: the clock end runs folded into the apply of the clock's last pass on a worker chosen then
        #: (``ApplyPass.clock_end``): no clock-end item and no ``clock_done`` message on a clock's path
        self.fold_clock_end = False
        #: the worker the current clock's clock end is folded into (None: not folded, or given back)
        self.folded: str | None = None
        #: the coordinator may begin the next clock itself (``dscar.auto-begin``)
        self.auto_begin = False
        #: the last clock the coordinator may begin itself: the driver's last (0: none, the driver begins each)
        self.auto_until = 0
        #: the completed clocks' metrics, the stopping rule's history: sent with a folded clock end
        self.rule = RuleHistory()
        #: the current clock's stopping rule as the folded clock end evaluated it (None: not evaluated)
        self.stop: bool | None = None
        #: the clock after this one was begun by the coordinator (``BeginClock``), not to be begun by the driver
        self.next_begun = False
        #: some pass of this clock was told to apply: the tables differ from the clock's start
        self.applied_in_clock = False
        #: when the newest loss that kept its pass struck (attempts started before it may fail for it)
        self.kept_at = -math.inf
        #: a clock end that only reads may run while the next clock begins (the driver's ``ahead``: the
        #: algorithm's ``clock_end_reads_only`` and ``dscar.clock-end-ahead``)
        self.ahead_ok = False
        #: where the clock end runs ahead, the next clock may begin with the clock's last apply, before that is
        #: done (``applying``; ``dscar.begin-with-apply``)
        self.with_apply_ok = False
        #: the clock whose clock end runs ahead of the current one (``ClockMachine.end_ahead``); None: none
        self.ending: EndingClock | None = None
        #: the clock that ended ahead and its report's parts (``_report_of``), kept until no snapshot of it is taken
        self.ended_report: tuple[int, tuple] | None = None
        if resume is not None:
            self.machine.clock = int(resume["clock"])
            self.machine.stage = Stage.DONE
            self.machine.needs_rebuild = bool(cfg.rebuild)

    # ------------------------------------------------------------- queries
    @property
    def clock(self) -> int:
        return self.machine.clock

    @property
    def run_id(self) -> int:
        return self.machine.run_id

    @property
    def recovering(self) -> bool:
        return self.machine.recovering

    @property
    def handing_out(self) -> bool:
        return self.machine.handing_out

    @property
    def n_startable(self) -> int:
        return self.job.queue.n_todo

    @property
    def stage_name(self) -> str:
        return self.machine.stage.value

    @property
    def report_ready(self) -> bool:
        return self.machine.finished and not self.job.failed and not self.job.snapshotting

    def report_for(self, clock: int, drop_older: bool = True) -> dict | None:
        """Clock ``clock``'s report for the driver once it is finished (None: not yet); that of a
        clock the coordinator began the next one after is kept until the driver reads a newer one."""
        kept = self.job.tally.report_for(clock, drop_older)
        if kept is not None:
            return kept
        return self.report() if self.machine.clock == clock and self.report_ready else None

    def report(self) -> dict:
        job = self.job
        return self._report_of(job.metrics, self.machine.stage is Stage.SKIPPED, job.shards_done, job.timings,
                               job.stage_s, self.stop, self.next_begun)

    def _report_of(self, metrics: dict, skipped: bool, shards_done: dict, timings: dict, stage_s: dict,
                   stop: bool | None, next_begun: bool) -> dict:
        """A clock's report for the driver from its counts (the current clock's, or one that ended ahead)."""
        job = self.job
        return {
            "status": "done", "metrics": dict(metrics), "skipped": skipped, "checkpoint": job.checkpoint_status(),
            "shards_per_worker": dict(shards_done), "timings": timings, "stage_s": dict(stage_s),
            "workers": job.workers_report(), "stop": stop, "next_begun": next_begun,
        }

    def keep_report(self) -> None:
        """The coordinator begins the next clock itself (``BeginClock``): this one's report is kept for the driver."""
        self.job.tally.reports[self.machine.clock] = self.report()

    def cut(self) -> None:
        """Every shard's newest clock in the tables is the job's clock: no cut."""
        return None

    # ---------------------------------------------------------- carrying out
    def _book_stage(self, now: float) -> None:
        job, stage = self.job, self.machine.stage
        names = []
        if stage in (Stage.REBUILD, Stage.SHARDS, Stage.APPLY, Stage.CLOCK_END):
            names.append({Stage.CLOCK_END: "clock_end"}.get(stage, stage.value))
            if stage in (Stage.SHARDS, Stage.APPLY) and len(job.cfg.phase_names) > 1 and not self.machine.applying_rebuild:
                names.append(f"{names[0]}:{job.cfg.phase_names[self.machine.data_phase]}")
        job.tally.book_stage(names, now)

    def _carry(self, actions: list, now: float) -> list[Effect]:
        """Turn the clock machine's actions into queue changes and effects."""
        job, m = self.job, self.machine
        effects: list[Effect] = []
        for a in actions:
            if isinstance(a, StartPass):
                job.batched = {}
                if a.data_phase is None:
                    job.queue.begin_clock(m.clock, None)
                    job.event(now, "rebuild-started", tables=list(job.cfg.rebuild))
                elif a.redo and job.queue.phase == a.data_phase:
                    job.queue.restart_clock()
                else:
                    job.queue.begin_clock(m.clock, a.data_phase)
                if a.redo:
                    job.event(now, "clock-restarted", stage=m.stage.value,
                              data_phase=job.cfg.phase_names[m.data_phase] or None)
            elif isinstance(a, Apply):
                self.applied_in_clock = True
                reset = list(job.cfg.rebuild) if a.reset_rebuild else (
                    [t for t, k in job.cfg.kinds.items() if k == "reduction"] if a.reset_reductions else [])
                effects.append(ApplyPass(a.run_id, m.clock, job.queue.committed_attempts(), reset,
                                         a.reset_rebuild, phase=None if a.reset_rebuild else
                                         job.cfg.phase_names[m.data_phase] or None,
                                         clock_end=self._fold(a)))
            elif isinstance(a, RunClockEnd):
                self.clock_end_worker = self.folded  # (None: the item goes to the first worker that asks)
            elif isinstance(a, Recover):
                effects.append(StartRecovery())
            elif isinstance(a, Skip):
                job.metrics = {"objective": math.nan, "skipped": 1.0}
                job.event(now, "clock-end-skipped", reason=a.reason)
        return effects

    def _fold(self, a: Apply) -> dict | None:
        """The clock-end item to fold into the apply of pass ``a``, when it is the clock's last and
        the clock end follows it (no loss has doomed the clock): run by the live worker owning the
        most partitions (the fewest remote reads), the first such in ``workers`` order."""
        job, m = self.job, self.machine
        self.folded = None
        if (not self.fold_clock_end or a.reset_rebuild or m.applying_rebuild or m.recovering
                or m.data_phase + 1 < m.n_phases or m.skip_reason is not None):
            return None
        live = [w for w in job.workers if w not in job.losses.lost]
        if not live:
            return None
        owned = Counter(job.pmap.owners.values())
        self.folded = max(live, key=lambda w: (owned[w], -live.index(w)))
        item = {"op": "clock_end", "job": job.cfg.job_id, "clock": m.clock, "run": a.run_id,
                "owners": job.pmap.to_msg(), "owners_token": job.pmap.token(), "worker": self.folded}
        if self.auto_begin and m.clock < self.auto_until:  # (the rule decides whether a next clock begins here)
            item["rule"] = self.rule.part_for(self.folded)
            if self.ahead_ok:  # (its worker answers the apply before the clock end: ``applied`` may begin the next)
                item["ahead"] = True
        return item

    def unfold_clock_end(self, worker: str, now: float) -> list[Effect]:
        """The clock end folded into ``worker``'s apply did not run there (its worker stopped, a peer's
        table was not applied in time, the apply was sent again): the item path runs it as it did
        before folding, handed to the first worker that asks. One that ran ahead of the next clock
        cannot run later (the tables move on): its clock is skipped, as a loss under a clock end skips it."""
        e = self.ending
        if e is not None and e.worker == worker:
            self.machine.ending_skip = self.machine.ending_skip or "it did not run"
            return self._ended_ahead(e.run, None, 0.0, now, None)
        if self.folded != worker:
            return []
        self.folded = None
        if self.machine.stage is Stage.CLOCK_END and self.clock_end_worker == worker:
            self.clock_end_worker = None
        return []

    # ---------------------------------------------------------------- clocks
    def begin(self, clock: int, now: float) -> list[Effect]:
        """Start ``clock`` (the previous one finished and no recovery is under way); the restarts a
        policy planned happen now, between clocks."""
        job = self.job
        effects: list[Effect] = [RestartWorker(w) for w in job.pending_restarts]
        job.restarting.update(job.pending_restarts)
        job.pending_restarts = []
        job.tally.begin(now)
        self.begins += 1
        self.clock_end_worker = self.folded = None
        self.stop, self.next_begun = None, False
        self.applied_in_clock = False
        job.checkpoints.start_interval(now)
        return effects + self._carry(self.machine.begin(clock), now)

    def next_item(self, worker: str, now: float) -> dict | None:
        """The next work item for ``worker``: a batch of shard attempts, the clock-end step, or None."""
        job, m = self.job, self.machine
        record = job.dispatch.records[worker]  # (what is the worker's: one dict read a hand-out)
        record.seen = now
        if job.log.error is not None or worker in job.losses.lost or m.recovering:
            return None
        if m.handing_out:
            if record.handed_in == self.begins and job.dispatch.leave_to_others(worker):  # (``held_back``, inline)
                return None
            a = job.queue.next_shard(worker, now, worth_moving=job.dispatch.worth_moving) \
                if job.queue.n_todo else None  # (at a pass's tail most looks find none)
            if a is None and m.stage is _SHARDS:
                a = job.dispatch.idle_policies(worker, now)
            elif a is not None and a.fetch_from:
                job.event(now, "shard-moved", shard=a.shard, source=a.fetch_from, target=worker)
            if a is None:
                return None
            batch = [a]
            record.handed_in = self.begins
            if a.fetch_from is None and not a.backup:  # more of the worker's own shards, while steps are short
                size = job.dispatch.batch_size(worker)
                if size > 1:
                    batch += job.queue.take_own(worker, now, size - 1)
            job.dispatch.set_batched(worker, list(map(_PAIR, batch[1:])))  # its earlier items are done
            if m.stage is not _REBUILD:
                record.running = (now, len(batch))
            return job.dispatch.item(batch, m.stage is _REBUILD, clock=m.clock, run=m.run_id)
        if m.stage is Stage.CLOCK_END and self.clock_end_worker is None:
            self.clock_end_worker = worker
            return {"op": "clock_end", "job": job.cfg.job_id, "clock": m.clock, "run": m.run_id,
                    "owners": job.pmap.to_msg()}
        return None

    def idle(self, worker: str, now: float) -> list[Effect]:
        """``worker`` found nothing to do (under BSP nothing follows from it)."""
        return []

    def held_back(self, worker: str) -> bool:
        """Whether ``worker`` gets no more shards this pass (``next_item``'s straggler rule): its
        shards are the others' to run, moves and all."""
        record = self.job.dispatch.records.get(worker)
        return record is not None and record.handed_in == self.begins and self.job.dispatch.leave_to_others(worker)

    def releasable(self, asker: str) -> tuple[str, list[tuple[int, int]]] | None:
        """``asker`` found nothing to do in a pass: the worker with the most batch members that
        may not have started, and the later half of them, to ask back (None: nothing to ask)."""
        stage = self.machine.stage  # (the stages as module names: every idle poll asks)
        if stage is not _SHARDS and stage is not _REBUILD or self.job.queue.n_todo:
            return None
        return self.job.dispatch.ask_back(asker)

    def given_back(self, shards: Iterable[int] | None = None) -> None:
        """Shards went back to TODO in the queue: the queue is the pass's status, nothing follows."""

    def commit_many(self, worker: str, run_id: int, finished: list[tuple[int, int, int, dict | None]], now: float,
                    rebuild: bool = False) -> tuple[list[bool], list[Effect]]:
        """``commit`` for each ``(clock, shard, attempt, timings)`` of one message, in order: the job's
        parts looked up once a message, every rule read again for each attempt (a pass may complete
        under a message, and its later attempts are then late)."""
        job, m = self.job, self.machine
        log, lost = job.log, job.losses.lost
        dispatch, queue, monitor, tally = job.dispatch, job.queue, job.monitor, job.tally
        granted: list[bool] = []
        effects: list[Effect] = []
        seen = False
        for clock, shard, attempt, timings in finished:
            if log.error is not None or worker in lost:
                granted.append(False)
                continue
            if not seen:  # (what is the worker's -- its running item, when it was last seen -- once a message)
                record = dispatch.records[worker]
                record.running = None  # (``Dispatch.item_done``, inline)
                dispatch.changes += 1
                record.seen = now
                seen = True
            current = clock == m.clock and m.grants(run_id)
            # attempt numbers restart every pass: only the current run's can be looked up (and only where read:
            # a data move's timings, or a step without timings)
            if timings:
                if "data_s" in timings:  # (``note_move`` measures only a data move)
                    dispatch.note_move(queue.running_attempt(shard, attempt) if current else None, timings)
                if not rebuild:
                    monitor.record(worker, step_seconds(timings))
            elif not rebuild and current and (mine := queue.running_attempt(shard, attempt)) is not None:
                monitor.record(worker, now - mine.started)
            if not current:  # a lost backup, an attempt of a voided pass
                _refused(job, now, worker, shard, attempt, timings, late=True)
                granted.append(False)
                continue
            dispatch.attempt_started(worker, shard, attempt)
            if not queue.commit(shard, attempt, worker):
                _refused(job, now, worker, shard, attempt, timings, late=False)
                granted.append(False)
                continue
            if restore := job.losses.restore_state:  # the attempt started from the restored state; it lives on now
                restore.pop(shard, None)
            tally.committed(worker, timings)
            granted.append(True)
            if queue.complete and not m.recovering:  # (a kept pass completes once recovered)
                effects += self._pass_complete(now)
        return granted, effects

    def commit(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, now: float,
               timings: dict | None = None, rebuild: bool = False) -> tuple[bool, list[Effect]]:
        """An attempt asks to commit: the first live attempt of the current run wins.

        Every finished shard-step attempt tells its worker's speed first, whether it wins, is
        refused, or is late: a straggler whose shards were all backed up finishes after its pass
        is complete, often after its clock has ended, and not counting it would hide exactly the
        worker the monitor is for. ``rebuild``: a rebuild-pass attempt (other work: not counted)."""
        granted, effects = self.commit_many(worker, run_id, [(clock, shard, attempt, timings)], now, rebuild)
        return granted[0], effects

    def _pass_complete(self, now: float) -> list[Effect]:
        """Every shard of the active pass committed: apply it."""
        m = self.machine
        self._book_stage(now)
        rebuild = m.stage is Stage.REBUILD
        effects = self._carry(m.pass_complete(m.run_id), now)
        if not rebuild and m.held is None:  # (a held pass counts once its apply is sent: ``_send_held``)
            self.job.tally.pass_counted(self.job.queue.committed_by())
        return effects

    def _send_held(self, now: float) -> list[Effect]:
        """The next clock's applies go on (``ClockMachine.release_held``); one held is sent now: its pass counts."""
        held = self.machine.release_held()
        if held and not held[0].reset_rebuild:
            self.job.tally.pass_counted(self.job.queue.committed_by())
        return self._carry(held, now)

    def attempt_failed(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, error: str,
                       now: float, lost_data: bool = False, seconds: float = 0.0, stopped: bool = False) -> None:
        """An attempt raised after ``seconds`` of work. Every failure is an event; it counts against the
        shard unless a loss (a newer run id) explains it or another attempt of the shard is still running.
        ``stopped``: it stopped as one that lost its shard's race (``runner.LostRace``), no failure: an
        ``attempt-stopped`` event, never counted; were it still live (``late=False``: a wrong verdict),
        the shard runs again."""
        job, m = self.job, self.machine
        late = clock != m.clock or run_id != m.run_id
        job.event(now, "attempt-stopped" if stopped else "shard-failed", shard=shard, attempt=attempt,
                  worker=worker, error=error, late=late or (stopped and not job.dispatch.live(shard, attempt, worker)),
                  seconds=round(seconds, 4))
        job.dispatch.item_done(worker)
        if clock != m.clock or not (m.handing_out or m.keeping):
            return
        job.dispatch.attempt_started(worker, shard, attempt)
        mine = job.queue.running_attempt(shard, attempt)
        # (an attempt of a kept pass started before its loss may have read from the lost worker)
        kept = mine is not None and mine.started <= self.kept_at
        try:
            job.queue.fail(shard, attempt, worker, error, count=run_id == m.run_id and not stopped and not kept,
                           lost_data=lost_data)
        except ShardFailedError as e:
            job.fail(now, str(e))

    def applying(self, run_id: int, now: float) -> list[Effect]:
        """The apply of the pass of ``run_id`` is being sent. Where it is the clock's last pass and the
        clock end folded into it runs ahead (``_fold``), and nothing waits for the boundary, the next clock
        begins with it (``ClockMachine.apply_ahead``): its work is handed out now, and each worker takes
        it up once its own apply is done. Otherwise nothing: the next clock begins once it is applied."""
        job, m = self.job, self.machine
        if (not self.with_apply_ok or m.stage is not Stage.APPLY or not m.accepts(run_id) or m.applying_rebuild
                or m.hold or m.data_phase + 1 < m.n_phases or m.skip_reason is not None
                or not self._may_end_ahead(self.ahead_ok, self.folded)):
            return []
        self._book_stage(now)
        m.apply_ahead()
        self.clock_end_worker = self.folded
        t = job.tally
        self.ending = EndingClock(m.clock, m.run_id, self.folded, t.clock_t0, now, t.shards_done, t.timings, t.stage_s,
                                  stagers=frozenset(w for _, _, w in job.queue.committed_attempts()))
        self.next_begun = True  # (until its clock end says otherwise: ``_ended_ahead``)
        return [BeginClock(m.clock + 1, ahead=True)]

    def apply_cut(self, run_id: int, now: float, why: str) -> None:
        """The apply of ``run_id`` ended without every worker's answer (a loss, a worker stopped). Where the
        next clock began with it, its clock is skipped: some owners may have applied, others not."""
        if self._ending_applied(run_id, now):
            self.machine.ending_skip = self.machine.ending_skip or why

    def _ending_applied(self, run_id: int, now: float) -> bool:
        """The apply of the ending clock (``applying``) of ``run_id`` ended (``ClockMachine.ending_applied``):
        its time counts as that clock's, and its clock end's time from now. Whether it was that apply."""
        e = self.ending
        if e is None or not self.machine.ending_applied(run_id):
            return False
        e.stage_s["apply"] = e.stage_s.get("apply", 0.0) + now - e.applied_at
        e.applied_at = now
        return True

    def applied(self, run_id: int, now: float, batch: int | None = None, ahead: bool = False) -> list[Effect]:
        """Every live worker applied the pass of ``run_id``. ``ahead``: the clock end folded into the pass's
        apply was told to run ahead (``_fold``): the next clock may begin now (``_end_ahead``), unless it
        began with the apply (``applying``)."""
        m = self.machine
        if self._ending_applied(run_id, now):
            return []
        if m.stage is not Stage.APPLY or not m.accepts(run_id):
            return []
        self._book_stage(now)
        rebuild = m.applying_rebuild
        actions = m.applied(run_id)
        if rebuild:
            self.job.rebuild_done(now)
        effects = self._carry(actions, now)
        if m.stage is Stage.CLOCK_END and self._may_end_ahead(ahead, self.clock_end_worker):
            effects.append(self._end_ahead(now))
        return effects

    def _may_end_ahead(self, asked: bool, worker: str | None) -> bool:
        """Whether the clock end folded into ``worker`` may run ahead of the next clock: its worker was told
        so (``asked``: the fold's ``ahead``), the coordinator begins the next clock itself, and nothing
        waits for the boundary (a restart planned, a snapshot being taken)."""
        job = self.job
        return (asked and self.folded is not None and worker == self.folded and self.ending is None
                and self.auto_begin and self.machine.clock < self.auto_until and not job.failed
                and not job.pending_restarts and not job.snapshotting)

    def _end_ahead(self, now: float) -> BeginClock:
        """The clock end runs on while the next clock begins (``ClockMachine.end_ahead``)."""
        job, m = self.job, self.machine
        m.end_ahead()
        t = job.tally
        self.ending = EndingClock(m.clock, m.run_id, self.folded, t.clock_t0, now, t.shards_done, t.timings, t.stage_s)
        self.next_begun = True  # (until its clock end says otherwise: ``_ended_ahead``)
        return BeginClock(m.clock + 1, ahead=True)

    def _ended_ahead(self, run_id: int, metrics: dict | None, seconds: float, now: float,
                     stop: bool | None) -> list[Effect]:
        """The clock end that ran ahead reported (``metrics``; None: it did not run to completion): its
        clock is DONE (or skipped), its report kept for the driver; the next clock goes on, or is
        withdrawn (``ClockMachine.withdraw``) where the stopping rule said stop or was left to the driver."""
        job, m, e = self.job, self.machine, self.ending
        assert e is not None
        begun = m.clock > e.clock
        why = m.ending_skip or "its clock end did not run to completion"
        counts = m.ended_ahead(run_id, metrics is not None)
        self.ending = None
        e.stage_s["clock_end"] = e.stage_s.get("clock_end", 0.0) + now - e.applied_at
        effects: list[Effect] = []
        if counts:
            e.stage_s["clock_end_compute"] = float(seconds)
            effects += job.clock_finished(e.clock, metrics, now, e.began)
            self.rule.add(job.metrics)
        else:
            metrics = {"objective": math.nan, "skipped": 1.0}
            job.event(now, "clock-end-skipped", clock=e.clock, reason=f"the clock end ahead: {why}")
            stop = False  # (a skipped clock says nothing of convergence: the next goes on)
        go_on = stop is False and not job.failed
        if begun and not go_on:
            m.withdraw(e.clock)
            job.event(now, "clock-withdrawn", clock=e.clock + 1,
                      reason="the stopping rule said stop" if stop else "the stopping rule is the driver's to evaluate")
        elif not begun:
            self.next_begun = go_on
        self.ended_report = (e.clock, (metrics, not counts, e.shards_done, e.timings, e.stage_s, stop, go_on))
        if job.snapshotting:  # (the tables stay as the snapshot reads them: ``snapshotted`` sends the apply)
            return effects
        self._keep_ended_report()
        return effects + self._send_held(now)

    def _keep_ended_report(self) -> None:
        """The report of the clock that ended ahead goes to the driver (``report_for``), with its checkpoint's status."""
        if self.ended_report is not None:
            clock, parts = self.ended_report
            self.ended_report = None
            self.job.tally.reports[clock] = self._report_of(*parts)

    def clock_end_done(self, worker: str, run_id: int, metrics: dict, seconds: float, now: float,
                       clock: int | None = None, stop: bool | None = None) -> list[Effect]:
        """The clock-end step of ``clock`` (None: the current one) reported: the clock is DONE
        (unless a loss made its report stale). ``stop``: the stopping rule, evaluated with the clock
        end (folded); where it says go on and the driver's last clock is not reached, the next clock
        begins here (``BeginClock``) without a round trip to the driver."""
        job, m = self.job, self.machine
        clock = m.clock if clock is None else clock
        if self.ending is not None and clock == self.ending.clock and worker == self.ending.worker:
            return self._ended_ahead(run_id, metrics, seconds, now, stop)
        if worker != self.clock_end_worker or clock != m.clock or m.stage is not Stage.CLOCK_END \
                or not m.accepts(run_id):
            return []
        self._book_stage(now)
        m.clock_end_done(run_id)
        job.stage_s["clock_end_compute"] = float(seconds)
        effects = job.clock_finished(clock, metrics, now, job.tally.clock_t0)
        self.rule.add(job.metrics)  # (as the driver's history: the report's metrics)
        self.stop = stop
        self.next_begun = self.auto_begin and stop is False and clock < self.auto_until and not job.failed
        return effects + ([BeginClock(clock + 1)] if self.next_begun else [])

    def clock_end_failed(self, worker: str, run_id: int, error: str, now: float,
                         clock: int | None = None) -> list[Effect]:
        """The clock-end step raised: a loss under it skips the clock; otherwise the job fails."""
        m = self.machine
        if self.ending is not None and clock == self.ending.clock and worker == self.ending.worker:
            if run_id != self.ending.run or m.ending_skip is not None or self.ending.lost_during:  # (a loss's: skipped)
                return self._ended_ahead(self.ending.run, None, 0.0, now, None)
            self.job.fail(now, f"clock_end of clock {clock} failed on {worker}:\n{error}")
            return []
        if worker != self.clock_end_worker or clock not in (None, m.clock) or m.stage is not Stage.CLOCK_END:
            return []
        if run_id != m.run_id or m.recovering or m.skip_reason:
            return self._carry(m.clock_end_failed(), now)
        self.job.fail(now, f"clock_end of clock {m.clock} failed on {worker}:\n{error}")
        return []

    def snapshotted(self, now: float) -> list[Effect]:
        """A snapshot is taken: the driver's next clock may begin once none is left (``report_ready``); the
        report of a clock that ended ahead goes out, and the next clock's apply it held is sent."""
        if self.job.snapshotting:
            return []
        self._keep_ended_report()
        return self._send_held(now) if self.machine.hold and self.ending is None else []

    # --------------------------------------------------------------- losses
    def lose(self, worker: str, now: float) -> list[Effect]:
        """``worker`` is gone: requeue its attempts; plan a recovery if it took partitions or state."""
        job, m = self.job, self.machine
        unheld = m.held is not None
        m.unhold()  # (a pass whose apply waits for a clock end ahead: nothing of it is applied, it is open again)
        held = job.queue.held_by(worker)  # (before ``uncommit`` unsets the holders of its voided commits)
        applying = m.stage is Stage.APPLY
        unapplied = any(w == worker for _, _, w in job.queue.committed_attempts()) if applying else False
        # its commits of a pass not yet applied went with it: those shards run again
        voided = job.queue.uncommit(worker) if m.stage in (Stage.SHARDS, Stage.REBUILD) else []
        owned, restores = job.forget_worker(worker, held, set(voided), now)
        if job.failed or restores is None:
            return []
        effects: list[Effect] = []
        if unapplied and not restores:
            effects += self._carry(m.lose(restores=False, unapplied=True), now)
        if restores:
            reductions = any(job.cfg.kinds[t] == "reduction" for t, _ in owned)
            keep = self._may_keep(reductions)
            if keep:
                self.kept_at = now
                job.losses.keep(m.clock - 1)
            effects += self._carry(m.lose(restores=True, reductions_lost=reductions, unapplied=unapplied,
                                          keep=keep), now)
        if self.ending is not None:
            self.ending.lost_during = True
            if self.ending.worker == worker:  # (its outcome's message fails: skipped then)
                m.ending_skip = m.ending_skip or "the clock end's worker was lost"
            elif m.ending_applying and (restores or worker in self.ending.stagers):  # (its apply may be partial)
                m.ending_skip = m.ending_skip or "a worker was lost while its updates were applied"
        if m.stage is Stage.CLOCK_END and self.clock_end_worker == worker:
            effects += self._carry(m.clock_end_failed(), now)  # while recovering: skipped after it
        elif self.folded == worker:  # lost before the apply ended: if the clock still ends, the item path runs it
            self.folded = None
        if unheld and m.handing_out and job.queue.complete:  # (the loss took none of its commits: complete again)
            effects += self._pass_complete(now)
        return effects

    def _may_keep(self, reductions_lost: bool) -> bool:
        """Whether a loss now may keep the pass (``ClockMachine.lose(keep=True)``): the clock's first
        data pass runs and nothing of the clock was applied, so the memory copies of the clock before
        hold what the pass reads; a reduction partition (not copied) and full recovery (every table
        rolls back) cannot. Whether it does keep it is decided once recovered (``Losses.exact``)."""
        job, m = self.job, self.machine
        ck = job.cfg.checkpoint
        return (m.stage is Stage.SHARDS and m.data_phase == 0 and not self.applied_in_clock and not reductions_lost
                and not m.ending_applying  # (the tables the pass reads are still being applied)
                and ck is not None and ck.memory and ck.recovery != "full"
                and (m.keeping or not m.recovering))

    def recovered(self, now: float) -> list[Effect]:
        """Every loss is recovered: the machine goes on (a rebuild, a pass again, a skip, or the
        kept pass: completed now if every shard committed meanwhile)."""
        job, m = self.job, self.machine
        if not m.recovering:
            return []
        keeping = m.keeping
        exact = job.losses.exact() and keeping  # (ends the keeping either way)
        effects = self._carry(m.recovered(exact=exact), now)
        if keeping and exact:
            job.event(now, "pass-kept", committed=len(job.queue.committed_attempts()), todo=job.queue.n_todo)
            if job.queue.complete:
                effects += self._pass_complete(now)
        return effects

    def rebase(self, manifest: dict) -> None:
        """The job resumes from an older manifest: the next clock is the one after it."""
        self.machine.clock = int(manifest["clock"])

    # ------------------------------------------------------------- reports
    def progress(self) -> tuple[Any, bool]:
        m = self.machine
        key = (m.run_id, m.clock, m.stage, m.data_phase, m.recovering, *self.job.queue_progress())
        working = m.recovering or m.stage not in (Stage.IDLE, Stage.DONE, Stage.SKIPPED)
        return key, working and not self.job.failed

    def snapshot_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The dashboard's fields for the clock (after ``clock``), and any at the end (none)."""
        m = self.machine
        return {"stage": m.stage.value, "data_phase": self.job.cfg.phase_names[m.data_phase] or None,
                "recovering": m.recovering, "run_id": m.run_id}, {}

    def counts_pass(self) -> bool:
        """The active pass's commits count as shards done (the dashboard's, while it runs)."""
        return self.machine.stage in (Stage.SHARDS, Stage.APPLY)

    def stall_fields(self) -> dict[str, Any]:
        return {}


class SspSchedule:
    """Stale-synchronous clocks: the clock window says which shards may start and in which clock,
    when committed updates are applied (in batches, eagerly) and when a clock ends; the shard
    queue still keeps attempts, first-commit-wins, backups and where each shard's data lives."""

    def __init__(self, job: JobState, *, staleness: int, max_clocks: int, resume: dict | None = None):
        cfg = job.cfg
        #: the job this schedule decides for
        self.job = job
        #: the open clocks and each shard's place in them
        self.window = ClockWindow(cfg.n_shards, staleness, has_rebuild=bool(cfg.rebuild),
                                  floor=0 if resume is None else int(resume["clock"]), limit=max_clocks,
                                  records=job.queue._shards)  # (one record a shard: ``ClockWindow.records``)
        job.queue.reopen(range(cfg.n_shards))  # every shard waits for its first clock
        if resume is not None:  # the tables come back from the checkpoint: rebuild them first
            self.window.resume_from(manifest_cut(resume, cfg.n_shards))
            self.window.needs_rebuild = self.window.applied_before = bool(cfg.rebuild)
        self._sync_queue(range(cfg.n_shards))
        #: the driver began the fit (before, nothing is handed out: shards may still be placed)
        self.begun = False
        #: the worker running the clock-end step, once handed out
        self.clock_end_worker: str | None = None

    # ------------------------------------------------------------- queries
    @property
    def clock(self) -> int:
        """The oldest open clock."""
        return self.window.floor + 1

    @property
    def recovering(self) -> bool:
        return self.window.recovering

    @property
    def run_id(self) -> int:
        return self.window.epoch

    @property
    def handing_out(self) -> bool:
        return self.begun and not self.window.recovering

    @property
    def n_startable(self) -> int:
        # (not the queue's TODO count: under SSP a committed shard is TODO again for its next clock at
        # once, though the window may not let that clock start: backups would never be due)
        return self.window.n_startable()

    @property
    def stage_name(self) -> str:
        return "ssp"

    def report_for(self, clock: int, drop_older: bool = True) -> dict | None:
        if self.job.failed or self.window.holding:
            return None
        return self.job.tally.report_for(clock, drop_older)

    def cut(self) -> list[int]:
        """At a clock end, while no batch applies: the tables hold exactly the updates the cut lists
        (per shard, its newest clock applied) and each shard's saved state is as of that clock."""
        return self.window.cut()

    @property
    def quiet(self) -> bool:
        """Nothing is being applied or ended: the tables hold still (the driver gathers them)."""
        return self.window.in_flight is None and self.window.clock_end is None and not self.job.snapshotting

    def stop(self, clock: int) -> None:
        """The driver stops after ``clock``: no later clock starts or applies."""
        self.window.stop(clock)
        self._sync_queue()

    # --------------------------------------------------------- retirements
    def leave_step(self, worker: str) -> str:
        """The next step of ``worker``'s retirement (``elastic.ssp_leave_step``). It "drains" while
        an attempt runs on it or copies a shard from it (that copy needs it until the attempt
        commits), and "flush"es while an update of it waits to be applied."""
        running = {w for a in self.job.queue.running() for w in (a.worker, a.fetch_from) if w is not None}
        return ssp_leave_step(worker, running, self.window.unapplied_writers(), self.quiet)

    def flush_now(self, now: float) -> list[Effect]:
        """Apply the commits waiting now, however few (a leaver's staged updates must not wait for
        a full batch)."""
        return self._carry(self.window.flush(), now) if self.handing_out else []

    def pause(self) -> None:
        """No batch or clock end starts until ``resume``: a hand-off copies tables that hold still."""
        self.window.pause()

    def resume(self, now: float) -> list[Effect]:
        return self._carry(self.window.resume(), now)

    # ---------------------------------------------------------- carrying out
    def _sync_queue(self, shards: Iterable[int] | None = None) -> None:
        """Every shard the window moved back to TODO (applied, voided, written off) is TODO in the
        queue too, with no attempt left (a late commit of an older attempt is refused there), in the
        tier of its clock. ``shards``: those to look at (default: those the window moved)."""
        w, queue = self.window, self.job.queue
        phase, clock_of, set_tier, status = w.phase, w.shard_clock, queue.set_tier, queue.status  # (each applied shard asks)
        back = []
        for s in w.moved_back() if shards is None else shards:
            if phase(s) is _TODO_PHASE:
                set_tier(s, clock_of(s))
                if status(s) is not _TODO_STATUS:
                    back.append(s)
        if back:
            for s in back:  # attempts the window voided (a recovery): no batch member to ask back any more
                if queue.status(s) is _DOING_STATUS:
                    for a in queue.running_attempts(s):
                        self.job.dispatch.voided(a)
            queue.reopen(back)

    def given_back(self, shards: Iterable[int] | None = None) -> None:
        """``shards`` (None: any) may be TODO in the queue again (every attempt failed, was lost or
        given back): the window may start them again."""
        w, queue = self.window, self.job.queue
        for s in range(self.job.cfg.n_shards) if shards is None else shards:
            if w.phase(s) is _RUNNING_PHASE and queue.status(s) is _TODO_STATUS:
                w.give_back(s)

    def _carry(self, actions: list, now: float) -> list[Effect]:
        """Turn the window's actions into queue changes, events and effects."""
        job, w = self.job, self.window
        effects: list[Effect] = []
        for a in actions:
            if isinstance(a, ApplyBatch):
                committed_attempt = job.queue.committed_attempt  # (a batch holds about 2 W updates)
                committed = [(s, committed_attempt(s).attempt, wk) for s, _, wk in a.updates]
                clocks = [w.shard_clock(s) for s, _, _ in a.updates] if a.rebuild else [c for _, c, _ in a.updates]
                effects.append(ApplyPass(a.epoch, max(clocks), committed, list(job.cfg.rebuild) if a.rebuild else [],
                                         a.rebuild, batch=a.batch, clocks=clocks, floor=w.floor))
            elif isinstance(a, WindowClockEnd):
                self.clock_end_worker = None
            elif isinstance(a, SkipClock):
                job.log.add(now, "clock-end-skipped", clock=a.clock, reason=a.reason)
                job.tally.reports[a.clock] = self._report(a.clock, {"objective": float("nan"), "skipped": 1.0}, True)
            elif isinstance(a, WindowRecovery):
                effects.append(StartRecovery())
            elif isinstance(a, StartRebuild):
                job.queue.reopen(range(job.cfg.n_shards))
                job.event(now, "rebuild-started", tables=list(job.cfg.rebuild))
        if w.clock_end is None:
            self.clock_end_worker = None
        self._sync_queue()
        return effects

    def _report(self, clock: int, metrics: dict, skipped: bool, seconds: float | None = None) -> dict[str, Any]:
        job = self.job
        shards_done, timings = job.tally.close(clock)
        return {
            "status": "done", "metrics": dict(metrics), "skipped": skipped, "checkpoint": job.checkpoint_status(),
            "shards_per_worker": shards_done, "timings": timings,
            "stage_s": {} if seconds is None else {"clock_end_compute": float(seconds)},
            "ahead": sum(1 for _, c in self.window.applied if c > clock),
            "workers": job.workers_report(),
        }

    # ---------------------------------------------------------------- clocks
    def begin(self, clock: int, now: float) -> list[Effect]:
        """The driver's first ``begin`` opens the window (up to ``max_clocks``); later ones only
        wait for their clock's report, which the window produces on its own."""
        if self.begun:
            return []
        self.begun = True
        self.window.min_batch = max(1, 2 * len(self.job.workers))  # about two commits per worker per batch
        self.job.checkpoints.start_interval(now)
        return self._carry(self.window.allow(self.window.limit), now)

    def held_back(self, worker: str) -> bool:
        """Under SSP a straggler takes the newest clocks' shards, or none: its older ones move."""
        return worker in self.job.stragglers

    def next_item(self, worker: str, now: float) -> dict | None:
        """The clock-end step when one is due and nobody runs it, else a batch of shard attempts
        the window allows (or a backup), else None."""
        job, w = self.job, self.window
        dispatch, queue = job.dispatch, job.queue
        record = dispatch.records[worker]  # (what is the worker's: one dict read a hand-out)
        record.seen = now
        if job.log.error is not None or worker in job.losses.lost or not self.begun or w.recovering:
            return None  # (``handing_out``, inline)
        if w.clock_end is not None and self.clock_end_worker is None:
            self.clock_end_worker = worker
            return {"op": "clock_end", "job": job.cfg.job_id, "clock": w.clock_end, "run": w.epoch,
                    "owners": job.pmap.to_msg(), "version": w.version}
        # the oldest open clock's shards hold the window back: they go first (moving to another worker
        # if theirs is busy); a shard's tier in the queue is its clock
        clocks = w.startable_clocks()
        if clocks and worker in dispatch.stragglers and w.rebuilding is None:
            clocks = [c for c in clocks[::-1] if not dispatch.leave_to_others(
                worker, self._slack(c))]  # its shard holds its clock's end back least in the newest clock
        batch: list[Attempt] = []
        if clocks:  # (at a clock's tail most looks find none: nothing built)
            # more of the worker's own shards than its first, while steps are short: how many is asked
            # first (it reads nothing a hand-out changes), so the first clock's are taken in one call
            size = dispatch.batch_size(worker)
            worth = dispatch.worth_moving
            for i, c in enumerate(clocks):
                batch = queue.next_batch(worker, now, size, tier=c, worth_moving=worth)
                if batch:
                    a = batch[0]
                    if a.fetch_from:
                        job.event(now, "shard-moved", shard=a.shard, source=a.fetch_from, target=worker)
                    elif len(batch) < size:  # (its own, or an unheld one: the later clocks' own shards join)
                        for c in clocks[i + 1:]:
                            batch += queue.take_own(worker, now, size - len(batch), c)
                            if len(batch) >= size:
                                break
                    break
        if not batch:
            if w.rebuilding is not None:
                return None
            a = dispatch.idle_policies(worker, now)
            if a is None:
                return None
            batch = [a]
        # its earlier items are done
        dispatch.set_batched(worker, list(map(_PAIR, batch[1:])) if len(batch) > 1 else [])
        shards = list(map(_SHARD, batch))
        # (a backup is an item of its own; every other member starts here)
        members, newest, read_floor = w.member_fields(shards, worker, start=not a.backup)
        if w.rebuilding is None:
            record.running = (now, len(batch))
            if len(members) <= 2 and members[0][0] == members[-1][0]:
                if newest not in job.tally.per_clock:  # (one clock, the item's newest, opened once: mostly it is)
                    job.tally.open(newest, now)
            else:
                for c in {m[0] for m in members}:
                    job.tally.open(c, now)
        fields = _new_fields(SspFields, (members, newest, w.version, w.floor, read_floor))
        return dispatch.item(batch, w.rebuilding is not None, fields, run=w.epoch)

    def _slack(self, clock: int) -> int:
        """How many shard updates the window lets the other workers run while an attempt of
        ``clock`` is running: every update of clocks up to ``clock + s`` (clock ``clock`` cannot end
        before the attempt does, so no later clock can start)."""
        w = self.window
        return w.updates_up_to(min(clock + w.staleness, w.limit)) - 1

    def idle(self, worker: str, now: float) -> list[Effect]:
        """``worker`` found nothing to do: apply the commits waiting (their shards' next clocks may
        be what it could run)."""
        if not self.begun or self.window.recovering or worker in self.job.losses.lost:  # (``handing_out``, inline)
            return []
        actions = self.window.flush()
        # (mostly too few commits wait for a batch: no action, no shard moved back, nothing to carry out)
        return self._carry(actions, now) if actions or self.window.moved else []

    def releasable(self, asker: str) -> tuple[str, list[tuple[int, int]]] | None:
        w = self.window
        if not self.begun or w.recovering or w.any_startable():  # (``handing_out``, inline: every idle poll asks)
            return None
        return self.job.dispatch.ask_back(asker)

    def commit(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, now: float,
               timings: dict | None = None, rebuild: bool = False) -> tuple[bool, list[Effect]]:
        """An attempt of ``shard`` in ``clock`` asks to commit: granted to the first live attempt of
        the shard's current clock and epoch; the window applies it in its next batch."""
        granted, effects = self.commit_many(worker, run_id, [(clock, shard, attempt, timings)], now, rebuild)
        return granted[0], effects

    def commit_many(self, worker: str, run_id: int, finished: list[tuple[int, int, int, dict | None]], now: float,
                    rebuild: bool = False) -> tuple[list[bool], list[Effect]]:
        """``commit`` for each ``(clock, shard, attempt, timings)`` of one message of ``worker``, in order;
        what is the worker's (its running item, when it was last seen) is settled once a message."""
        job, window = self.job, self.window
        if job.log.error is not None or worker in job.losses.lost:
            return [False] * len(finished), []
        dispatch, queue, monitor, tally = job.dispatch, job.queue, job.monitor, job.tally
        record = dispatch.records[worker]  # (what is the worker's: one dict read a commit)
        record.running = None  # (``Dispatch.item_done``, inline)
        dispatch.changes += 1
        record.seen = now
        # (the methods called as such, not bound to names first: CPython 3.11 caches a method call's lookup,
        # not a bound method's, and a message holds one or two commits)
        restore = job.losses.restore_state  # (the job's one dict: emptied and filled in place)
        granted: list[bool] = []
        effects: list[Effect] = []
        for clock, shard, attempt, timings in finished:
            if timings:
                if "data_s" in timings:  # (``note_move`` measures only a data move)
                    dispatch.note_move(queue.running_attempt(shard, attempt), timings)
                if not rebuild:
                    monitor.record(worker, step_seconds(timings), record)
            if not window.accepts(shard, clock, run_id):  # a lost backup, an attempt of a voided epoch
                _refused(job, now, worker, shard, attempt, timings, late=True)
                granted.append(False)
                continue
            if record.members:  # (a worker with no batch member waiting has none to start: most commits)
                dispatch.attempt_started(worker, shard, attempt)
            if not queue.commit(shard, attempt, worker):
                _refused(job, now, worker, shard, attempt, timings, late=False)
                granted.append(False)
                continue
            if restore:  # the attempt started from the restored state; it lives on now
                restore.pop(shard, None)
            if not rebuild:
                tally.committed_in(clock, worker, timings)
            # (``accepts`` took it above: nothing changed the window since)
            actions = window.commit_accepted(shard, clock, worker)
            granted.append(True)
            # (most commits wait for a batch: no action, no shard moved back, nothing to carry out)
            if actions or window.moved:
                effects += self._carry(actions, now)
        return granted, effects

    def attempt_failed(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, error: str,
                       now: float, lost_data: bool = False, seconds: float = 0.0, stopped: bool = False) -> None:
        job, w = self.job, self.window
        current = w.phase(shard) is ShardPhase.RUNNING and (w.rebuilding is not None or w.shard_clock(shard) == clock)
        late = not current or run_id != w.epoch or (stopped and not job.dispatch.live(shard, attempt, worker))
        job.event(now, "attempt-stopped" if stopped else "shard-failed", shard=shard, attempt=attempt,
                  worker=worker, error=error, late=late, seconds=round(seconds, 4))
        job.dispatch.item_done(worker)
        if not current:
            return
        job.dispatch.attempt_started(worker, shard, attempt)
        try:
            job.queue.fail(shard, attempt, worker, error, count=run_id == w.epoch and not stopped, lost_data=lost_data)
        except ShardFailedError as e:
            job.fail(now, str(e))
        self.given_back([shard])

    def applying(self, run_id: int, now: float) -> list[Effect]:
        """(A batch's apply begins no clock: SSP clocks begin as the window allows.)"""
        return []

    def apply_cut(self, run_id: int, now: float, why: str) -> None:
        """(A batch cut short is the window's: ``lose``.)"""

    def applied(self, run_id: int, now: float, batch: int | None = None, ahead: bool = False) -> list[Effect]:
        in_flight = self.window.in_flight
        if batch is None or in_flight is None or in_flight.batch != batch:
            return []
        actions = self.window.batch_applied(batch)
        if in_flight.rebuild:  # (the rebuild pass is one batch)
            self.job.rebuild_done(now)
        return self._carry(actions, now)

    def clock_end_done(self, worker: str, run_id: int, metrics: dict, seconds: float, now: float,
                       clock: int | None = None, stop: bool | None = None) -> list[Effect]:
        """(``stop`` is BSP's: SSP clocks are begun by the driver.)"""
        job = self.job
        if clock is None or worker != self.clock_end_worker or not self.window.clock_end_done(clock, run_id):
            return []
        self.clock_end_worker = None
        started = job.tally.started(clock, now)
        job.tally.reports[clock] = self._report(clock, metrics, False, seconds)
        effects = job.clock_finished(clock, metrics, now, started)
        if not job.snapshotting:
            effects += self._carry(self.window.go_on(), now)
        return effects

    def snapshotted(self, now: float) -> list[Effect]:
        """A snapshot is taken: once none is left, the window goes on (later clocks start and apply)."""
        if self.job.snapshotting or not self.window.holding:
            return []
        return self._carry(self.window.go_on(), now)

    def clock_end_failed(self, worker: str, run_id: int, error: str, now: float,
                         clock: int | None = None) -> list[Effect]:
        w = self.window
        if worker != self.clock_end_worker or w.clock_end != clock:
            return []
        if run_id != w.epoch or w.recovering or clock in w.skip_reasons:
            return self._carry(w.clock_end_failed(clock), now)
        self.job.fail(now, f"clock_end of clock {clock} failed on {worker}:\n{error}")
        return []

    def unfold_clock_end(self, worker: str, now: float = 0.0) -> list[Effect]:
        """Nothing to give back: SSP keeps the clock-end item (its applies are batches that do not end
        a clock, so no apply message could carry a clock end)."""
        return []

    # --------------------------------------------------------------- losses
    def lose(self, worker: str, now: float) -> list[Effect]:
        job, w = self.job, self.window
        in_flight = w.in_flight
        owned, restores = job.forget_worker(worker, job.queue.held_by(worker), set(), now)
        if job.failed or restores is None:
            return []
        self.given_back()  # its attempts were requeued by the queue
        actions = w.lose(worker, restores=restores,
                         reductions_lost=any(job.cfg.kinds[t] == "reduction" for t, _ in owned),
                         owned_in_flight=bool(owned) and in_flight is not None)
        if self.clock_end_worker == worker and w.clock_end is not None:
            actions += w.clock_end_failed(w.clock_end)
        return self._carry(actions, now)

    def recovered(self, now: float) -> list[Effect]:
        if not self.window.recovering:
            return []
        return self._carry(self.window.recovered(), now)

    def rebase(self, manifest: dict) -> None:
        """The job resumes from an older manifest than it was started with (a newer one did not
        verify; the driver says so before its first clock): the window opens the clock after that
        manifest's, or the driver would wait for ever for a clock the window never runs."""
        if self.begun:
            raise RuntimeError("rebase after the first clock began")
        w = self.window
        self.window = ClockWindow(self.job.cfg.n_shards, w.staleness, has_rebuild=w.has_rebuild,
                                  floor=int(manifest["clock"]), limit=w.limit, records=w._shards)
        self.window.resume_from(manifest_cut(manifest, self.job.cfg.n_shards))
        self.window.needs_rebuild = self.window.applied_before = w.needs_rebuild
        self._sync_queue(range(self.job.cfg.n_shards))

    # ------------------------------------------------------------- reports
    def progress(self) -> tuple[Any, bool]:
        w = self.window
        key = (w.epoch, w.floor, w.version, len(w.applied), w.clock_end, w.in_flight is not None, w.holding,
               w.recovering, w.rebuilding is not None, *self.job.queue_progress())
        return key, self.begun and not w.done and not self.job.failed

    def snapshot_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        w = self.window
        return ({"stage": "ssp", "data_phase": self.job.cfg.phase_names[0] or None, "recovering": w.recovering,
                 "run_id": w.epoch}, {"open_clocks": w.open_clocks(), "staleness": w.staleness})

    def counts_pass(self) -> bool:
        """Shards done are counted per clock, in its report (the dashboard shows the applied ones)."""
        return False

    def stall_fields(self) -> dict[str, Any]:
        w = self.window
        phases = Counter(w.phase(s).value for s in range(self.job.cfg.n_shards))
        return {"open_clocks": w.open_clocks(), "shard_phases": dict(phases),
                "batch_in_flight": None if w.in_flight is None else [list(u) for u in w.in_flight.updates],
                "clock_end": w.clock_end, "clock_end_worker": self.clock_end_worker, "holding": w.holding}
