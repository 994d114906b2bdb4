"""The control plane: ``Coordinator``, a SchedulerPlugin.

It owns, per job, the partition map (its own truth, not the scheduler's task
state), the shard queue, the clock's phase and the event log. Its handlers move
only ids, timings and scalar metrics, and never block the event loop: waiting
is done with long polls on an ``asyncio.Event``.

Phases of a clock: ``shards`` (workers pull attempts and commit) -> ``apply``
(every owner applies the committed attempts' staged updates) -> ``clock_end``
(one worker runs the algorithm's clock-end step) -> ``done`` (the driver
collects the report and starts the next clock).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from distributed import SchedulerPlugin
from distributed.protocol.pickle import loads

from .errors import ShardFailedError
from .monitor import ThroughputMonitor
from .partitions import PartitionMap, TableLayout
from .policies import Backup, ControllerView, Policy, Restart, Running, SetBatchScale
from .shards import ShardQueue

logger = logging.getLogger("dscar.coordinator")

PLUGIN_NAME = "dscar-coordinator"


@dataclass
class _Job:
    id: str
    spec: bytes
    queue: ShardQueue
    pmap: PartitionMap
    phase: str = "idle"  # idle | shards | apply | clock_end | done | failed
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


class Coordinator(SchedulerPlugin):
    """Shard service, ownership map and clock orchestration on the scheduler."""

    name = PLUGIN_NAME
    idempotent = True

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self.jobs: dict[str, _Job] = {}
        self._changed = asyncio.Event()
        for op in (
            "start_job", "job_spec", "placed", "begin_clock", "next", "commit", "fail",
            "clock_done", "clock_failed", "wait", "end_job", "owners", "event",
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
        if job.phase in ("shards", "apply", "clock_end"):
            job.phase_s[job.phase] = job.phase_s.get(job.phase, 0.0) + now - job.t_phase
        job.phase, job.t_phase = phase, now
        self._wake()

    # ------------------------------------------------------------ the job
    def _h_start_job(self, job_id: str, spec: bytes, n_shards: int, reloadable: bool,
                     tables: list, max_failures: int = 3, sharding: str = "dynamic",
                     policies: bytes | None = None, monitor: dict | None = None) -> dict:
        busy = [j.id for j in self.jobs.values() if j.phase != "failed" and j.id != job_id]
        if busy:
            return {"status": "busy", "jobs": busy}
        workers = sorted(self.scheduler.workers)
        if not workers:
            return {"status": "no-workers"}
        pmap = PartitionMap(TableLayout(t, int(n), int(p)) for t, n, p in tables)
        pmap.assign(workers)
        queue = ShardQueue(n_shards, reloadable=reloadable, max_failures=max_failures, sharding=sharding)
        job = _Job(job_id, spec, queue, pmap, monitor=ThroughputMonitor(**(monitor or {})),
                   policies=loads(policies) if policies else [])
        self.jobs[job_id] = job
        self._event(job, "job-started", workers=workers, n_shards=n_shards, sharding=sharding,
                    policies=[p.name for p in job.policies])
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
        if job.phase == "failed":
            return {"status": "failed", "error": job.error}
        while job.pending_restarts:  # between clocks nothing is staged: safe to move partitions
            await self._restart(job, job.pending_restarts.pop(0))
        job.queue.begin_clock(clock)
        job.clock, job.metrics, job.clock_end_worker = clock, {}, None
        job.timings, job.phase_s = {}, {}
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
            if job.phase == "shards":
                now = time.time()
                a = job.queue.next_shard(worker, now)
                if a is not None and a.fetch_from:
                    self._event(job, "shard-moved", shard=a.shard, source=a.fetch_from, target=worker)
                if a is None:
                    a = self._idle_policies(job, worker, now)
                if a is not None:
                    return {
                        "op": "shard", "job": job.id, "clock": job.clock, "shard": a.shard,
                        "attempt": a.attempt, "fetch_from": a.fetch_from, "backup": a.backup,
                        "owners": job.pmap.to_msg(), "batch_scale": job.batch_scale.get(worker, 1.0),
                    }
            elif job.phase == "clock_end" and job.clock_end_worker is None:
                job.clock_end_worker = worker
                return {"op": "clock_end", "job": job.id, "clock": job.clock, "owners": job.pmap.to_msg()}
        return None

    def _view(self, job: _Job, now: float, idle_worker: str | None = None) -> ControllerView:
        running = []
        for a in job.queue.running():
            n = len(job.queue.running_attempts(a.shard))
            running.append(Running(a.shard, a.worker, now - a.started, n))
        return ControllerView(job.clock, sorted(self.scheduler.workers), job.queue.counts()["todo"], running,
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
        others = [w for w in sorted(self.scheduler.workers) if w != worker]
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
            if left <= 0 or not await self._wait_change(left):
                return {"op": "idle"}

    def _h_commit(self, job_id: str, clock: int, shard: int, attempt: int, worker: str,
                  timings: dict | None = None) -> dict:
        job = self.jobs.get(job_id)
        if job is None or job.phase != "shards" or job.clock != clock:
            return {"granted": False}
        started = next((a.started for a in job.queue.running_attempts(shard) if a.attempt == attempt), None)
        if started is not None:
            job.monitor.record(worker, time.time() - started)
        granted = job.queue.commit(shard, attempt, worker)
        if granted:
            sums = job.timings.setdefault(worker, {})
            for k, v in (timings or {}).items():
                sums[k] = sums.get(k, 0.0) + float(v)
        else:
            self._event(job, "commit-refused", shard=shard, attempt=attempt, worker=worker)
        if job.queue.complete:
            self._set_phase(job, "apply")
            asyncio.ensure_future(self._apply(job))
        return {"granted": granted}

    def _h_fail(self, job_id: str, clock: int, shard: int, attempt: int, worker: str,
                error: str, lost_data: bool = False) -> dict:
        job = self.jobs.get(job_id)
        if job is None or job.clock != clock or job.phase != "shards":
            return {"status": "ignored"}
        self._event(job, "shard-failed", shard=shard, attempt=attempt, worker=worker, error=error)
        if lost_data:
            job.queue.set_holder(shard, None)
        try:
            job.queue.fail(shard, attempt, worker, error)
        except ShardFailedError as e:
            self._fail(job, str(e))
        self._wake()
        return {"status": "OK"}

    async def _apply(self, job: _Job) -> None:
        committed = [list(c) for c in job.queue.committed()]
        owners = sorted(job.pmap.workers())
        try:
            await asyncio.gather(*(
                self.scheduler.rpc(w).dscar_apply(job_id=job.id, clock=job.clock, committed=committed)
                for w in owners
            ))
        except Exception as e:
            self._fail(job, f"applying clock {job.clock}'s updates failed: {e!r}")
            return
        if job.phase == "apply":
            self._set_phase(job, "clock_end")

    def _h_clock_done(self, job_id: str, clock: int, worker: str, metrics: dict, seconds: float) -> dict:
        job = self.jobs.get(job_id)
        if job is None or job.clock != clock or job.phase != "clock_end" or job.clock_end_worker != worker:
            return {"status": "ignored"}
        job.metrics = dict(metrics)
        job.phase_s["clock_end_compute"] = float(seconds)
        self._clock_policies(job)
        self._set_phase(job, "done")
        return {"status": "OK"}

    def _h_clock_failed(self, job_id: str, clock: int, worker: str, error: str) -> dict:
        job = self.jobs.get(job_id)
        if job is not None and job.clock == clock:
            self._fail(job, f"clock_end of clock {clock} failed on {worker}:\n{error}")
        return {"status": "OK"}

    # -------------------------------------------------------- driver side
    async def _h_wait(self, job_id: str, clock: int, timeout: float = 1.0, events_from: int = 0) -> dict:
        """Long poll for the driver: the clock's report, a placement request, or pending."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.jobs.get(job_id)
            if job is None:
                return {"status": "failed", "error": f"job {job_id} is unknown to the coordinator"}
            events = job.events[events_from:]
            if job.phase == "failed":
                return {"status": "failed", "error": job.error, "events": events}
            if job.clock == clock and job.phase == "done":
                return {
                    "status": "done",
                    "metrics": job.metrics,
                    "shards_per_worker": job.queue.committed_by(),
                    "timings": job.timings,
                    "phase_s": job.phase_s,
                    "workers": {
                        st.worker: {"speed": st.speed, "mean_step_s": st.mean_step_s, "straggler": st.straggler,
                                    "batch_scale": job.batch_scale.get(st.worker, 1.0)}
                        for st in job.monitor.stats()
                    },
                    "events": events,
                }
            if not job.queue.reloadable:
                missing = [s for s in job.queue.unplaced() if job.queue.status(s).value == "todo"]
                if missing:
                    return {"status": "place", "shards": missing, "events": events}
            left = deadline - time.monotonic()
            if left <= 0 or not await self._wait_change(left):
                return {"status": "pending", "events": events}

    # ------------------------------------------------------ worker loss
    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        for job in list(self.jobs.values()):
            requeued = job.queue.worker_lost(worker)
            job.monitor.forget(worker)
            owned = job.pmap.owned_by(worker)
            self._event(job, "worker-lost", worker=worker, requeued=[a.shard for a in requeued],
                        partitions=[list(p) for p in owned])
            if owned and job.phase != "failed":
                self._fail(job, (
                    f"worker {worker} owned partitions {owned} and was lost; "
                    "restoring partitions needs a checkpoint store (not configured)"
                ))
            if job.clock_end_worker == worker and job.phase == "clock_end":
                job.clock_end_worker = None  # another worker runs the clock-end step
        self._wake()

    def add_worker(self, scheduler, worker: str) -> None:
        for job in self.jobs.values():
            self._event(job, "worker-joined", worker=worker)
        self._wake()
