"""The control plane: ``Coordinator``, a SchedulerPlugin.

It owns, per job, the partition map (its own truth, not the scheduler's task
state), the shard queue, the clock's phase, the monitor and policies, the
checkpoint bookkeeping, recovery, and the event log. Its handlers move only
ids, timings, file names and scalar metrics, and never block the event loop:
waiting is done with long polls on an ``asyncio.Event``.

Phases of a clock: [``rebuild`` (after a recovery: the algorithm's rebuild
pass)] -> ``shards`` (workers pull attempts and commit) -> ``apply`` (every
owner applies the committed attempts' staged updates) -> ``clock_end`` (one
worker runs the algorithm's clock-end step) -> ``done`` (a checkpoint is
snapshotted if due; the driver collects the report and starts the next clock).

Data phases: an algorithm with ``phases`` (e.g. ALS: ``user`` then ``item``)
runs ``shards -> apply`` once per data phase, each over that phase's own shards
(the queue hands out only the active phase's), then ``clock_end``. Reduction
tables are zeroed by the first data phase's apply and sum every phase's
contributions of the clock.

A lost worker (crash, ttl, or a simulated loss): its running attempts go back
to TODO; with a checkpoint store, its partitions are restored onto the least
loaded live workers from the newest complete checkpoint (``partial``; complete:
every file durable and verified, published or about to be) or
every table rolls back (``full``); without one, a lost owner ends the job.
If the loss happened before the active data phase's updates were applied,
that phase is run again from its start (its staged updates discarded
everywhere); earlier phases of the clock, already applied, are not redone —
their effect on the restored partitions is lost like any update since the
checkpoint (partial recovery). With a single phase this is "the clock runs
again". If the loss happened while a phase's updates were applied or in the
clock-end step, the clock ends there: its later phases and its clock-end step
are skipped (``skipped=1``), as its reductions may be incomplete; so is the
clock-end step when a reduction partition was lost after an earlier phase of
the clock had added to it. After a recovery, a rebuild pass (over the shards of
every phase) runs before the active phase goes on.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from distributed import SchedulerPlugin
from distributed.protocol.pickle import loads

from .checkpoint import CheckpointConfig, chain_key, state_shards
from .errors import ShardFailedError
from .monitor import ThroughputMonitor
from .partitions import PartitionMap, TableLayout
from .policies import Backup, ControllerView, Policy, Restart, Running, SetBatchScale
from .shards import ShardQueue

logger = logging.getLogger("dscar.coordinator")

PLUGIN_NAME = "dscar-coordinator"
IDLE_RECHECK_S = 0.02  # how often an idle worker's long poll looks again while a backup may turn due


@dataclass
class _Job:
    id: str
    spec: bytes
    queue: ShardQueue
    pmap: PartitionMap
    kinds: dict[str, str]  # table -> "param" | "reduction"
    phase: str = "idle"  # idle | rebuild | shards | apply | clock_end | done | failed
    clock: int = 0
    clock_end_worker: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, dict[str, float]] = field(default_factory=dict)  # worker -> sums
    phase_s: dict[str, float] = field(default_factory=dict)
    t_phase: float = 0.0
    monitor: ThroughputMonitor = field(default_factory=ThroughputMonitor)
    policies: list[Policy] = field(default_factory=list)
    batch_scale: dict[str, float] = field(default_factory=dict)
    stragglers: dict[str, str] = field(default_factory=dict)
    pending_restarts: list[str] = field(default_factory=list)
    # checkpoints and recovery
    ckpt: CheckpointConfig | None = None
    rebuild: list[str] = field(default_factory=list)
    version: int = 0  # last version started
    pending: dict[int, dict] = field(default_factory=dict)  # version -> {clock, waiting, files, failed}
    built: dict | None = None  # newest manifest built (the next priority chain extends it)
    to_publish: list[dict] = field(default_factory=list)
    published: list[dict] = field(default_factory=list)  # oldest first
    recovering: int = 0
    damaged: bool = False  # a loss in this clock: skip its clock-end step
    needs_rebuild: bool = False
    lost: set[str] = field(default_factory=set)
    last_loss: float = 0.0
    redo: bool = False  # a partition owner or shard-state holder was lost before this pass applied: run it again
    epoch: int = 0  # bumped by every recovery: workers drop values pulled before it
    phase_names: list[str] = field(default_factory=lambda: [""])  # data phases of a clock ("" : unnamed)
    data_phase: int = 0  # the data phase the clock is in
    shards_done: dict[str, int] = field(default_factory=dict)  # worker -> shards committed this clock
    reductions_lost: bool = False  # a reduction partition was lost after an earlier data phase added to it
    state_saved: dict[int, int] = field(default_factory=dict)  # shard -> clock its state was last checkpointed
    restore_state: dict[int, dict] = field(default_factory=dict)  # shard -> state file to restore before its next step


class Coordinator(SchedulerPlugin):
    """Shard service, ownership map, clock orchestration, checkpoints and recovery on the scheduler."""

    name = PLUGIN_NAME
    idempotent = True

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self.jobs: dict[str, _Job] = {}
        self._changed = asyncio.Event()
        for op in (
            "start_job", "job_spec", "placed", "begin_clock", "next", "commit", "fail", "clock_done",
            "clock_failed", "wait", "end_job", "owners", "event", "ckpt_written", "published",
            "simulate_loss", "flush", "rebase",
        ):
            scheduler.handlers[f"dscar_{op}"] = getattr(self, f"_h_{op}")

    # ----------------------------------------------------------- plumbing
    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def _event(self, job: _Job, kind: str, **info: Any) -> None:
        job.events.append({"time": time.time(), "clock": job.clock, "kind": kind, **info})

    def _fail(self, job: _Job, error: str) -> None:
        if job.phase != "failed":
            job.phase, job.error = "failed", error
            self._event(job, "job-failed", error=error)
        self._wake()

    def _set_phase(self, job: _Job, phase: str) -> None:
        now = time.perf_counter()
        if job.phase in ("rebuild", "shards", "apply", "clock_end"):
            job.phase_s[job.phase] = job.phase_s.get(job.phase, 0.0) + now - job.t_phase
            if job.phase in ("shards", "apply") and len(job.phase_names) > 1:  # per data phase too
                key = f"{job.phase}:{job.phase_names[job.data_phase]}"
                job.phase_s[key] = job.phase_s.get(key, 0.0) + now - job.t_phase
        job.phase, job.t_phase = phase, now
        self._wake()

    def _live(self, exclude: str | None = None) -> list[str]:
        return [w for w in sorted(self.scheduler.workers) if w != exclude and w not in self._all_lost()]

    def _all_lost(self) -> set[str]:
        return set().union(*(j.lost for j in self.jobs.values())) if self.jobs else set()

    async def _settled(self, job: _Job) -> None:
        while job.recovering and job.phase != "failed":
            await asyncio.sleep(0.005)

    # ------------------------------------------------------------ the job
    def _h_start_job(self, job_id: str, spec: bytes, n_shards: int, reloadable: bool, tables: list,
                     max_failures: int = 3, sharding: str = "dynamic", policies: bytes | None = None,
                     monitor: dict | None = None, checkpoint: dict | None = None, rebuild: list | None = None,
                     resume: dict | None = None, phases: list | None = None) -> dict:
        busy = [j.id for j in self.jobs.values() if j.phase != "failed" and j.id != job_id]
        if busy:
            return {"status": "busy", "jobs": busy}
        workers = sorted(self.scheduler.workers)
        if not workers:
            return {"status": "no-workers"}
        pmap = PartitionMap(TableLayout(t[0], int(t[1]), int(t[2])) for t in tables)
        pmap.assign(workers)
        phases = [(str(n), int(k)) for n, k in phases] if phases else [("", n_shards)]
        queue = ShardQueue(n_shards, reloadable=reloadable, max_failures=max_failures, sharding=sharding,
                           phases=[k for _, k in phases])
        job = _Job(job_id, spec, queue, pmap, {t[0]: t[3] for t in tables},
                   monitor=ThroughputMonitor(**(monitor or {})), policies=loads(policies) if policies else [],
                   ckpt=CheckpointConfig(**checkpoint) if checkpoint else None, rebuild=list(rebuild or ()),
                   phase_names=[n for n, _ in phases])
        if resume:
            job.published = [resume]
            job.built = resume
            job.version = int(resume["version"])
            job.clock = int(resume["clock"])
            self._plan_state_restore(job, range(n_shards), resume)
            job.state_saved = {int(sh): int(resume["clock"]) for sh in resume.get("states", {})}
        self.jobs[job_id] = job
        self._event(job, "job-started", workers=workers, n_shards=n_shards, sharding=sharding,
                    policies=[p.name for p in job.policies],
                    checkpoint=None if job.ckpt is None else f"{job.ckpt.policy}/{job.ckpt.recovery}")
        return {"status": "OK", "owners": pmap.to_msg(), "workers": workers}

    def _h_job_spec(self, job_id: str) -> bytes:
        return self.jobs[job_id].spec

    def _h_owners(self, job_id: str) -> list:
        return self.jobs[job_id].pmap.to_msg()

    def _h_placed(self, job_id: str, placements: list) -> dict:
        job = self.jobs[job_id]
        for shard, worker in placements:
            if worker in self.scheduler.workers:
                job.queue.set_holder(int(shard), worker)
        self._wake()
        return {"status": "OK"}

    async def _h_begin_clock(self, job_id: str, clock: int) -> dict:
        job = self.jobs[job_id]
        await self._settled(job)
        if job.phase == "failed":
            return {"status": "failed", "error": job.error}
        while job.pending_restarts:  # between clocks nothing is staged: safe to move partitions
            await self._restart(job, job.pending_restarts.pop(0))
        job.clock, job.metrics, job.clock_end_worker = clock, {}, None
        job.timings, job.phase_s, job.damaged = {}, {}, False
        job.data_phase, job.shards_done, job.reductions_lost = 0, {}, False
        if job.needs_rebuild and job.rebuild:
            job.needs_rebuild = False
            job.queue.begin_clock(clock, None)  # the rebuild pass: every shard of every phase
            self._event(job, "rebuild-started", tables=job.rebuild)
            self._set_phase(job, "rebuild")
        else:
            job.needs_rebuild = False
            job.queue.begin_clock(clock, 0)
            self._set_phase(job, "shards")
        return {"status": "OK"}

    def _h_event(self, job_id: str, clock: int, kind: str, worker: str, info: dict | None = None) -> dict:
        """A worker reports something that happened to it (an injected fault, ...)."""
        job = self.jobs.get(job_id)
        if job is not None:
            job.events.append({"time": time.time(), "clock": clock, "kind": kind, "worker": worker, **(info or {})})
            self._wake()
        return {"status": "OK"}

    def _h_end_job(self, job_id: str) -> dict:
        job = self.jobs.pop(job_id, None)
        self._wake()
        return {"status": "OK", "events": [] if job is None else job.events, "all_events": True}

    # ------------------------------------------------------- worker side
    def _item_for(self, worker: str) -> dict | None:
        for job in self.jobs.values():
            if job.recovering or worker in job.lost:
                continue
            if job.phase in ("shards", "rebuild"):
                now = time.time()
                a = job.queue.next_shard(worker, now)
                if a is not None and a.fetch_from:
                    self._event(job, "shard-moved", shard=a.shard, source=a.fetch_from, target=worker)
                if a is None and job.phase == "shards":
                    a = self._idle_policies(job, worker, now)
                if a is not None:
                    rebuild = job.phase == "rebuild"
                    return {
                        "op": "rebuild" if rebuild else "shard", "job": job.id, "clock": job.clock,
                        "shard": a.shard, "attempt": a.attempt, "fetch_from": a.fetch_from, "backup": a.backup,
                        "fetch_alt": a.fetch_alt,
                        "owners": job.pmap.to_msg(), "batch_scale": job.batch_scale.get(worker, 1.0),
                        "epoch": job.epoch, "phase": job.phase_names[job.queue.phase_of(a.shard)] or None,
                        "pass": "rebuild" if rebuild else job.data_phase,  # table values differ between passes
                        **self._state_restore_msg(job, a.shard),
                    }
            elif job.phase == "clock_end" and job.clock_end_worker is None:
                job.clock_end_worker = worker
                return {"op": "clock_end", "job": job.id, "clock": job.clock, "owners": job.pmap.to_msg(),
                        "epoch": job.epoch}
        return None

    def _view(self, job: _Job, now: float, idle_worker: str | None = None) -> ControllerView:
        running = []
        for a in job.queue.running():
            n = len(job.queue.running_attempts(a.shard))
            running.append(Running(a.shard, a.worker, now - a.started, n))
        return ControllerView(job.clock, self._live(), job.queue.counts()["todo"], running,
                              job.monitor, dict(job.stragglers), idle_worker)

    def _idle_policies(self, job: _Job, worker: str, now: float):
        """A worker found no TODO shard: the idle-time policies may give it a backup attempt."""
        for policy in job.policies:
            if policy.when != "idle":
                continue
            for action in policy.decide(self._view(job, now, worker)):
                if isinstance(action, Backup):
                    a = job.queue.start_backup(action.shard, action.worker, now)
                    self._event(job, "backup-attempt", shard=a.shard, attempt=a.attempt, worker=worker,
                                policy=policy.name)
                    return a
        return None

    def _clock_policies(self, job: _Job) -> None:
        now = time.time()
        running = {a.worker: now - a.started for a in job.queue.running()}
        stragglers = job.monitor.end_clock(running)
        for w, kind in stragglers.items():
            if job.stragglers.get(w) != kind:
                self._event(job, "straggler", worker=w, straggler=kind)
        for w in job.stragglers.keys() - stragglers.keys():
            self._event(job, "straggler-recovered", worker=w)
        job.stragglers = stragglers
        for policy in job.policies:
            if policy.when != "clock":
                continue
            for action in policy.decide(self._view(job, now)):
                if isinstance(action, SetBatchScale):
                    job.batch_scale = dict(action.scales)
                    self._event(job, "batch-scale", scales=job.batch_scale, policy=policy.name)
                elif isinstance(action, Restart) and action.worker not in job.pending_restarts:
                    job.pending_restarts.append(action.worker)
                    self._event(job, "restart-planned", worker=action.worker, reason=action.reason,
                                policy=policy.name)

    async def _restart(self, job: _Job, worker: str) -> None:
        """Hand ``worker``'s partitions to the least loaded others, then restart it (kill-and-restart)."""
        others = self._live(exclude=worker)
        if worker not in self.scheduler.workers or not others:
            return
        for table, part in job.pmap.owned_by(worker):
            new = job.pmap.least_loaded(others)
            await self.scheduler.rpc(new).dscar_adopt(job_id=job.id, table=table, part=part, source=worker)
            job.pmap.owners[(table, part)] = new
            self._event(job, "partition-moved", table=table, part=part, source=worker, target=new)
        job.monitor.forget(worker)
        job.batch_scale.pop(worker, None)
        self._event(job, "worker-restart", worker=worker)
        await self.scheduler.restart_workers([worker], wait_for_workers=False, on_error="return",
                                             stimulus_id=f"dscar-restart-{time.time()}")

    async def _h_next(self, worker: str, timeout: float = 1.0) -> dict:
        """Long poll: the next work item for ``worker``, or ``idle`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            if worker in self.scheduler.workers:
                item = self._item_for(worker)
                if item is not None:
                    return item
            left = deadline - time.monotonic()
            if left <= 0:
                return {"op": "idle"}
            # idle-time policies (backups) turn due with time, not with an event: look again soon
            await self._wait_change(min(left, IDLE_RECHECK_S) if self._idle_work_possible() else left)

    def _idle_work_possible(self) -> bool:
        return any(job.phase == "shards" and any(p.when == "idle" for p in job.policies) and job.queue.running()
                   for job in self.jobs.values())

    def _h_commit(self, job_id: str, clock: int, shard: int, attempt: int, worker: str,
                  timings: dict | None = None) -> dict:
        job = self.jobs.get(job_id)
        if job is None or job.phase not in ("shards", "rebuild") or job.clock != clock or worker in job.lost:
            return {"granted": False}
        if job.redo:  # a recovery will run this pass again: nothing of it may stick
            return {"granted": False}
        started = next((a.started for a in job.queue.running_attempts(shard) if a.attempt == attempt), None)
        if started is not None and job.phase == "shards":
            job.monitor.record(worker, time.time() - started)
        granted = job.queue.commit(shard, attempt, worker)
        if granted:
            job.restore_state.pop(shard, None)  # the attempt started from the restored state; it lives on now
            sums = job.timings.setdefault(worker, {})
            for k, v in (timings or {}).items():
                sums[k] = sums.get(k, 0.0) + float(v)
        else:
            self._event(job, "commit-refused", shard=shard, attempt=attempt, worker=worker)
        if job.queue.complete:
            rebuild = job.phase == "rebuild"
            self._set_phase(job, "apply")
            asyncio.ensure_future(self._apply(job, rebuild))
        return {"granted": granted}

    def _h_fail(self, job_id: str, clock: int, shard: int, attempt: int, worker: str,
                error: str, lost_data: bool = False) -> dict:
        job = self.jobs.get(job_id)
        if job is None or job.clock != clock or job.phase not in ("shards", "rebuild"):
            return {"status": "ignored"}
        self._event(job, "shard-failed", shard=shard, attempt=attempt, worker=worker, error=error)
        if lost_data:
            job.queue.set_holder(shard, None)
        started = next((a.started for a in job.queue.running_attempts(shard) if a.attempt == attempt), None)
        innocent = started is not None and started <= job.last_loss  # a worker was lost under it
        try:
            job.queue.fail(shard, attempt, worker, error, count=not innocent)
        except ShardFailedError as e:
            self._fail(job, str(e))
        self._wake()
        return {"status": "OK"}

    async def _apply(self, job: _Job, rebuild: bool) -> None:
        await self._settled(job)
        if job.phase != "apply":
            return  # the clock was restarted by a recovery
        committed = [list(c) for c in job.queue.committed()]
        if rebuild:
            reset = list(job.rebuild)
        elif job.data_phase == 0:  # reductions hold the sums of every data phase of the clock
            reset = [t for t, k in job.kinds.items() if k == "reduction"]
        else:
            reset = []
        owners = sorted(w for w in job.pmap.workers() if w in self.scheduler.workers)
        results = await asyncio.gather(*(
            self.scheduler.rpc(w).dscar_apply(job_id=job.id, clock=job.clock, committed=committed, reset=reset)
            for w in owners
        ), return_exceptions=True)
        for w, r in zip(owners, results):
            if isinstance(r, Exception) and w in self.scheduler.workers and w not in job.lost:
                self._fail(job, f"applying clock {job.clock}'s updates on {w} failed: {r!r}")
                return
        await self._settled(job)
        if job.phase != "apply":
            return
        if rebuild:
            self._event(job, "rebuild-done", damaged=job.damaged)
            if job.damaged:  # a loss during the rebuild pass: run it again
                job.damaged = False
                job.queue.begin_clock(job.clock, None)
                self._set_phase(job, "rebuild")
                return
            job.queue.begin_clock(job.clock, job.data_phase)  # go on with the phase the loss interrupted
            self._set_phase(job, "shards")
            return
        for w, n in job.queue.committed_by().items():
            job.shards_done[w] = job.shards_done.get(w, 0) + n
        if job.damaged:
            self._skip_clock_end(job)
        elif not job.queue.last_phase:
            job.queue.next_phase()
            self._set_phase(job, "shards")
            job.data_phase = job.queue.phase  # after _set_phase: it books the time of the phase that ended
        elif job.reductions_lost:
            self._skip_clock_end(job, "a reduction partition was lost after an earlier phase of this clock")
        else:
            self._set_phase(job, "clock_end")

    def _skip_clock_end(self, job: _Job, reason: str = "a worker was lost in this clock") -> None:
        job.metrics = {"objective": math.nan, "skipped": 1.0}
        self._event(job, "clock-end-skipped", reason=reason)
        self._set_phase(job, "done")

    async def _h_clock_done(self, job_id: str, clock: int, worker: str, metrics: dict, seconds: float) -> dict:
        job = self.jobs.get(job_id)
        if job is None or job.clock != clock or job.phase != "clock_end" or job.clock_end_worker != worker:
            return {"status": "ignored"}
        await self._settled(job)
        if job.damaged:
            self._skip_clock_end(job)
            return {"status": "OK"}
        job.metrics = dict(metrics)
        job.phase_s["clock_end_compute"] = float(seconds)
        self._clock_policies(job)
        if job.ckpt is not None and job.ckpt.due(clock):
            await self._checkpoint(job)
        self._set_phase(job, "done")
        return {"status": "OK"}

    def _h_clock_failed(self, job_id: str, clock: int, worker: str, error: str) -> dict:
        job = self.jobs.get(job_id)
        if job is not None and job.clock == clock and job.phase == "clock_end":
            if job.damaged or job.recovering:  # it failed because a worker was lost under it
                asyncio.ensure_future(self._skip_after_recovery(job))
            else:
                self._fail(job, f"clock_end of clock {clock} failed on {worker}:\n{error}")
        return {"status": "OK"}

    async def _skip_after_recovery(self, job: _Job) -> None:
        await self._settled(job)
        if job.phase == "clock_end":
            self._skip_clock_end(job)

    # -------------------------------------------------------- checkpoints
    async def _checkpoint(self, job: _Job) -> None:
        """Snapshot every owner's param partitions (they write in the background)."""
        job.version += 1
        v = job.version
        cfg = job.ckpt
        saving = state_shards(job.queue.n_shards, cfg.save_fraction, job.state_saved)
        by_holder: dict[str, list[int]] = {}
        for s in saving:
            h = job.queue.holder(s)
            if h is not None and h in self.scheduler.workers and h not in job.lost:
                by_holder.setdefault(h, []).append(s)
        owners = sorted({w for (t, p), w in job.pmap.owners.items() if job.kinds[t] == "param"} | set(by_holder))
        job.pending[v] = {"clock": job.clock, "waiting": set(owners), "files": [], "failed": None}
        results = await asyncio.gather(*(
            self.scheduler.rpc(w).dscar_checkpoint(job_id=job.id, version=v, url=cfg.url,
                                                   fraction=cfg.save_fraction, storage_options=cfg.storage_options,
                                                   state_shards=by_holder.get(w, []))
            for w in owners
        ), return_exceptions=True)
        for w, r in zip(owners, results):
            if isinstance(r, Exception):
                job.pending[v]["failed"] = f"{w}: {r!r}"
        self._event(job, "checkpoint-started", version=v, policy=cfg.policy, fraction=cfg.save_fraction)
        self._build_manifests(job)

    def _h_ckpt_written(self, job_id: str, version: int, worker: str, files: list, error: str | None = None) -> dict:
        job = self.jobs.get(job_id)
        if job is None or version not in job.pending:
            return {"status": "ignored"}
        p = job.pending[version]
        p["files"].extend(files)
        p["waiting"].discard(worker)
        if error:
            p["failed"] = f"{worker}: {error}"
        self._build_manifests(job)
        self._wake()
        return {"status": "OK"}

    def _build_manifests(self, job: _Job) -> None:
        """Turn complete versions into manifests, oldest first (a priority chain extends the previous one)."""
        while job.pending:
            v = min(job.pending)
            p = job.pending[v]
            if p["failed"]:
                self._event(job, "checkpoint-abandoned", version=v, reason=p["failed"])
                del job.pending[v]
                continue
            if p["waiting"]:
                return
            del job.pending[v]
            cfg = job.ckpt
            chains = {}
            prev = job.built["chains"] if job.built else {}
            for t, layout in job.pmap.layouts.items():
                if job.kinds[t] != "param":
                    continue
                for part in range(layout.n_parts):
                    key = chain_key(t, part)
                    new = [f for f in p["files"] if f.get("table") == t and f.get("part") == part]
                    if cfg.policy == "priority" or not new:
                        chains[key] = list(prev.get(key, [])) + new
                    else:
                        chains[key] = new
            states = dict(job.built["states"]) if job.built else {}  # shard -> newest file with its state
            for f in p["files"]:
                for shard in f.get("shards", ()):
                    states[str(shard)] = f
                    job.state_saved[int(shard)] = p["clock"]
            manifest = {
                "version": v, "clock": p["clock"], "policy": cfg.policy, "fraction": cfg.save_fraction,
                "job": job.id, "chains": chains, "states": states, "bytes": sum(f["bytes"] for f in p["files"]),
                "tables": [[t, l.n_rows, l.n_parts, job.kinds[t]] for t, l in job.pmap.layouts.items()],
                "created": time.time(),
            }
            job.built = manifest
            job.to_publish.append(manifest)

    def _h_rebase(self, job_id: str, manifest: dict) -> dict:
        """The job resumed from an older manifest than it was started with (a newer one did not verify)."""
        job = self.jobs[job_id]
        job.published, job.built = [manifest], manifest
        job.clock = int(manifest["clock"])
        job.restore_state.clear()  # planned from the newer manifest, which did not verify
        self._plan_state_restore(job, range(job.queue.n_shards), manifest)
        return {"status": "OK"}

    async def _h_flush(self, job_id: str, timeout: float = 30.0) -> dict:
        """Wait until every started checkpoint is written (or abandoned); return what is left to publish."""
        deadline = time.monotonic() + timeout
        job = self.jobs.get(job_id)
        while job is not None and job.pending and time.monotonic() < deadline:
            await self._wait_change(min(0.1, max(deadline - time.monotonic(), 0.0)))
        return {"publish": [] if job is None else list(job.to_publish),
                "pending": 0 if job is None else len(job.pending)}

    def _h_published(self, job_id: str, version: int) -> dict:
        """The driver wrote the manifest: the version is now visible and used by recovery."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "ignored"}
        for m in list(job.to_publish):
            if m["version"] == version:
                job.to_publish.remove(m)
                job.published.append(m)
                job.published = job.published[-max(job.ckpt.keep, 1):]
                self._event(job, "checkpoint-published", version=version, bytes=m["bytes"], clock=m["clock"])
        return {"status": "OK"}

    # ------------------------------------------------------------ recovery
    def _lose(self, job: _Job, worker: str) -> None:
        job.last_loss = time.time()
        moving = {a.shard for a in job.queue.running() if a.fetch_from == worker and not a.backup}
        held = sorted(set(job.queue.held_by(worker)) | moving)  # shards it held, or was handing over
        state_lost = bool(held) and bool(job.rebuild)  # shard state (if any) went with it: rebuild after
        requeued = job.queue.worker_lost(worker)
        job.monitor.forget(worker)
        job.batch_scale.pop(worker, None)
        owned = job.pmap.owned_by(worker)
        self._event(job, "worker-lost", worker=worker, requeued=[a.shard for a in requeued],
                    partitions=[list(p) for p in owned])
        for v, p in job.pending.items():
            if worker in p["waiting"]:
                p["failed"] = f"{worker} was lost while writing"
        self._build_manifests(job)
        if job.phase in ("rebuild", "shards") and (owned or state_lost):
            job.redo = True  # this phase applied nothing yet: discard its staged updates, run it again
            if job.data_phase > 0 and any(job.kinds[t] == "reduction" for t, _ in owned):
                job.reductions_lost = True
        elif job.phase in ("apply", "clock_end"):
            job.damaged = job.damaged or bool(owned) or (job.phase == "clock_end" and job.clock_end_worker == worker)
        if job.phase == "clock_end" and job.clock_end_worker == worker:
            asyncio.ensure_future(self._skip_after_recovery(job))
        if (owned or state_lost) and job.phase != "failed":
            if owned and job.ckpt is None:
                self._fail(job, (
                    f"worker {worker} owned partitions {owned} and was lost; restoring partitions "
                    "needs a checkpoint store (dscar.fit(..., checkpoint=...))"
                ))
            else:
                job.recovering += 1
                asyncio.ensure_future(self._recover(job, worker, owned, held))
        self._wake()

    async def _recover(self, job: _Job, worker: str, owned: list[tuple[str, int]], held: list[int]) -> None:
        """Restore what ``worker`` took with it: its partitions (``partial``) or every table (``full``)
        from the newest readable checkpoint, and its shards' states (every shard's, ``full``)."""
        t0 = time.perf_counter()
        try:
            cfg = job.ckpt
            full = cfg is not None and cfg.recovery == "full"
            # newest first; a built manifest the driver has not yet published is usable here: every file
            # it names is written, fsynced and checksummed (publication only makes it visible to resume)
            manifests = list(reversed(job.published + job.to_publish)) if cfg is not None else []
            self._plan_state_restore(job, range(job.queue.n_shards) if full else held,
                                     manifests[0] if manifests else None)
            restore = [k for k in sorted(job.pmap.owners) if job.kinds[k[0]] == "param"] if full else owned
            restore = list(dict.fromkeys(list(restore) + [k for k in owned if job.kinds[k[0]] == "reduction"]))
            self._event(job, "recovery-started", worker=worker, policy=cfg.recovery if cfg else "rebuild",
                        shard_states=sorted(s for s in job.restore_state),
                        partitions=[list(k) for k in restore],
                        version=manifests[0]["version"] if manifests else 0)
            for key in restore:
                await self._restore_partition(job, key, manifests, lost=key in owned)
            if full:
                self._event(job, "rollback", to_clock=manifests[0]["clock"] if manifests else 0)
            job.needs_rebuild = True
            job.epoch += 1
            if job.redo and job.recovering == 1:
                await self._restart_clock(job)
            self._event(job, "recovery-done", worker=worker, seconds=time.perf_counter() - t0)
        except Exception as e:
            self._fail(job, f"recovery from the loss of {worker} failed: {e!r}")
        finally:
            job.recovering -= 1
            self._wake()

    async def _restore_partition(self, job: _Job, key: tuple[str, int], manifests: list[dict], lost: bool) -> None:
        """Restore one partition on its owner (or, if lost, on the least loaded live worker)."""
        table, part = key
        cfg = job.ckpt
        while True:
            live = self._live()
            if not live:
                raise RuntimeError("no live worker left")
            owner = job.pmap.owners[key]
            target = owner if (not lost and owner in live) else job.pmap.least_loaded([w for w in live if w != owner] or live)
            candidates = manifests if job.kinds[table] == "param" else []
            version, ok = 0, False
            try:
                for m in candidates + [None]:  # None: checkpoint 0, the initial values
                    chain = [] if m is None else m["chains"].get(chain_key(table, part), [])
                    r = await self.scheduler.rpc(target).dscar_restore(
                        job_id=job.id, table=table, part=part, chain=chain, url=cfg.url,
                        storage_options=cfg.storage_options)
                    if r["status"] == "OK":
                        version, ok = (0 if m is None else m["version"]), True
                        break
                    self._event(job, "checkpoint-corrupt", table=table, part=part,
                                version=None if m is None else m["version"], error=r.get("error"))
            except OSError:
                continue  # the target died under us: pick another
            if not ok:
                raise RuntimeError(f"partition {table}/{part}: no readable checkpoint, not even the initial values")
            job.pmap.owners[key] = target
            if target not in self.scheduler.workers or target in job.lost:
                continue  # lost right after: its own recovery may have missed this partition
            self._event(job, "partition-restored", table=table, part=part, target=target, version=version)
            return

    def _plan_state_restore(self, job: _Job, shards, manifest: dict | None) -> None:
        """Before their next step, ``shards`` take their state from ``manifest`` (those it saved);
        the algorithm's rebuild pass then makes the derived tables agree with it."""
        saved = (manifest or {}).get("states", {})
        for s in shards:
            if str(s) in saved:
                job.restore_state[int(s)] = saved[str(s)]
        job.needs_rebuild = True

    def _state_restore_msg(self, job: _Job, shard: int) -> dict:
        entry = job.restore_state.get(shard)
        if entry is None:
            return {}
        return {"state_file": entry, "ckpt_url": job.ckpt.url, "storage_options": job.ckpt.storage_options}

    async def _restart_clock(self, job: _Job) -> None:
        """Discard the clock's staged updates on every owner and run the clock again (rebuild first if due)."""
        job.redo = False
        live = [w for w in sorted(self.scheduler.workers) if w not in job.lost]  # owners and shard holders
        redone = list(range(job.queue.n_shards)) if job.queue.phase is None else [
            s for s in range(job.queue.n_shards) if job.queue.phase_of(s) == job.data_phase]
        await asyncio.gather(*(self.scheduler.rpc(w).dscar_discard(job_id=job.id, clock=job.clock, shards=redone)
                               for w in live), return_exceptions=True)
        phase = "rebuild" if job.needs_rebuild and job.rebuild else "shards"
        if phase == "rebuild":
            job.queue.begin_clock(job.clock, None)
        else:
            job.queue.restart_clock()  # the active data phase only: earlier ones are applied
        job.timings, job.damaged = {}, False
        job.needs_rebuild = False
        self._event(job, "clock-restarted", phase=phase, data_phase=job.phase_names[job.data_phase] or None)
        self._set_phase(job, phase)

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        for job in list(self.jobs.values()):
            if worker not in job.lost:
                self._lose(job, worker)
        self._wake()

    async def _h_simulate_loss(self, job_id: str, worker: str) -> dict:
        """Recover from ``worker`` exactly as from a crash, but keep the process: it forgets the job."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"status": "ignored"}
        job.lost.add(worker)
        self._lose(job, worker)
        try:
            await self.scheduler.rpc(worker).dscar_forget(job_id=job_id)
        except OSError:
            pass
        return {"status": "OK"}

    def add_worker(self, scheduler, worker: str) -> None:
        for job in self.jobs.values():
            self._event(job, "worker-joined", worker=worker)
        self._wake()

    # -------------------------------------------------------- driver side
    async def _h_wait(self, job_id: str, clock: int, timeout: float = 1.0, events_from: int = 0) -> dict:
        """Long poll for the driver: the clock's report, a placement request, or pending."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.jobs.get(job_id)
            if job is None:
                return {"status": "failed", "error": f"job {job_id} is unknown to the coordinator"}
            events = job.events[events_from:]
            publish = list(job.to_publish)
            if job.phase == "failed":
                return {"status": "failed", "error": job.error, "events": events}
            if job.clock == clock and job.phase == "done" and not job.recovering:
                return {
                    "status": "done",
                    "metrics": job.metrics,
                    "shards_per_worker": dict(job.shards_done),
                    "timings": job.timings,
                    "phase_s": job.phase_s,
                    "workers": {
                        st.worker: {"speed": st.speed, "mean_step_s": st.mean_step_s, "straggler": st.straggler,
                                    "batch_scale": job.batch_scale.get(st.worker, 1.0)}
                        for st in job.monitor.stats()
                    },
                    "publish": publish,
                    "events": events,
                }
            if not job.queue.reloadable:
                missing = [s for s in job.queue.unplaced() if job.queue.status(s).value == "todo"]
                if missing:
                    return {"status": "place", "shards": missing, "events": events, "publish": publish}
            if publish:
                return {"status": "pending", "events": events, "publish": publish}
            left = deadline - time.monotonic()
            if left <= 0 or not await self._wait_change(left):
                return {"status": "pending", "events": events, "publish": publish}
