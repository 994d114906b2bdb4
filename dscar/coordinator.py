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

from .errors import ShardFailedError
from .partitions import PartitionMap, TableLayout
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
            "clock_done", "clock_failed", "wait", "end_job", "owners",
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
                     tables: list, max_failures: int = 3) -> dict:
        busy = [j.id for j in self.jobs.values() if j.phase != "failed" and j.id != job_id]
        if busy:
            return {"status": "busy", "jobs": busy}
        workers = sorted(self.scheduler.workers)
        if not workers:
            return {"status": "no-workers"}
        pmap = PartitionMap(TableLayout(t, int(n), int(p)) for t, n, p in tables)
        pmap.assign(workers)
        job = _Job(job_id, spec, ShardQueue(n_shards, reloadable=reloadable, max_failures=max_failures), pmap)
        self.jobs[job_id] = job
        self._event(job, "job-started", workers=workers, n_shards=n_shards)
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

    def _h_begin_clock(self, job_id: str, clock: int) -> dict:
        job = self.jobs[job_id]
        if job.phase == "failed":
            return {"status": "failed", "error": job.error}
        job.queue.begin_clock(clock)
        job.clock, job.metrics, job.clock_end_worker = clock, {}, None
        job.timings, job.phase_s = {}, {}
        self._set_phase(job, "shards")
        return {"status": "OK"}

    def _h_end_job(self, job_id: str) -> dict:
        job = self.jobs.pop(job_id, None)
        self._wake()
        return {"status": "OK", "events": [] if job is None else job.events, "all_events": True}

    # ------------------------------------------------------- worker side
    def _item_for(self, worker: str) -> dict | None:
        for job in self.jobs.values():
            if job.phase == "shards":
                a = job.queue.next_shard(worker, time.time())
                if a is not None:
                    if a.fetch_from:
                        self._event(job, "shard-moved", shard=a.shard, source=a.fetch_from, target=worker)
                    return {
                        "op": "shard", "job": job.id, "clock": job.clock, "shard": a.shard,
                        "attempt": a.attempt, "fetch_from": a.fetch_from, "owners": job.pmap.to_msg(),
                    }
            elif job.phase == "clock_end" and job.clock_end_worker is None:
                job.clock_end_worker = worker
                return {"op": "clock_end", "job": job.id, "clock": job.clock, "owners": job.pmap.to_msg()}
        return None

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
