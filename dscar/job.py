"""One fit's control state on the scheduler, and every decision about it (no Dask here).

``JobState`` joins the pure pieces — the clock state machine (``dscar.clock``),
the shard queue (``dscar.shards``), the ownership map (``dscar.partitions``),
the checkpoint ledger (``dscar.ledger``), the monitor and the policies — and
answers the coordinator's questions: which work item a worker gets next, whether
a commit is granted, what a loss means, what to do when a pass is complete.
It returns *effects* for the coordinator to carry out (``Apply``, ``Recover``,
``Checkpoint``, ``Restart``); the coordinator only sends messages.

Shard state (LDA's topic assignments) follows the same rule as table updates:
a committed attempt's new state is staged on the worker that ran it and
installed when its pass is applied. So a backup attempt, or a pass run again
after a loss, always starts from the state as of the pass's start.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

from .checkpoint_plan import Checkpoint, CheckpointPlanner, Mirror
from .clock import Apply, ClockMachine, Recover, RunClockEnd, Skip, Stage, StartPass
from .errors import ShardFailedError
from .events import EventLog
from .ledger import RecoveryPlan
from .losses import Losses
from .monitor import ThroughputMonitor, step_seconds
from .partitions import PartitionMap
from .policies import Backup, ControllerView, Policy, Restart, Running, SetBatchScale
from .shards import Attempt, ShardQueue
from .tally import ClockTally


@dataclass(frozen=True)
class ApplyPass:
    """Every live worker applies the committed attempts of the pass (tables and shard state)."""

    run_id: int
    clock: int
    committed: list[tuple[int, int, str]]  # (shard, attempt, worker that ran it and holds its update)
    reset: list[str]  # tables that start from zero
    rebuild: bool = False  # the rebuild pass (its contributions rebuild tables, they are no clock's updates)
    #: SSP: the batch id, each update's clock (``committed``'s order) and the newest finished clock
    #: (staged updates, pending states and reduction sums of clocks up to it can go)
    batch: int | None = None
    clocks: list[int] | None = None
    floor: int | None = None
    #: the data phase whose pass this is (None: the algorithm has none; a fault may name it)
    phase: str | None = None


@dataclass(frozen=True)
class StartRecovery:
    """Restore what lost workers took with them; the coordinator loops until ``unrecovered`` is empty."""


@dataclass(frozen=True)
class RestartWorker:
    worker: str


Effect = ApplyPass | StartRecovery | Checkpoint | Mirror | RestartWorker

#: a work item holds about this much shard work by the worker's measured step time; below
#: ``BackupPolicy.min_s``, so a batch's waiting members never look late to the backup policy
BATCH_TARGET_S = 0.01
#: at most this many shard attempts in one work item
MAX_BATCH = 64
#: a straggler is left out of a pass's tail only where that saves at least this long (seconds): for
#: steps of microseconds the hand-out noise, and moving the shard's data to another worker, cost more
HOLD_BACK_MIN_S = 0.005


@dataclass
class JobConfig:
    """What a job was started with (fixed for its life)."""

    job_id: str
    n_shards: int
    kinds: dict[str, str]  # table -> "param" | "reduction"
    rebuild: list[str]  # tables the algorithm recomputes after a restore
    phase_names: list[str]  # data phases of a clock ("" when the algorithm has none)
    checkpoint: Any = None  # CheckpointConfig or None


def _part(part: str, name: str) -> property:
    """An attribute a part owns, read and set through the job (the coordinator's and the tests'
    call surface: ``job.ledger`` is ``job.checkpoints.ledger``)."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value),
                    doc=f"``{part}.{name}``")


class JobState:
    """The scheduler's truth of one fit. Every method is a pure decision.

    Composed of parts with one job each: ``log`` (events, failure), ``tally`` (what each clock
    did), ``checkpoints`` (ledger, interval, memory copies, snapshots), ``losses`` (lost workers and
    their recovery), beside the shard queue, the ownership map, the monitor and the clock machine.
    """

    def __init__(self, cfg: JobConfig, queue: ShardQueue, pmap: PartitionMap, *,
                 monitor: ThroughputMonitor | None = None, policies: list[Policy] | None = None,
                 resume: dict | None = None):
        #: the job's fixed settings
        self.cfg = cfg
        #: shard states, attempts, commits, holders
        self.queue = queue
        #: partition -> owner: the coordinator's truth, not the scheduler's task state
        self.pmap = pmap
        #: the clock state machine: stage, run id, what a loss left to do
        self.machine = ClockMachine(n_phases=len(cfg.phase_names), has_rebuild=bool(cfg.rebuild))
        #: per-worker speed from attempts (committed or still running)
        self.monitor = monitor or ThroughputMonitor()
        #: the job's events and why it failed
        self.log = EventLog(lambda: self.clock)
        #: what each clock did (shards, timings, stage times, metrics, reports)
        self.tally = ClockTally()
        #: checkpoints and memory copies: ledger, interval, costs, what is being snapshotted
        self.checkpoints = CheckpointPlanner(cfg, pmap, queue, self.log, resume)
        #: lost workers and the recovery of what they held
        self.losses = Losses(pmap, self.log, bool(cfg.rebuild))
        #: seconds a moved shard's data took to arrive and be prepared (the moved attempts' ``data_s``,
        #: smoothed); None until a shard has moved
        self.move_s: float | None = None
        #: straggler policies (backup at idle time; adaptive batch and restart at clock ends)
        self.policies = list(policies or ())
        #: worker -> batch scale (adaptive-batch policy)
        self.batch_scale: dict[str, float] = {}
        #: worker -> "transient" | "persistent"
        self.stragglers: dict[str, str] = {}
        #: workers a policy decided to restart at the next clock boundary
        self.pending_restarts: list[str] = []
        #: worker -> (shard, attempt) of the members of its last work item that may not have started
        #: (the first of a batch starts at once); a pass start, a commit or a failure drops them
        self.batched: dict[str, list[tuple[int, int]]] = {}
        #: worker -> id of the last work item handed to it: a release names it, so a worker asked
        #: before that item reached it gives the members back all the same (``ShardRunner.release``)
        self.item_of: dict[str, int] = {}
        #: work items handed out so far (item ids count up from 1)
        self.items_handed = 0
        #: worker -> (hand-out time, shards) of the shard-pass work item it is running, until it
        #: commits or fails (whatever clock it is of): the monitor's evidence of a worker that
        #: does not finish, since backups may win its shards and close the pass without it
        self.running_items: dict[str, tuple[float, int]] = {}
        #: when each worker last asked for work or committed (``_worth_moving``: a holder that stopped asking)
        self.last_seen: dict[str, float] = {}
        #: the worker running the clock-end step, once handed out
        self.clock_end_worker: str | None = None
        #: workers handed a shard attempt this clock (each gets one, however slow: see ``_leave_to_others``)
        self.started: set[str] = set()
        #: the live workers, refreshed by the coordinator before it asks for decisions (``workers``)
        self._workers: list[str] = []
        self._worker_set: frozenset[str] = frozenset()
        if resume is not None:
            self.machine.clock = int(resume["clock"])
            self.machine.stage = Stage.DONE
            self.machine.needs_rebuild = bool(cfg.rebuild)
            self.losses.plan_states(cfg.n_shards, resume)

    events = _part("log", "events")
    error = _part("log", "error")
    metrics = _part("tally", "metrics")
    objectives = _part("tally", "objectives")
    shards_done = _part("tally", "shards_done")
    timings = _part("tally", "timings")
    stage_s = _part("tally", "stage_s")
    ledger = _part("checkpoints", "ledger")
    schedule = _part("checkpoints", "interval")
    snapshotting = _part("checkpoints", "snapshotting")
    mirrors = _part("checkpoints", "mirrors")
    state_mirrors = _part("checkpoints", "state_mirrors")
    lost = _part("losses", "lost")
    restarting = _part("losses", "restarting")
    unrecovered = _part("losses", "unrecovered")
    lost_shards = _part("losses", "lost_shards")
    restore_state = _part("losses", "restore_state")
    restored_rows = _part("losses", "restored_rows")

    # ----------------------------------------------------------------- util
    @property
    def workers(self) -> list[str]:
        """The live workers, as the coordinator last said."""
        return self._workers

    @workers.setter
    def workers(self, workers: list[str]) -> None:
        self._workers = workers
        self._worker_set = frozenset(workers)  # (membership tests per decision: not a list scan)

    @property
    def clock(self) -> int:
        """The clock being run (under SSP the oldest open one)."""
        return self.machine.clock

    @property
    def recovering(self) -> bool:
        """Losses are being recovered: nothing completes meanwhile."""
        return self.machine.recovering

    @property
    def run_id(self) -> int:
        """What work and messages are tagged with; older ones are stale (under SSP, the epoch)."""
        return self.machine.run_id

    @property
    def handing_out(self) -> bool:
        return self.machine.handing_out

    def event(self, now: float, kind: str, **info: Any) -> None:
        self.log.add(now, kind, **info)

    def fail(self, now: float, error: str) -> None:
        self.log.fail(now, error)

    @property
    def failed(self) -> bool:
        return self.log.failed

    def live(self, workers: list[str]) -> list[str]:
        """``workers`` (the scheduler's) less those this job lost."""
        return self.losses.live(workers)

    def _book_stage(self, now: float) -> None:
        stage = self.machine.stage
        names = []
        if stage in (Stage.REBUILD, Stage.SHARDS, Stage.APPLY, Stage.CLOCK_END):
            names.append({Stage.CLOCK_END: "clock_end"}.get(stage, stage.value))
            if stage in (Stage.SHARDS, Stage.APPLY) and len(self.cfg.phase_names) > 1 and not self.machine.applying_rebuild:
                names.append(f"{names[0]}:{self.cfg.phase_names[self.machine.data_phase]}")
        self.tally.book_stage(names, now)

    def _carry_out(self, actions: list, now: float) -> list[Effect]:
        """Turn the clock machine's actions into queue changes and effects."""
        effects: list[Effect] = []
        for a in actions:
            if isinstance(a, StartPass):
                self.batched = {}
                if a.data_phase is None:
                    self.queue.begin_clock(self.machine.clock, None)
                    self.event(now, "rebuild-started", tables=list(self.cfg.rebuild))
                elif a.redo and self.queue.phase == a.data_phase:
                    self.queue.restart_clock()
                else:
                    self.queue.begin_clock(self.machine.clock, a.data_phase)
                if a.redo:
                    self.event(now, "clock-restarted", stage=self.machine.stage.value,
                               data_phase=self.cfg.phase_names[self.machine.data_phase] or None)
            elif isinstance(a, Apply):
                reset = list(self.cfg.rebuild) if a.reset_rebuild else (
                    [t for t, k in self.cfg.kinds.items() if k == "reduction"] if a.reset_reductions else [])
                effects.append(ApplyPass(a.run_id, self.machine.clock, self.queue.committed_attempts(), reset,
                                         a.reset_rebuild, phase=None if a.reset_rebuild else
                                         self.cfg.phase_names[self.machine.data_phase] or None))
            elif isinstance(a, RunClockEnd):
                self.clock_end_worker = None
            elif isinstance(a, Recover):
                effects.append(StartRecovery())
            elif isinstance(a, Skip):
                self.metrics = {"objective": math.nan, "skipped": 1.0}
                self.event(now, "clock-end-skipped", reason=a.reason)
        return effects

    # ---------------------------------------------------------------- clocks
    def begin(self, clock: int, now: float) -> list[Effect]:
        """Start ``clock`` (the previous one finished and no recovery is under way)."""
        effects: list[Effect] = [RestartWorker(w) for w in self.pending_restarts]
        self.restarting.update(self.pending_restarts)
        self.pending_restarts = []
        self.tally.begin(now)
        self.started = set()
        self.clock_end_worker = None
        self.checkpoints.start_interval(now)
        actions = self.machine.begin(clock)
        return effects + self._carry_out(actions, now)

    def next_item(self, worker: str, now: float) -> dict | None:
        """The next work item for ``worker``: a batch of shard attempts, the clock-end step, or None."""
        self.last_seen[worker] = now
        if self.failed or worker in self.lost or self.machine.recovering:
            return None
        if self.machine.handing_out:
            if self._held_back(worker):
                return None
            a = self.queue.next_shard(worker, now, worth_moving=partial(self._worth_moving, worker, now))
            if a is None and self.machine.stage is Stage.SHARDS:
                a = self._idle_policies(worker, now)
            elif a is not None and a.fetch_from:
                self.event(now, "shard-moved", shard=a.shard, source=a.fetch_from, target=worker)
            if a is None:
                return None
            batch = [a]
            self.started.add(worker)
            if a.fetch_from is None and not a.backup:  # more of the worker's own shards, while steps are short
                size = self._batch_size(worker)
                while len(batch) < size:
                    b = self.queue.next_shard(worker, now, local_only=True)
                    if b is None:
                        break
                    batch.append(b)
            self._set_batched(worker, [(b.shard, b.attempt) for b in batch[1:]])  # its earlier items are done
            if self.machine.stage is not Stage.REBUILD:
                self.running_items[worker] = (now, len(batch))
            return self._item(batch, self.machine.stage is Stage.REBUILD)
        if self.machine.stage is Stage.CLOCK_END and self.clock_end_worker is None:
            self.clock_end_worker = worker
            return {"op": "clock_end", "job": self.cfg.job_id, "clock": self.machine.clock, "run": self.machine.run_id,
                    "owners": self.pmap.to_msg()}
        return None

    def idle(self, worker: str, now: float) -> list[Effect]:
        """``worker`` found nothing to do (under BSP nothing follows from it)."""
        return []

    def _leave_to_others(self, worker: str, n_left: int | None = None) -> bool:
        """Whether the other workers would finish every shard still to do before ``worker`` finished
        one (by the monitor's step times): then it starts no more this clock, and the pass does not
        wait at its tail for a straggler's step (``s`` times slower: up to ``s`` fast steps).

        The others' time for the ``n`` shards left is about ``n / sum(speed)`` plus one step of the
        slowest of them (a shard is not divisible), plus ``HOLD_BACK_MIN_S``, so a healthy cluster's
        noise never crosses it. The caller gives every worker one attempt a clock first, so a
        straggler that recovers is measured again. Dynamic sharding only: a static shard waits for
        its holder anyway. ``n_left``: the shards the others may run before the pass waits for
        ``worker``'s (default: every shard still to do)."""
        if self.queue.sharding != "dynamic":
            return False
        monitor = self.monitor
        mine = monitor.mean_step(worker)
        if mine is None or monitor.n_measured() < 2:
            return False
        n = self.queue.n_todo if n_left is None else n_left
        # the others' summed speed and slowest step, from the monitor's running figures: it forgets a
        # lost worker (``_forget_worker``), so every worker it measures is live, and this is O(1)
        others_speed = monitor.total_speed() - 1.0 / mine
        return mine > n / others_speed + monitor.slowest_step(worker) + HOLD_BACK_MIN_S

    def _worth_moving(self, worker: str, now: float, holder: str, backlog: int) -> bool:
        """Whether ``worker``, out of shards of its own, should take one of ``holder``'s ``backlog``
        TODO shards: only if it would finish it, data move included, before the holder would (its
        current step half done, then the backlog), by the monitor's step times and ``move_s``.
        Delay scheduling, as Spark's locality wait: a shard that runs in 80 ms and takes 200 ms to
        move (ALS, 600k ratings) waits for its holder; a straggler's shards still move.

        Yes while anything is unmeasured, for a holder that is gone or held back (a straggler the
        others are to relieve: ``_held_back``), and for one that is late: its work item has run over
        twice its expected time, or it has neither asked for work nor committed for a step's time (a
        hung worker that stopped asking would otherwise keep its shards forever)."""
        mine, theirs = self.monitor.mean_step(worker), self.monitor.mean_step(holder)
        if (self.move_s is None or mine is None or theirs is None or holder not in self._worker_set
                or self._held_back(holder)):
            return True
        running = self.running_items.get(holder)
        if running is not None and now - running[0] > 2 * running[1] * theirs:
            return True
        if running is None and now - self.last_seen.get(holder, -math.inf) > theirs:
            return True
        return self.move_s + mine < (backlog + 0.5) * theirs

    def _held_back(self, worker: str) -> bool:
        """Whether ``worker`` gets no more shards this pass (``next_item``'s straggler rule): its
        shards are the others' to run, moves and all."""
        return worker in self.started and self._leave_to_others(worker)

    def _note_move(self, attempt: Attempt | None, timings: dict | None) -> None:
        """A finished attempt that copied its shard from another worker measured a move: ``move_s``."""
        if attempt is not None and attempt.fetch_from and timings and "data_s" in timings:
            moved = float(timings["data_s"])
            self.move_s = moved if self.move_s is None else 0.5 * (self.move_s + moved)

    def _batch_size(self, worker: str) -> int:
        """How many of its own shards ``worker`` gets in one work item: enough to run about
        ``BATCH_TARGET_S`` by its measured step time (one before it has one). A short step then
        costs one commit per batch, not one per shard. A batch does not pin its shards: members
        not started yet are released to an idle worker (``releasable``), so dynamic sharding still
        moves work away from a worker that suddenly slows down."""
        step = self.monitor.mean_step(worker)
        if step is None:
            return 1
        return max(1, min(MAX_BATCH, int(BATCH_TARGET_S / step)))

    def _started(self, worker: str, shard: int, attempt: int) -> None:
        members = self.batched.get(worker)
        if members and (shard, attempt) in members:
            members.remove((shard, attempt))
            if not members:
                del self.batched[worker]

    def _set_batched(self, worker: str, members: list[tuple[int, int]]) -> None:
        """``batched`` keeps only workers with members (``_ask_back`` looks at each of them)."""
        if members:
            self.batched[worker] = members
        else:
            self.batched.pop(worker, None)

    def releasable(self, asker: str) -> tuple[str, list[tuple[int, int]]] | None:
        """``asker`` found nothing to do in a pass: the worker with the most batch members that
        may not have started, and the later half of them, to ask back (None: nothing to ask)."""
        if self.machine.stage not in (Stage.SHARDS, Stage.REBUILD) or self.queue.n_todo:
            return None
        return self._ask_back(asker)

    def _ask_back(self, asker: str) -> tuple[str, list[tuple[int, int]]] | None:
        live = {w: m for w, m in self.batched.items() if w != asker and w not in self.lost and m}
        if not live:
            return None
        victim = max(live, key=lambda w: (len(live[w]), w))
        members = live[victim]
        return victim, members[len(members) // 2:]

    def released(self, worker: str, asked: list[tuple[int, int]], released: list[tuple[int, int]],
                 now: float) -> None:
        """``worker`` gave back the ``released`` members of those ``asked`` (it never started them);
        the others have started, or the answer came too late to be heard (then the worker's commit
        names them again): they are not asked for again."""
        done = {(int(s), int(a)) for s, a in asked}
        back = [(int(s), int(a)) for s, a in released if self.queue.release(int(s), int(a), worker)]
        self._set_batched(worker, [m for m in self.batched.get(worker, []) if m not in done])
        if back:
            self.event(now, "batch-released", worker=worker, shards=sorted(s for s, _ in back))

    def _item(self, batch: list[Attempt], rebuild: bool) -> dict:
        shards = []
        for a in batch:
            member = {"shard": a.shard, "attempt": a.attempt, "fetch_from": a.fetch_from,
                      "backup": a.backup, "phase": self.cfg.phase_names[self.queue.phase_of(a.shard)] or None}
            entry = self.restore_state.get(a.shard)
            if entry is not None:
                member["state_file"] = entry
            shards.append(member)
        self.items_handed += 1
        self.item_of[batch[0].worker] = self.items_handed
        item = {"op": "rebuild" if rebuild else "shard", "job": self.cfg.job_id, "item": self.items_handed,
                "clock": self.machine.clock, "run": self.machine.run_id, "owners": self.pmap.to_msg(),
                "batch_scale": self.batch_scale.get(batch[0].worker, 1.0), "shards": shards}
        if rebuild and self.restored_rows:
            item["restored"] = {t: [list(r) for r in rs] for t, rs in self.restored_rows.items()}
        return item

    def commit(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, now: float,
               timings: dict | None = None, rebuild: bool = False) -> tuple[bool, list[Effect]]:
        """An attempt asks to commit: the first live attempt of the current run wins.

        Every finished shard-step attempt tells its worker's speed first, whether it wins, is
        refused, or is late: a straggler whose shards were all backed up finishes after its pass
        is complete, often after its clock has ended, and not counting it would hide exactly the
        worker the monitor is for. ``rebuild``: a rebuild-pass attempt (other work: not counted)."""
        if self.failed or worker in self.lost:
            return False, []
        self.running_items.pop(worker, None)
        self.last_seen[worker] = now
        current = clock == self.machine.clock and self.machine.accepts(run_id)
        # attempt numbers restart every pass: only the current run's can be looked up
        mine = next((a for a in self.queue.running_attempts(shard) if a.attempt == attempt), None) \
            if current else None
        started = None if mine is None else mine.started
        self._note_move(mine, timings)
        if not rebuild:
            step = step_seconds(timings) if timings else (None if started is None else now - started)
            if step is not None:
                self.monitor.record(worker, step)
        if not current or not self.machine.handing_out:  # a lost backup, an attempt of a voided pass
            self.event(now, "commit-refused", shard=shard, attempt=attempt, worker=worker, late=True,
                       seconds=round(step_seconds(timings or {}), 4))  # its step time, wasted
            return False, []
        self._started(worker, shard, attempt)
        granted = self.queue.commit(shard, attempt, worker)
        if not granted:
            self.event(now, "commit-refused", shard=shard, attempt=attempt, worker=worker, late=False,
                       seconds=round(step_seconds(timings or {}), 4))
            return False, []
        self.restore_state.pop(shard, None)  # the attempt started from the restored state; it lives on now
        self.tally.committed(worker, timings)
        if not self.queue.complete:
            return True, []
        self._book_stage(now)
        rebuild = self.machine.stage is Stage.REBUILD
        effects = self._carry_out(self.machine.pass_complete(run_id), now)
        if not rebuild:
            self.tally.pass_counted(self.queue.committed_by())
        return True, effects

    def attempt_failed(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, error: str,
                       now: float, lost_data: bool = False, seconds: float = 0.0) -> None:
        """An attempt raised after ``seconds`` of work. Every failure is an event; it counts against the
        shard unless a loss (a newer run id) explains it or another attempt of the shard is still running."""
        self.event(now, "shard-failed", shard=shard, attempt=attempt, worker=worker, error=error,
                   late=clock != self.machine.clock or run_id != self.machine.run_id, seconds=round(seconds, 4))
        self.running_items.pop(worker, None)
        if clock != self.machine.clock or not self.machine.handing_out:
            return
        self._started(worker, shard, attempt)
        try:
            self.queue.fail(shard, attempt, worker, error, count=run_id == self.machine.run_id, lost_data=lost_data)
        except ShardFailedError as e:
            self.fail(now, str(e))

    def applied(self, run_id: int, now: float, batch: int | None = None) -> list[Effect]:
        """Every live worker applied the pass of ``run_id`` (under SSP: the batch ``batch``)."""
        if self.machine.stage is not Stage.APPLY or not self.machine.accepts(run_id):
            return []
        self._book_stage(now)
        rebuild = self.machine.applying_rebuild
        actions = self.machine.applied(run_id)
        if rebuild:
            self.rebuild_done(now)
        return self._carry_out(actions, now)

    def rebuild_done(self, now: float) -> None:
        """Every shard's rebuild step was applied: the restored rows are rebuilt."""
        self.restored_rows = {}
        self.event(now, "rebuild-done")

    def clock_end_done(self, worker: str, run_id: int, metrics: dict, seconds: float, now: float,
                       clock: int | None = None) -> list[Effect]:
        """The clock-end step of ``clock`` (None: the current one) reported: the clock is DONE
        (unless a loss made its report stale)."""
        clock = self.machine.clock if clock is None else clock
        if worker != self.clock_end_worker or clock != self.machine.clock or self.machine.stage is not Stage.CLOCK_END \
                or not self.machine.accepts(run_id):
            return []
        self._book_stage(now)
        self.machine.clock_end_done(run_id)
        self.stage_s["clock_end_compute"] = float(seconds)
        return self._clock_finished(clock, metrics, now, self.tally.clock_t0)

    def _clock_finished(self, clock: int, metrics: dict, now: float, started: float) -> list[Effect]:
        """A clock's clock-end step reported: its objective, the clock-end policies, and the
        checkpoint or memory copy due now (taken before the tables change again: ``snapshotting``)."""
        self.tally.finished(clock, metrics)
        effects: list[Effect] = self._clock_policies(now)
        return effects + self.checkpoints.clock_finished(clock, now - started, self.workers, self.lost, now,
                                                         self._cut)

    def _cut(self) -> list[int] | None:
        """Per shard, the newest clock the tables hold (None: every shard's is the job's clock)."""
        return None

    def clock_end_failed(self, worker: str, run_id: int, error: str, now: float,
                         clock: int | None = None) -> list[Effect]:
        """The clock-end step raised: a loss under it skips the clock; otherwise the job fails."""
        if worker != self.clock_end_worker or clock not in (None, self.machine.clock) or self.machine.stage is not Stage.CLOCK_END:
            return []
        if run_id != self.machine.run_id or self.machine.recovering or self.machine.skip_reason:
            return self._carry_out(self.machine.clock_end_failed(), now)
        self.fail(now, f"clock_end of clock {self.machine.clock} failed on {worker}:\n{error}")
        return []

    @property
    def report_ready(self) -> bool:
        return self.machine.finished and not self.failed and not self.snapshotting

    def report_for(self, clock: int) -> dict | None:
        """Clock ``clock``'s report for the driver once it is finished (None: not yet)."""
        return self.report() if self.machine.clock == clock and self.report_ready else None

    def snapshotted(self, what: str, now: float) -> list[Effect]:
        """The ``what`` snapshot ("checkpoint", "mirror") is taken: the tables may change again."""
        self.snapshotting.discard(what)
        return []

    # ------------------------------------------------------------- policies
    def view(self, workers: list[str], now: float, idle_worker: str | None = None) -> ControllerView:
        running = [Running(a.shard, a.worker, now - a.started, self.queue.attempts_started(a.shard))
                   for a in self.queue.running()]
        return ControllerView(self.clock, workers, self.queue.n_todo, running, self.monitor,
                              dict(self.stragglers), idle_worker)

    def _idle_policies(self, worker: str, now: float) -> Attempt | None:
        for policy in self.policies:
            if policy.when != "idle":
                continue
            for action in policy.decide(self.view(self.workers, now, worker)):
                if isinstance(action, Backup):
                    a = self.queue.start_backup(action.shard, action.worker, now)
                    self.event(now, "backup-attempt", shard=a.shard, attempt=a.attempt, worker=worker,
                               policy=policy.name)
                    return a
        return None

    def _clock_policies(self, now: float) -> list[Effect]:
        running = {w: (now - t0, n) for w, (t0, n) in self.running_items.items()}
        stragglers = self.monitor.end_clock(running)
        for w, kind in stragglers.items():
            if self.stragglers.get(w) != kind:
                self.event(now, "straggler", worker=w, straggler=kind)
        for w in self.stragglers.keys() - stragglers.keys():
            self.event(now, "straggler-recovered", worker=w)
        self.stragglers = stragglers
        for policy in self.policies:
            if policy.when != "clock":
                continue
            for action in policy.decide(self.view(self.workers, now)):
                if isinstance(action, SetBatchScale):
                    self.batch_scale = dict(action.scales)
                    self.event(now, "batch-scale", scales=self.batch_scale, policy=policy.name)
                elif isinstance(action, Restart) and action.worker not in self.pending_restarts:
                    self.pending_restarts.append(action.worker)
                    self.event(now, "restart-planned", worker=action.worker, reason=action.reason,
                               policy=policy.name)
        return []

    # ----------------------------------------------------------- checkpoints
    def mirrored(self, buddy: str, clock: int, parts: list, now: float, shards: list = ()) -> None:
        """``buddy`` holds the memory copies of ``parts`` and of the states of ``shards`` as of ``clock``."""
        if buddy not in self.lost:
            self.checkpoints.mirrored(buddy, clock, parts, shards)

    def checkpoint_snapshotted(self, version: int, stall_s: float, unsaved_sq: dict[str, float], now: float) -> None:
        """Every writer of ``version`` has its snapshot (``CheckpointPlanner.checkpoint_snapshotted``)."""
        self.checkpoints.checkpoint_snapshotted(version, stall_s, unsaved_sq, now)

    def checkpoint_written(self, version: int, worker: str, files: list, error: str | None, now: float,
                           seconds: float = 0.0) -> None:
        """``worker`` wrote its part of ``version`` (or failed to: ``error``)."""
        self.checkpoints.checkpoint_written(version, worker, files, error, now, seconds)

    def published(self, version: int, now: float) -> None:
        """The driver published ``version``'s manifest."""
        self.checkpoints.published(version, now)

    # --------------------------------------------------------------- losses
    def lose(self, worker: str, now: float) -> list[Effect]:
        """``worker`` is gone: requeue its attempts; plan a recovery if it took partitions or state."""
        if worker in self.lost:
            return []
        held = self.queue.held_by(worker)  # (before ``uncommit`` unsets the holders of its voided commits)
        applying = self.machine.stage is Stage.APPLY
        unapplied = any(w == worker for _, _, w in self.queue.committed_attempts()) if applying else False
        # its commits of a pass not yet applied went with it: those shards run again
        voided = self.queue.uncommit(worker) if self.machine.stage in (Stage.SHARDS, Stage.REBUILD) else []
        owned, restores = self._forget_worker(worker, held, set(voided), now)
        if self.failed or restores is None:
            return []
        effects: list[Effect] = []
        if unapplied and not restores:
            effects += self._carry_out(self.machine.lose(restores=False, unapplied=True), now)
        if restores:
            reductions = any(self.cfg.kinds[t] == "reduction" for t, _ in owned)
            effects += self._carry_out(self.machine.lose(restores=True, reductions_lost=reductions,
                                                         unapplied=unapplied), now)
        if self.machine.stage is Stage.CLOCK_END and self.clock_end_worker == worker:
            effects += self._carry_out(self.machine.clock_end_failed(), now)  # while recovering: skipped after it
        return effects

    def _forget_worker(self, worker: str, held: list[int], voided: set[int], now: float) -> tuple[list, bool | None]:
        """What a loss means whatever the consistency: ``worker``'s attempts requeued, its memory
        copies forgotten, the event, the ledger; a recovery recorded when it took partitions or
        (with rebuild tables) the state of the shards it ``held``. Returns its partitions and
        whether a restore is needed (None: the job failed)."""
        self.lost.add(worker)
        self.checkpoints.worker_lost(worker, planned=worker in self.restarting, now=now)
        requeued = self.queue.worker_lost(worker) + self.queue.source_lost(worker)
        self.monitor.forget(worker)
        self.losses.forget_memory(worker)
        self.batched.pop(worker, None)
        self.running_items.pop(worker, None)
        self.batch_scale.pop(worker, None)
        self.stragglers.pop(worker, None)
        owned = self.pmap.owned_by(worker)
        self.event(now, "worker-lost", worker=worker, requeued=sorted({a.shard for a in requeued} | voided),
                   partitions=[list(p) for p in owned])
        self.checkpoints.writer_lost(worker, now)
        if self.failed:
            return owned, None
        if owned and self.cfg.checkpoint is None:
            self.fail(now, f"worker {worker} owned partitions {owned} and was lost; restoring partitions "
                           "needs a checkpoint store (dscar.fit(..., checkpoint=...))")
            return owned, None
        return owned, self.losses.needs_restore(worker, bool(owned), held)

    def plan_recovery(self, live: list[str]) -> RecoveryPlan:
        """What to restore now for every unrecovered loss, onto the ``live`` workers."""
        cfg = self.cfg.checkpoint
        return self.losses.plan(self.cfg.kinds, live, full=cfg is not None and cfg.recovery == "full",
                                manifests=self.ledger.newest_first() if self.ledger else [],
                                n_shards=self.queue.n_shards, mirrors=self.mirrors, state_mirrors=self.state_mirrors)

    def restored(self, key: tuple[str, int], target: str, version: int, now: float,
                 memory_clock: int | None = None) -> None:
        """``target`` owns ``key`` now (``Losses.restored``)."""
        self.losses.restored(key, target, version, now, memory_clock)

    def recovery_planned(self, plan: RecoveryPlan, now: float) -> set[str]:
        """The plan is about to be carried out: record which losses it covers; returns them."""
        return self.losses.planned(plan)

    @property
    def needs_recovery(self) -> bool:
        """A loss is not recovered yet, or a partition is owned by a lost worker."""
        return self.losses.needs_recovery

    def recovered(self, covered: set[str], now: float) -> list[Effect]:
        """The plan that covered ``covered`` was carried out; the recovery ends when nothing is left."""
        self.unrecovered -= covered
        if self.needs_recovery or not self.machine.recovering:
            return []
        return self._carry_out(self.machine.recovered(), now)

    def rebase(self, manifest: dict) -> None:
        """The job resumed from an older manifest than it was started with (a newer one did not verify)."""
        self.ledger.rebase(manifest)
        self.machine.clock = int(manifest["clock"])
        self.losses.plan_states(self.queue.n_shards, manifest)

    # ------------------------------------------------------------- reports
    def snapshot(self, live: set[str], now: float) -> dict[str, Any]:
        """The job's state as plain JSON-able data, for the dashboard page (``dscar.dashboard``).

        Read-only and cheap (no I/O): clock, stage, per worker (live, shards done this clock,
        speed, straggler flag), the active pass's queue counts (todo / doing / done, running
        backups), this clock's metrics, the retained checkpoints, the newest 200 events
        (``n_events`` counts them all) and the newest 200 clocks' objectives (``n_objectives``).
        Called after changes: keep it O(workers).
        """
        stats = {st.worker: st for st in self.monitor.stats()}
        live = set(live) - self.lost
        done = dict(self.shards_done)  # the applied data phases, plus the active one while it runs
        if self.machine.stage in (Stage.SHARDS, Stage.APPLY):
            for w, n in self.queue.committed_by().items():
                done[w] = done.get(w, 0) + n
        workers = {}
        for w in sorted(live | set(stats) | set(done) | self.lost):
            st = stats.get(w)
            workers[w] = {"live": w in live, "shards_done": int(done.get(w, 0)),
                          "speed": float(st.speed) if st else 0.0, "mean_step_s": float(st.mean_step_s) if st else 0.0,
                          "straggler": st.straggler if st else None, "batch_scale": float(self.batch_scale.get(w, 1.0))}
        queue = dict(self.queue.counts())
        queue["backups"] = sum(1 for a in self.queue.running() if a.backup)
        published = self.ledger.published if self.ledger is not None else []
        return {
            "job": self.cfg.job_id, "time": now, "clock": self.clock, "stage": self.machine.stage.value,
            "data_phase": self.cfg.phase_names[self.machine.data_phase] or None,
            "recovering": self.machine.recovering, "run_id": self.machine.run_id, "error": self.error,
            "metrics": {k: float(v) for k, v in self.metrics.items()}, "workers": workers, "queue": queue,
            "checkpoints": [{"version": int(m["version"]), "clock": int(m["clock"]), "bytes": int(m.get("bytes", 0))}
                            for m in published],
            "events": self.events[-200:], "n_events": len(self.events),
            "objectives": [[c, v] for c, v in self.objectives[-200:]], "n_objectives": len(self.objectives),
        }

    def progress(self) -> tuple[Any, bool]:
        """A key that changes whenever the job moves on (an attempt started, committed or failed, a
        pass applied, a clock ended, a recovery step), and whether the job is working rather than
        waiting for its driver's next clock: what ``dscar.stall.StallWatch`` watches."""
        m = self.machine
        key = (m.run_id, self.clock, m.stage, m.data_phase, m.recovering, *self._queue_progress())
        working = m.recovering or m.stage not in (Stage.IDLE, Stage.DONE, Stage.SKIPPED)
        return key, working and not self.failed

    def _queue_progress(self) -> tuple:
        """The shard queue's part of ``progress``: shards per status, attempts running."""
        return tuple(sorted(self.queue.counts().items())), len(self.queue.running())

    def stall_report(self) -> dict[str, Any]:
        """What a stalled job was doing (the ``job-stalled`` event): where its clock is and which
        attempts run where."""
        running = sorted((a.shard, a.attempt, a.worker) for a in self.queue.running())
        return {"clock": self.clock, "stage": self.machine.stage.value, "run_id": self.run_id,
                "recovering": self.recovering, "queue": dict(self.queue.counts()),
                "running": [list(r) for r in running[:20]], "n_running": len(running)}

    def checkpoint_status(self) -> dict[str, Any] | None:
        """The newest complete checkpoint's age in clocks, the rework a loss now would cost
        (``intervals.rework_estimate``) and the period in force; None without a store."""
        return self.checkpoints.status(self.clock)

    def report(self) -> dict:
        return {
            "status": "done", "metrics": dict(self.metrics), "skipped": self.machine.stage is Stage.SKIPPED,
            "checkpoint": self.checkpoint_status(),
            "shards_per_worker": dict(self.shards_done), "timings": self.timings, "stage_s": dict(self.stage_s),
            "workers": self._workers_report(),
        }

    def _workers_report(self) -> dict[str, dict[str, Any]]:
        """Per worker the monitor's view and its batch scale, for a clock's report."""
        return {st.worker: {"speed": st.speed, "mean_step_s": st.mean_step_s, "straggler": st.straggler,
                            "batch_scale": self.batch_scale.get(st.worker, 1.0)} for st in self.monitor.stats()}
