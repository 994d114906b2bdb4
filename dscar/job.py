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
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .checkpoint import state_shards
from .clock import Apply, ClockMachine, Recover, RunClockEnd, Skip, Stage, StartPass
from .errors import ShardFailedError
from .intervals import FixedSchedule, IntervalPlanner, rework_estimate
from .ledger import INITIAL_STATE, CheckpointLedger, RecoveryPlan, plan_recovery
from .monitor import ThroughputMonitor, step_seconds
from .partitions import PartitionMap
from .policies import Backup, ControllerView, Policy, Restart, Running, SetBatchScale
from .shards import Attempt, ShardQueue


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
class Checkpoint:
    version: int
    writers: dict[str, list[int]]  # worker -> shards whose state it saves (every param owner writes)
    whole: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # worker -> partitions it saves whole


@dataclass(frozen=True)
class Mirror:
    """The memory tier: each owner (key) copies its param partitions to its buddy (value) now."""

    clock: int
    buddies: dict[str, str]


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


class JobState:
    """The scheduler's truth of one fit. Every method is a pure decision."""

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
        #: seconds a moved shard's data took to arrive and be prepared (the moved attempts' ``data_s``,
        #: smoothed); None until a shard has moved
        self.move_s: float | None = None
        #: straggler policies (backup at idle time; adaptive batch and restart at clock ends)
        self.policies = list(policies or ())
        #: checkpoint versions (None without a store)
        self.ledger = None if cfg.checkpoint is None else CheckpointLedger(
            cfg.checkpoint.policy, cfg.checkpoint.keep, resume, cfg.checkpoint.max_chain)
        ck = cfg.checkpoint
        #: when checkpoints are due: every ``period`` clocks, or a period from measurements
        #: (``interval="auto"``); None without a store
        self.schedule = None if ck is None else (
            IntervalPlanner(ck.period, ck.mtbf) if ck.interval == "auto" else FixedSchedule(ck))
        #: workers a restart policy took down on purpose: their loss is not a failure (MTBF)
        self.restarting: set[str] = set()
        #: version -> {"stall": seconds its snapshot stalled the job (None: not yet), "write": its
        #: longest write so far, "written": every writer has written} until its cost is recorded
        self.ckpt_cost: dict[int, dict[str, Any]] = {}
        #: shards' worth of state saves carried to the next checkpoint (``checkpoint.state_shards``)
        self.state_credit = 0.0
        #: owner -> squared norm of its param partitions' change not saved before the newest
        #: checkpoint (the perturbation losing it then would have caused; ``rework_estimate``)
        self.unsaved_sq: dict[str, float] = {}
        #: the job's event log (dicts with time, clock, kind, ...)
        self.events: list[dict[str, Any]] = []
        #: workers lost to this job (a restarted worker comes back under a new address)
        self.lost: set[str] = set()
        #: lost workers whose partitions and shard states are not restored yet
        self.unrecovered: set[str] = set()
        #: shards whose state went with a lost worker, not restored yet
        self.lost_shards: set[int] = set()
        #: shard -> checkpoint file its state is restored from before its next step
        self.restore_state: dict[int, dict] = {}
        #: table -> row ranges restored from a checkpoint since the last rebuild pass was applied (the
        #: rebuild steps' ``ShardContext.restored``; a memory-tier copy is as of the last clock: not listed)
        self.restored_rows: dict[str, list[tuple[int, int]]] = {}
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
        #: this clock's metrics (when DONE)
        self.metrics: dict[str, float] = {}
        #: (clock, objective) of every completed clock, in order (skipped clocks have none)
        self.objectives: list[tuple[int, float]] = []
        #: worker -> shards committed this clock
        self.shards_done: dict[str, int] = {}
        #: workers handed a shard attempt this clock (each gets one, however slow: see ``_leave_to_others``)
        self.started: set[str] = set()
        #: worker -> summed attempt timings this clock
        self.timings: dict[str, dict[str, float]] = {}
        #: wall seconds per stage this clock ("shards", "apply", "clock_end", "rebuild", "shards:<phase>", ...)
        self.stage_s: dict[str, float] = {}
        self._stage_t0 = self._clock_t0 = 0.0
        #: the checkpoint period last chosen (``interval="auto"``; 0 before the first checkpoint)
        self._last_period = 0.0
        #: why the job failed (None while it runs)
        self.error: str | None = None
        #: the live workers, refreshed by the coordinator before it asks for decisions (``workers``)
        self._workers: list[str] = []
        self._worker_set: frozenset[str] = frozenset()
        #: what is being snapshotted ("checkpoint", "mirror"): the clock is not reported (nor the
        #: next begun) before, so a snapshot labelled clock t never holds clock t+1's updates
        self.snapshotting: set[str] = set()
        #: (table, part) -> (buddy, clock) of the newest memory copy the buddy has (memory tier)
        self.mirrors: dict[tuple[str, int], tuple[str, int]] = {}
        #: shard -> (buddy, clock) of the newest memory copy of its state (memory tier)
        self.state_mirrors: dict[int, tuple[str, int]] = {}
        if resume is not None:
            self.machine.clock = int(resume["clock"])
            self.machine.stage = Stage.DONE
            self.machine.needs_rebuild = bool(cfg.rebuild)
            self._plan_states(range(cfg.n_shards), [resume])

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
        self.events.append({"time": now, "clock": self.clock, "kind": kind, **info})

    def fail(self, now: float, error: str) -> None:
        if self.error is None:
            self.error = error
            self.event(now, "job-failed", error=error)

    @property
    def failed(self) -> bool:
        return self.error is not None

    def live(self, workers: list[str]) -> list[str]:
        """``workers`` (the scheduler's) less those this job lost."""
        return [w for w in sorted(workers) if w not in self.lost]

    def _book_stage(self, now: float) -> None:
        stage = self.machine.stage
        if stage in (Stage.REBUILD, Stage.SHARDS, Stage.APPLY, Stage.CLOCK_END) and self._stage_t0:
            name = {Stage.CLOCK_END: "clock_end"}.get(stage, stage.value)
            dt = now - self._stage_t0
            self.stage_s[name] = self.stage_s.get(name, 0.0) + dt
            if stage in (Stage.SHARDS, Stage.APPLY) and len(self.cfg.phase_names) > 1 and not self.machine.applying_rebuild:
                key = f"{name}:{self.cfg.phase_names[self.machine.data_phase]}"
                self.stage_s[key] = self.stage_s.get(key, 0.0) + dt
        self._stage_t0 = now

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
        self.metrics, self.shards_done, self.timings, self.stage_s = {}, {}, {}, {}
        self.started = set()
        self.clock_end_worker = None
        self._stage_t0 = self._clock_t0 = now
        self._start_schedule(now)
        actions = self.machine.begin(clock)
        return effects + self._carry_out(actions, now)

    def _start_schedule(self, now: float) -> None:
        """The automatic checkpoint interval counts its time from the first clock."""
        if isinstance(self.schedule, IntervalPlanner) and self.schedule.started is None:
            self.schedule.started = now

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

    def _live(self, shard: int, attempt: int, worker: str) -> bool:
        """Whether that attempt may still commit (not beaten, failed or given back): a lost-race stop
        of a live attempt was a wrong verdict (under BSP a pass being applied keeps its run id)."""
        return any(a.attempt == attempt and a.worker == worker for a in self.queue.running_attempts(shard))

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
        sums = self.timings.setdefault(worker, {})
        for k, v in (timings or {}).items():
            sums[k] = sums.get(k, 0.0) + float(v)
        if not self.queue.complete:
            return True, []
        self._book_stage(now)
        rebuild = self.machine.stage is Stage.REBUILD
        effects = self._carry_out(self.machine.pass_complete(run_id), now)
        if not rebuild:
            for w, n in self.queue.committed_by().items():
                self.shards_done[w] = self.shards_done.get(w, 0) + n
        return True, effects

    def attempt_failed(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, error: str,
                       now: float, lost_data: bool = False, seconds: float = 0.0, stopped: bool = False) -> None:
        """An attempt raised after ``seconds`` of work. Every failure is an event; it counts against the
        shard unless a loss (a newer run id) explains it or another attempt of the shard is still running.
        ``stopped``: it stopped as one that lost its shard's race (``runner.LostRace``), no failure: an
        ``attempt-stopped`` event, never counted; were it still live (``late=False``: a wrong verdict),
        the shard runs again."""
        late = clock != self.machine.clock or run_id != self.machine.run_id
        self.event(now, "attempt-stopped" if stopped else "shard-failed", shard=shard, attempt=attempt,
                   worker=worker, error=error, late=late or (stopped and not self._live(shard, attempt, worker)),
                   seconds=round(seconds, 4))
        self.running_items.pop(worker, None)
        if clock != self.machine.clock or not self.machine.handing_out:
            return
        self._started(worker, shard, attempt)
        try:
            self.queue.fail(shard, attempt, worker, error, count=run_id == self.machine.run_id and not stopped,
                            lost_data=lost_data)
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
        self.metrics = dict(metrics)
        self.stage_s["clock_end_compute"] = float(seconds)
        return self._clock_finished(clock, metrics, now, self._clock_t0)

    def _clock_finished(self, clock: int, metrics: dict, now: float, started: float) -> list[Effect]:
        """A clock's clock-end step reported: its objective, the clock-end policies, and the
        checkpoint or memory copy due now (taken before the tables change again: ``snapshotting``)."""
        if math.isfinite(float(metrics.get("objective", math.nan))):
            self.objectives.append((clock, float(metrics["objective"])))
        effects: list[Effect] = self._clock_policies(now)
        cfg = self.cfg.checkpoint
        if self.schedule is not None:
            self.schedule.record_clock(now - started)
            if self.schedule.due(clock):
                effects.append(self._start_checkpoint(clock, now))
        if cfg is not None and cfg.memory:
            effects += self._start_mirror(clock)
        return effects

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
    def _start_checkpoint(self, clock: int, now: float, **info: Any) -> Checkpoint:
        cfg = self.cfg.checkpoint
        saving, self.state_credit = state_shards(self.queue.n_shards, cfg.save_fraction, self.ledger.state_saved,
                                                 self.state_credit)
        writers: dict[str, list[int]] = {w: [] for (t, _), w in self.pmap.owners.items()
                                         if self.cfg.kinds[t] == "param" and w not in self.lost}
        for s in saving:
            h = self.queue.holder(s)
            if h is not None and h not in self.lost:
                writers.setdefault(h, []).append(s)
        whole: dict[str, list[tuple[str, int]]] = {}
        for t, p in self.ledger.whole_due(self._param_parts()):
            w = self.pmap.owners.get((t, p))
            if w in writers:
                whole.setdefault(w, []).append((t, p))
        version = self.ledger.start(clock, writers, [k for ks in whole.values() for k in ks], info.get("cut"))
        self.ckpt_cost[version] = {"stall": None, "write": 0.0, "written": False}
        self.schedule.taken(clock)
        self._replan(now)
        self.snapshotting.add("checkpoint")
        self.event(now, "checkpoint-started", version=version, policy=cfg.policy, fraction=cfg.save_fraction, **info)
        return Checkpoint(version, writers, whole)

    def _replan(self, now: float) -> None:
        """The automatic interval chooses its period again; a change is an event."""
        choice = self.schedule.replan(now)
        if choice is None:  # a fixed period
            return
        if choice["period"] != self._last_period:
            self.event(now, "checkpoint-interval", **{k: v for k, v in choice.items() if v is not None})
        self._last_period = choice["period"]

    def _start_mirror(self, clock: int) -> list[Effect]:
        """Every param owner and shard holder copies its partitions and shard states to the next
        live worker (a ring in address order)."""
        live = [w for w in sorted(self.workers) if w not in self.lost]
        owners = {w for (t, _), w in self.pmap.owners.items() if self.cfg.kinds[t] == "param"}
        senders = [w for w in live if w in owners or self.queue.held_by(w)]
        if len(live) < 2 or not senders:
            return []
        self.snapshotting.add("mirror")
        return [Mirror(clock, {w: live[(live.index(w) + 1) % len(live)] for w in senders})]

    def mirrored(self, buddy: str, clock: int, parts: list, now: float, shards: list = ()) -> None:
        """``buddy`` holds the memory copies of ``parts`` and of the states of ``shards`` as of ``clock``."""
        if buddy in self.lost:
            return
        for where, key in [(self.mirrors, (t, int(p))) for t, p in parts] + [(self.state_mirrors, int(s)) for s in shards]:
            if key not in where or where[key][1] <= clock:  # a late, older copy's report changes nothing
                where[key] = (buddy, int(clock))

    def checkpoint_snapshotted(self, version: int, stall_s: float, unsaved_sq: dict[str, float], now: float) -> None:
        """Every writer of ``version`` has its snapshot: it stalled the job ``stall_s`` seconds, and
        each owner had ``unsaved_sq`` of change not saved before it."""
        if unsaved_sq:
            self.unsaved_sq = {w: float(v) for w, v in unsaved_sq.items()}
        if version in self.ckpt_cost:
            self.ckpt_cost[version]["stall"] = float(stall_s)
            self._record_cost(version, now)

    def checkpoint_written(self, version: int, worker: str, files: list, error: str | None, now: float,
                           seconds: float = 0.0) -> None:
        if self.ledger is None:
            return
        pending = self.ledger.pending.get(version)
        if not self.ledger.written(version, worker, files, error):
            return
        cost = self.ckpt_cost.get(version)
        if cost is not None:
            cost["write"] = max(cost["write"], float(seconds))
            if pending.failed:
                del self.ckpt_cost[version]
            elif not pending.waiting:
                cost["written"] = True
                self._record_cost(version, now)
        self._build_manifests(now)

    def _record_cost(self, version: int, now: float) -> None:
        """A checkpoint's cost, once snapshotted and written: the stall plus the longest write,
        counted in full (an upper bound: the write runs beside training)."""
        cost = self.ckpt_cost[version]
        if cost["stall"] is not None and cost["written"]:
            del self.ckpt_cost[version]
            self.schedule.record_cost(cost["stall"] + cost["write"])
            self._replan(now)

    def _param_parts(self) -> dict[str, int]:
        """Param table -> its number of partitions (the tables checkpoints save)."""
        return {t: l.n_parts for t, l in self.pmap.layouts.items() if self.cfg.kinds[t] == "param"}

    def _build_manifests(self, now: float) -> None:
        _, abandoned = self.ledger.build(
            self._param_parts(), now, job=self.cfg.job_id, fraction=self.cfg.checkpoint.save_fraction,
            tables=[[t, l.n_rows, l.n_parts, self.cfg.kinds[t]] for t, l in self.pmap.layouts.items()])
        for v, reason in abandoned:
            self.ckpt_cost.pop(v, None)
            self.schedule.abandoned()
            self.event(now, "checkpoint-abandoned", version=v, reason=reason)

    def published(self, version: int, now: float) -> None:
        m = None if self.ledger is None else self.ledger.mark_published(version)
        if m is not None:
            self.event(now, "checkpoint-published", version=version, bytes=m["bytes"], clock=m["clock"])

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
        if self.schedule is not None and worker not in self.restarting:  # a planned restart is no failure
            self.schedule.record_loss()
            self._replan(now)
        # shard state lives with the data: with a rebuild pass, a lost holder's state must come back
        state_lost = bool(held) and bool(self.cfg.rebuild)
        requeued = self.queue.worker_lost(worker) + self.queue.source_lost(worker)
        self.monitor.forget(worker)
        self.mirrors = {k: v for k, v in self.mirrors.items() if v[0] != worker}  # its memory went with it
        self.state_mirrors = {s: v for s, v in self.state_mirrors.items() if v[0] != worker}
        for s, entry in self.restore_state.items():  # a planned copy from its memory: the saved file, or none
            if entry.get("memory") == worker:  # (a message to a hung buddy would wait out its deadline)
                self.restore_state[s] = entry.get("file") or INITIAL_STATE
        self.batched.pop(worker, None)
        self.running_items.pop(worker, None)
        self.batch_scale.pop(worker, None)
        self.stragglers.pop(worker, None)
        owned = self.pmap.owned_by(worker)
        self.event(now, "worker-lost", worker=worker, requeued=sorted({a.shard for a in requeued} | voided),
                   partitions=[list(p) for p in owned])
        if self.ledger is not None:
            self.ledger.writer_lost(worker)
            self._build_manifests(now)
        if self.failed:
            return owned, None
        if owned and self.cfg.checkpoint is None:
            self.fail(now, f"worker {worker} owned partitions {owned} and was lost; restoring partitions "
                           "needs a checkpoint store (dscar.fit(..., checkpoint=...))")
            return owned, None
        if owned or state_lost:
            self.unrecovered.add(worker)
            if state_lost:
                self.lost_shards |= set(held)
        return owned, bool(owned or state_lost)

    def plan_recovery(self, live: list[str]) -> RecoveryPlan:
        """What to restore now for every unrecovered loss, onto the ``live`` workers."""
        cfg = self.cfg.checkpoint
        rows = {(t, p): b - a for t, l in self.pmap.layouts.items() for p, (a, b) in enumerate(l.bounds)}
        return plan_recovery(
            owners=self.pmap.owners, kinds=self.cfg.kinds, rows=rows, lost=self.lost, live=live,
            full=cfg is not None and cfg.recovery == "full",
            manifests=self.ledger.newest_first() if self.ledger else [],
            lost_shards=self.lost_shards, n_shards=self.queue.n_shards, mirrors=self.mirrors,
            state_mirrors=self.state_mirrors)

    def restored(self, key: tuple[str, int], target: str, version: int, now: float,
                 memory_clock: int | None = None) -> None:
        """``target`` owns ``key`` now, restored from checkpoint ``version`` (0: the initial values)
        or from a buddy's memory copy as of ``memory_clock``."""
        self.pmap.owners[key] = target
        if memory_clock is None and self.cfg.rebuild:  # (forgotten when a rebuild pass is applied)
            self.restored_rows.setdefault(key[0], []).append(self.pmap.layouts[key[0]].bounds[key[1]])
        where = {"version": version} if memory_clock is None else {"tier": "memory", "memory_clock": memory_clock}
        self.event(now, "partition-restored", table=key[0], part=key[1], target=target, **where)

    def recovery_planned(self, plan: RecoveryPlan, now: float) -> set[str]:
        """The plan is about to be carried out: record which losses it covers; returns them."""
        covered = set(self.unrecovered)
        for s, entry in plan.states.items():
            self.restore_state[s] = entry
        self.lost_shards.clear()
        return covered

    @property
    def needs_recovery(self) -> bool:
        """A loss is not recovered yet, or a partition is owned by a lost worker (a restore target
        lost before it took the partition over)."""
        return bool(self.unrecovered) or any(w in self.lost for w in self.pmap.owners.values())

    def recovered(self, covered: set[str], now: float) -> list[Effect]:
        """The plan that covered ``covered`` was carried out; the recovery ends when nothing is left."""
        self.unrecovered -= covered
        if self.needs_recovery or not self.machine.recovering:
            return []
        return self._carry_out(self.machine.recovered(), now)

    def _plan_states(self, shards, manifests: list[dict]) -> None:
        saved = manifests[0].get("states", {}) if manifests else {}
        for s in shards:
            if str(s) in saved:
                self.restore_state[int(s)] = saved[str(s)]

    def rebase(self, manifest: dict) -> None:
        """The job resumed from an older manifest than it was started with (a newer one did not verify)."""
        self.ledger.rebase(manifest)
        self.machine.clock = int(manifest["clock"])
        self.restore_state.clear()
        self._plan_states(range(self.queue.n_shards), [manifest])

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
        cfg = self.cfg.checkpoint
        if cfg is None or self.ledger is None:
            return None
        built = self.ledger.built
        age = self.clock - (int(built["clock"]) if built is not None else 0)
        period = self._last_period or cfg.period
        return {"age": age, "rework_estimate": rework_estimate(age, cfg.recovery, self.unsaved_sq, cfg.memory),
                "period": float(period)}

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
