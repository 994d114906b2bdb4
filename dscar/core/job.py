"""One fit's control state on the scheduler, and every decision about it (no Dask here).

``JobState`` answers the coordinator's questions — which work item a worker gets next,
whether a commit is granted, what a loss means, what follows a pass — from parts with one
job each, composed: the schedule (``dscar.core.schedule``: BSP or SSP, what may run now, what a
commit grants, when a clock ends, what a loss rewinds), the shard queue (``dscar.core.shards``),
the ownership map (``dscar.core.partitions``), the dispatch rules here (batches, moves, stragglers,
policies), the log (``dscar.core.events``), the clock tally (``dscar.core.tally``), checkpoint planning
(``dscar.core.checkpoint_plan``) and losses (``dscar.core.losses``). It returns *effects*
(``dscar.core.effects``) for the coordinator to carry out; the coordinator only sends messages.

Shard state (LDA's topic assignments) follows the same rule as table updates:
a committed attempt's new state is staged on the worker that ran it and
installed when its pass is applied. So a backup attempt, or a pass run again
after a loss, always starts from the state as of the pass's start.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .checkpoint_plan import Checkpoint, CheckpointPlanner, DropCopies, Mirror
from .dispatch import Dispatch
from .clock import ClockMachine
from .effects import ApplyPass, BeginClock, Effect, RestartWorker, StartRecovery
from .events import EventLog
from .ledger import RecoveryPlan, describe, perturbations, restore_sources
from .losses import Losses
from .monitor import ThroughputMonitor
from .partitions import PartitionMap
from .policies import Policy
from .schedule import BspSchedule, Schedule, SspSchedule
from .shards import ShardQueue
from .ssp import ClockWindow
from .tally import ClockTally

__all__ = ["ApplyPass", "BeginClock", "Checkpoint", "DropCopies", "Effect", "JobConfig", "JobState", "Mirror", "RestartWorker", "StartRecovery"]

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
                 resume: dict | None = None, consistency: str = "bsp", staleness: int = 0, max_clocks: int = 0):
        #: the job's fixed settings
        self.cfg = cfg
        #: shard states, attempts, commits, holders
        self.queue = queue
        #: partition -> owner: the coordinator's truth, not the scheduler's task state
        self.pmap = pmap
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
        #: work items, moves, stragglers and policies
        self.dispatch = Dispatch(self, policies)
        #: workers that left on purpose (Dask retired them) after handing their partitions and shards
        #: off: their departure is a ``worker-left``, not a loss (``leave``)
        self.left: set[str] = set()
        #: the live workers, refreshed by the coordinator before it asks for decisions (``workers``)
        self._workers: list[str] = []
        self._worker_set: frozenset[str] = frozenset()
        #: "bsp" or "ssp": which schedule runs the clocks
        self.consistency = consistency
        #: how the clocks progress: what may run now, what a commit grants, what a loss rewinds
        self.schedule: Schedule = (
            SspSchedule(self, staleness=staleness, max_clocks=max_clocks, resume=resume) if consistency == "ssp"
            else BspSchedule(self, resume))
        # every worker's polls and commits ask these: answered by the part that decides them, without a frame
        # of the job's own on each (the methods of the same names below say what each answers)
        self.next_item, self.idle, self.commit_many, self.releasable = (
            self.schedule.next_item, self.schedule.idle, self.schedule.commit_many, self.schedule.releasable)
        self.released = self.dispatch.released
        if resume is not None:
            self.losses.plan_states(cfg.n_shards, resume)

    events = _part("log", "events")
    error = _part("log", "error")
    metrics = _part("tally", "metrics")
    objectives = _part("tally", "objectives")
    shards_done = _part("tally", "shards_done")
    timings = _part("tally", "timings")
    stage_s = _part("tally", "stage_s")
    ledger = _part("checkpoints", "ledger")
    clock_end_worker = _part("schedule", "clock_end_worker")
    snapshotting = _part("checkpoints", "snapshotting")
    mirrors = _part("checkpoints", "mirrors")
    state_mirrors = _part("checkpoints", "state_mirrors")
    lost = _part("losses", "lost")
    restarting = _part("losses", "restarting")
    unrecovered = _part("losses", "unrecovered")
    lost_shards = _part("losses", "lost_shards")
    restore_state = _part("losses", "restore_state")
    restored_rows = _part("losses", "restored_rows")
    move_s = _part("dispatch", "move_s")
    policies = _part("dispatch", "policies")
    batch_scale = _part("dispatch", "batch_scale")
    stragglers = _part("dispatch", "stragglers")
    pending_restarts = _part("dispatch", "pending_restarts")
    batched = _part("dispatch", "batched")
    item_of = _part("dispatch", "item_of")
    running_items = _part("dispatch", "running_items")
    last_seen = _part("dispatch", "last_seen")

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
        return self.schedule.clock

    @property
    def recovering(self) -> bool:
        """Losses are being recovered: nothing completes meanwhile."""
        return self.schedule.recovering

    @property
    def run_id(self) -> int:
        """What work and messages are tagged with; older ones are stale (under SSP, the epoch)."""
        return self.schedule.run_id

    @property
    def handing_out(self) -> bool:
        return self.schedule.handing_out

    @property
    def machine(self) -> ClockMachine:
        """The BSP clock machine (``BspSchedule``)."""
        return self.schedule.machine

    @property
    def window(self) -> ClockWindow:
        """The SSP clock window (``SspSchedule``)."""
        return self.schedule.window

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

    # ---------------------------------------------------------------- clocks
    def begin(self, clock: int, now: float) -> list[Effect]:
        """The driver begins ``clock`` (``Schedule.begin``)."""
        return self.schedule.begin(clock, now)

    def next_item(self, worker: str, now: float) -> dict | None:
        """The next work item for ``worker``: a batch of shard attempts, the clock-end step, or None."""
        return self.schedule.next_item(worker, now)

    def idle(self, worker: str, now: float) -> list[Effect]:
        """``worker`` found nothing to do (under SSP the waiting commits are applied)."""
        return self.schedule.idle(worker, now)

    def commit(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, now: float,
               timings: dict | None = None, rebuild: bool = False) -> tuple[bool, list[Effect]]:
        """An attempt asks to commit: whether it is granted, and what follows (``Schedule.commit``)."""
        return self.schedule.commit(worker, clock, run_id, shard, attempt, now, timings, rebuild)

    def commit_many(self, worker: str, run_id: int, finished: list[tuple[int, int, int, dict | None]], now: float,
                    rebuild: bool = False) -> tuple[list[bool], list[Effect]]:
        """Several attempts of one worker ask to commit in one message (``protocol.Commit``):
        ``(clock, shard, attempt, timings)`` each, decided in order as ``commit`` decides one."""
        return self.schedule.commit_many(worker, run_id, finished, now, rebuild)

    def attempt_failed(self, worker: str, clock: int, run_id: int, shard: int, attempt: int, error: str,
                       now: float, lost_data: bool = False, seconds: float = 0.0, stopped: bool = False) -> None:
        """An attempt raised after ``seconds`` of work, or stopped as a lost race (``Schedule.attempt_failed``)."""
        self.schedule.attempt_failed(worker, clock, run_id, shard, attempt, error, now, lost_data, seconds, stopped)

    def applying(self, run_id: int, now: float) -> list[Effect]:
        """The apply of the pass of ``run_id`` is being sent: what begins with it (``Schedule.applying``)."""
        return self.schedule.applying(run_id, now)

    def apply_cut(self, run_id: int, now: float, why: str) -> None:
        """The apply of ``run_id`` ended without every worker's answer (``Schedule.apply_cut``)."""
        self.schedule.apply_cut(run_id, now, why)

    def applied(self, run_id: int, now: float, batch: int | None = None, ahead: bool = False) -> list[Effect]:
        """Every live worker applied the pass of ``run_id`` (under SSP: the batch ``batch``; ``ahead``: its
        folded clock end runs ahead of the next clock, ``BspSchedule.applied``)."""
        return self.schedule.applied(run_id, now, batch, ahead)

    def clock_end_done(self, worker: str, run_id: int, metrics: dict, seconds: float, now: float,
                       clock: int | None = None, stop: bool | None = None) -> list[Effect]:
        """The clock-end step of ``clock`` (None: the current one) reported (``stop``: the stopping
        rule evaluated with it, BSP folded; ``BspSchedule.clock_end_done``)."""
        return self.schedule.clock_end_done(worker, run_id, metrics, seconds, now, clock, stop)

    def clock_end_failed(self, worker: str, run_id: int, error: str, now: float,
                         clock: int | None = None) -> list[Effect]:
        """The clock-end step raised: a loss under it skips the clock; otherwise the job fails."""
        return self.schedule.clock_end_failed(worker, run_id, error, now, clock)

    def unfold_clock_end(self, worker: str, now: float) -> list[Effect]:
        """The clock end folded into ``worker``'s apply did not run: the item path runs it (``Schedule.unfold_clock_end``)."""
        return self.schedule.unfold_clock_end(worker, now)

    @property
    def report_ready(self) -> bool:
        """The BSP clock being run is finished and reportable."""
        return self.schedule.report_ready

    def report_for(self, clock: int, drop_older: bool = True) -> dict | None:
        """Clock ``clock``'s report for the driver once it is finished (None: not yet); ``drop_older``: the
        driver holds the older ones (``ClockTally.report_for``)."""
        return self.schedule.report_for(clock, drop_older)

    @property
    def clock_end_ahead(self) -> bool:
        """A clock end runs ahead of the clock (BSP, ``BspSchedule.ending``): it reads the tables as its
        clock left them, so nothing moves or restores a partition until it reported (a recovery waits,
        a boundary's hand-off or switch of copies waits for the next boundary)."""
        return getattr(self.schedule, "ending", None) is not None

    def snapshotted(self, what: str, now: float) -> list[Effect]:
        """The ``what`` snapshot ("checkpoint", "mirror") is taken: the tables may change again."""
        self.snapshotting.discard(what)
        return self.schedule.snapshotted(now)

    def stop(self, clock: int) -> None:
        """The driver stops after ``clock`` (SSP: no later clock starts or applies)."""
        self.schedule.stop(clock)

    @property
    def quiet(self) -> bool:
        """Nothing is being applied or ended (SSP): the tables hold still."""
        return self.schedule.quiet

    # -------------------------------------------------------------- dispatch
    def releasable(self, asker: str) -> tuple[str, list[tuple[int, int]]] | None:
        """``asker`` found nothing to do: the worker with the most batch members that may not have
        started, and the later half of them, to ask back (None: nothing to ask, or work is left)."""
        return self.schedule.releasable(asker)

    def released(self, worker: str, asked: list[tuple[int, int]], released: list[tuple[int, int]],
                 now: float) -> None:
        """``worker`` gave back the ``released`` members of those ``asked`` (``Dispatch.released``)."""
        self.dispatch.released(worker, asked, released, now)

    def rebuild_done(self, now: float) -> None:
        """Every shard's rebuild step was applied: the restored rows are rebuilt."""
        self.restored_rows = {}
        self.event(now, "rebuild-done")

    def clock_finished(self, clock: int, metrics: dict, now: float, started: float) -> list[Effect]:
        """A clock's clock-end step reported: its objective, the clock-end policies, and the
        checkpoint or memory copy due now (taken before the tables change again: ``snapshotting``)."""
        self.tally.finished(clock, metrics, now)
        self.dispatch.clock_policies(now)
        return self.checkpoints.clock_finished(clock, now - started, self.workers, self.lost, now,
                                                         self.schedule.cut)

    # ----------------------------------------------------------- checkpoints
    def mirrored(self, buddy: str, clock: int, parts: list, now: float, shards: list = ()) -> list[Effect]:
        """``buddy`` holds the memory copies of ``parts`` and of the states of ``shards`` as of ``clock``:
        the copies no record names any more to drop (``CheckpointPlanner.mirrored``), none of a lost worker's."""
        if buddy in self.lost:
            return []
        return [d for d in self.checkpoints.mirrored(buddy, clock, parts, shards) if d.holder not in self.lost]

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
        return self.schedule.lose(worker, now)

    def leave(self, worker: str, now: float) -> list[Effect]:
        """``worker`` leaves on purpose, at a clock boundary, having handed off its partitions and
        shards (``dscar.core.elastic``): recorded as a ``worker-left``; what it still held goes the loss's
        way (a partition it still owns is restored, a shard it still holds is placed again)."""
        if worker in self.lost:
            return []
        self.left.add(worker)
        return self.lose(worker, now)

    def forget_worker(self, worker: str, held: list[int], voided: set[int], now: float) -> tuple[list, bool | None]:
        """What a loss means whatever the consistency: ``worker``'s attempts requeued, its memory
        copies forgotten, the event, the ledger; a recovery recorded when it took partitions or
        (with rebuild tables) the state of the shards it ``held``. Returns its partitions and
        whether a restore is needed (None: the job failed)."""
        self.lost.add(worker)
        self.checkpoints.worker_lost(worker, planned=worker in self.restarting or worker in self.left, now=now)
        requeued = self.queue.worker_lost(worker) + self.queue.source_lost(worker)
        self.monitor.forget(worker)
        switched = self.losses.forget_memory(worker)  # (states still to restore from its memory: not as planned)
        self.dispatch.forget(worker)
        owned = self.pmap.owned_by(worker)
        self.event(now, "worker-left" if worker in self.left else "worker-lost", worker=worker,
                   requeued=sorted({a.shard for a in requeued} | voided),
                   partitions=[list(p) for p in owned])
        self.checkpoints.writer_lost(worker, now)
        if self.failed:
            return owned, None
        if owned and self.cfg.checkpoint is None:
            self.fail(now, f"worker {worker} owned partitions {owned} and was lost; restoring partitions "
                           "needs a checkpoint store (dscar.fit(..., checkpoint=...))")
            return owned, None
        return owned, self.losses.needs_restore(worker, bool(owned), held + switched)

    def plan_recovery(self, live: list[str]) -> RecoveryPlan:
        """What to restore now for every unrecovered loss, onto the ``live`` workers."""
        cfg = self.cfg.checkpoint
        return self.losses.plan(self.cfg.kinds, live, full=cfg is not None and cfg.recovery == "full",
                                manifests=self.ledger.newest_first() if self.ledger else [],
                                n_shards=self.queue.n_shards, mirrors=self.mirrors, state_mirrors=self.state_mirrors)

    def restored(self, key: tuple[str, int], target: str, version: int, now: float,
                 memory_clock: int | None = None) -> None:
        """``target`` owns ``key`` now (``Losses.restored``)."""
        self.losses.restored(key, target, version, now, memory_clock, self.clock)

    def states_to_confirm(self) -> dict[str, list[int]]:
        """Buddy -> the shard states to ask it about (``Losses.states_behind``): those a kept pass needs whose
        recorded copy is older, asked of the live buddies the records name and of those the unrecovered lost
        workers' newest copies went to (``CheckpointPlanner.sent_to``), none of a lost worker."""
        behind = self.losses.states_behind()
        if not behind:
            return {}
        asked = {self.restore_state[s]["memory"] for s in behind}
        asked |= {self.checkpoints.sent_to[w] for w in self.unrecovered if w in self.checkpoints.sent_to}
        return {b: behind for b in sorted(asked - self.lost)}

    def states_kept(self, buddy: str, clocks: dict[int, int], now: float) -> list[Effect]:
        """``buddy`` answered which clocks of those shard states it keeps (``Losses.states_kept``): the
        ``state-copies-found`` event names those that change the plan, and they are recorded as any reported
        copy is (``mirrored``: the drops of the copies the records named before)."""
        newer = self.losses.states_kept(buddy, clocks)
        if not newer:
            return []
        self.event(now, "state-copies-found", buddy=buddy, shards=newer, clock=max(int(clocks[s]) for s in newer))
        effects: list[Effect] = []
        for c in sorted({int(clocks[s]) for s in newer}):
            effects += self.mirrored(buddy, c, [], now, [s for s in newer if int(clocks[s]) == c])
        return effects

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
        if self.needs_recovery:
            return []
        return self.schedule.recovered(now)

    def start_recovery_round(self, live: list[str], now: float) -> tuple[RecoveryPlan, set[str]]:
        """One round of a recovery: the plan onto the ``live`` workers and the losses it covers
        (the ``recovery-started`` event says what it restores from where)."""
        plan = self.plan_recovery(live)
        covered = self.recovery_planned(plan, now)
        self.event(now, "recovery-started", workers=sorted(covered), **describe(plan))
        return plan, covered

    def end_recovery_round(self, plan: RecoveryPlan, covered: set[str], now: float, seconds: float,
                           first_event: int) -> list[Effect]:
        """The round's restores were carried out: the recovery ends when no loss is left (the
        ``recovery-done`` event: its ``seconds`` since the first round, and the perturbations of the
        partitions restored since event ``first_event``); the effects that follow its end."""
        if self.cfg.checkpoint is not None and plan.full:
            self.event(now, "rollback", to_clock=plan.manifests[0]["clock"] if plan.manifests else 0)
        effects = self.recovered(covered, now)
        if not self.recovering:
            self.event(now, "recovery-done", seconds=seconds, **perturbations(self.log.since(first_event)))
        return effects

    def restore_sources(self, key: tuple[str, int], manifests: list[dict], memory: tuple[str, int] | None,
                        live: list[str], tried: set) -> list[tuple[int, list[dict], str | None]]:
        """Where to restore partition ``key`` from, in order (``ledger.restore_sources``): a reduction
        table's partitions start from zero (no checkpoint saves them)."""
        table, part = key
        return restore_sources(manifests if self.cfg.kinds[table] == "param" else [], table, part, memory, live, tried)

    # ------------------------------------------------------------- restarts
    def adopter(self, candidates: list[str]) -> str | None:
        """Who adopts a partition of a worker a policy restarts: the least loaded of ``candidates``
        this job has not lost (None: nobody is left)."""
        live = [w for w in candidates if w not in self.lost]
        return self.pmap.least_loaded(live) if live else None

    def partition_moved(self, key: tuple[str, int], source: str, target: str, now: float) -> None:
        """``target`` adopted ``key`` from ``source`` (a restart): it owns it now."""
        self.pmap.owners[key] = target
        self.event(now, "partition-moved", table=key[0], part=key[1], source=source, target=target)

    def restart_begun(self, worker: str, now: float) -> None:
        """``worker`` restarts (its partitions moved): its measurements and batch scale go with it."""
        self.monitor.forget(worker)
        self.batch_scale.pop(worker, None)
        self.event(now, "worker-restart", worker=worker)

    # ------------------------------------------------------------- placement
    def placed(self, placements: list, live: set[str] | list[str]) -> None:
        """The driver put shards' data on workers: each ``(shard, worker)`` makes the worker the
        shard's holder, unless the worker is gone (not in ``live``, or lost to this job)."""
        for shard, worker in placements:
            if worker in live and worker not in self.lost:
                self.queue.set_holder(int(shard), worker)

    def worker_event(self, now: float, clock: int, kind: str, worker: str, info: dict | None = None) -> None:
        """A worker reports something that happened to it (an injected fault, ...), in its clock."""
        self.log.add(now, kind, **{"clock": clock, "worker": worker, **(info or {})})

    def rebase(self, manifest: dict) -> None:
        """The job resumed from an older manifest than it was started with (a newer one did not verify)."""
        self.schedule.rebase(manifest)
        self.ledger.rebase(manifest)
        self.losses.plan_states(self.queue.n_shards, manifest)

    # ------------------------------------------------------------- reports
    def snapshot(self, live: set[str], now: float) -> dict[str, Any]:
        """The job's state as plain JSON-able data, for the dashboard page (``dscar.scheduler.dashboard``).

        Read-only and cheap (no I/O): clock, stage, per worker (live, shards done this clock,
        speed, straggler flag), the active pass's queue counts (todo / doing / done, running
        backups), this clock's metrics, the retained checkpoints, the newest 200 events
        (``n_events`` counts them all) and the newest 200 clocks' objectives (``n_objectives``).
        Called after changes: keep it O(workers).
        """
        stats = {st.worker: st for st in self.monitor.stats()}
        live = set(live) - self.lost
        done = dict(self.shards_done)  # the applied data phases, plus the active one while it runs
        if self.schedule.counts_pass():
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
        head, tail = self.schedule.snapshot_fields()
        return {
            "job": self.cfg.job_id, "time": now, "clock": self.clock, **head, "error": self.error,
            "metrics": {k: float(v) for k, v in self.metrics.items()}, "workers": workers, "queue": queue,
            "checkpoints": [{"version": int(m["version"]), "clock": int(m["clock"]), "bytes": int(m.get("bytes", 0))}
                            for m in published],
            "events": self.events[-200:], "n_events": self.log.count,
            "objectives": [[c, v] for c, v in self.objectives[-200:]], "n_objectives": len(self.objectives),
            **tail,
        }

    def progress(self) -> tuple[Any, bool]:
        """A key that changes whenever the job moves on (an attempt started, committed or failed, a
        pass applied, a clock ended, a recovery step), and whether the job is working rather than
        waiting for its driver's next clock: what ``dscar.core.stall.StallWatch`` watches."""
        return self.schedule.progress()

    def queue_progress(self) -> tuple:
        """The shard queue's part of ``progress``: shards per status, attempts running."""
        return tuple(sorted(self.queue.counts().items())), len(self.queue.running())

    def stall_report(self) -> dict[str, Any]:
        """What a stalled job was doing (the ``job-stalled`` event): where its clock is and which
        attempts run where."""
        running = sorted((a.shard, a.attempt, a.worker) for a in self.queue.running())
        return {"clock": self.clock, "stage": self.schedule.stage_name, "run_id": self.run_id,
                "recovering": self.recovering, "queue": dict(self.queue.counts()),
                "running": [list(r) for r in running[:20]], "n_running": len(running),
                **self.schedule.stall_fields()}

    def checkpoint_status(self) -> dict[str, Any] | None:
        """The newest complete checkpoint's age in clocks, the rework a loss now would cost
        (``intervals.rework_estimate``) and the period in force; None without a store."""
        return self.checkpoints.status(self.clock)

    def workers_report(self) -> dict[str, dict[str, Any]]:
        """Per worker the monitor's view and its batch scale, for a clock's report."""
        return {st.worker: {"speed": st.speed, "mean_step_s": st.mean_step_s, "straggler": st.straggler,
                            "batch_scale": self.batch_scale.get(st.worker, 1.0)} for st in self.monitor.stats()}
