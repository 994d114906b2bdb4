"""The data plane: ``ParamServer``, a WorkerPlugin on every worker.

It holds, per job, the table partitions this worker owns, the shards whose
data it holds, and the updates staged by shard attempts. A thread of its own
pulls work from the coordinator (``dscar_next``, a long poll), so no Dask task
is ever pinned to this worker. Parameter and shard bytes move worker to worker
through the ``dscar_*`` handlers below, as zero-copy frames; the scheduler only
ever sees ids and small dicts.

Exactly once: a shard attempt first stages its contributions at every owner,
then asks the coordinator to commit. At the end of the shard phase the
coordinator tells each owner which ``(shard, attempt)`` pairs committed; the
owner applies exactly those, in shard order (deterministic sums), and drops
the rest.
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
from distributed import WorkerPlugin
from distributed.protocol import to_serialize
from distributed.protocol.pickle import loads
from distributed.utils import sync

from .algorithm import Algorithm, DataMeta, TableSpec
from .partitions import TableLayout
from .xp import select_namespace, to_device, to_host

logger = logging.getLogger("dscar.worker")

PLUGIN_NAME = "dscar-paramserver"


@dataclass
class Job:
    """One fit's state on one worker."""

    id: str
    algorithm: Algorithm
    meta: DataMeta
    specs: dict[str, TableSpec]
    layouts: dict[str, TableLayout]
    loader: Any  # FileData or None
    tol: float
    xp: ModuleType
    parts: dict[tuple[str, int], Any] = field(default_factory=dict)
    staged: dict[tuple[int, int, int], list] = field(default_factory=lambda: defaultdict(list))
    shards: dict[int, dict[str, Any]] = field(default_factory=dict)
    owners: dict[tuple[str, int], str] = field(default_factory=dict)
    pull_cache: dict[tuple, Any] = field(default_factory=dict)
    cache_clock: int = -1


class ParamServer(WorkerPlugin):
    """Holds table partitions and shards; runs the worker's pull loop."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, poll_timeout: float = 1.0):
        self.poll_timeout = poll_timeout

    # ------------------------------------------------------------ lifecycle
    def setup(self, worker) -> None:
        self.worker = worker
        self.xp = select_namespace()
        self.jobs: dict[str, Job] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        for op in ("init", "pull", "stage", "apply", "assign", "put_shard", "take_shard", "end_job", "info"):
            worker.handlers[f"dscar_{op}"] = getattr(self, f"_h_{op}")
        self._thread = threading.Thread(target=self._loop, name="dscar-loop", daemon=True)
        self._thread.start()

    def teardown(self, worker) -> None:
        self._stop.set()

    # ---------------------------------------------------------------- jobs
    def _job(self, job_id: str) -> Job:
        with self._lock:
            job = self.jobs.get(job_id)
        if job is not None:
            return job
        spec = sync(self.worker.loop, self.worker.scheduler.dscar_job_spec, job_id=job_id)
        return self._install(job_id, spec)

    def _install(self, job_id: str, spec: bytes) -> Job:
        d = loads(spec)
        with self._lock:
            if job_id not in self.jobs:
                self.jobs[job_id] = Job(
                    id=job_id,
                    algorithm=d["algorithm"],
                    meta=d["meta"],
                    specs={t.name: t for t in d["tables"]},
                    layouts={t.name: TableLayout(t.name, t.n_rows, t.n_parts) for t in d["tables"]},
                    loader=d["loader"],
                    tol=d["tol"],
                    xp=self.xp,
                )
            return self.jobs[job_id]

    # ------------------------------------------------------------- handlers
    async def _h_init(self, job_id: str, parts: list) -> dict:
        """Create this worker's partitions from the algorithm's initial values."""
        job = self.jobs.get(job_id)
        if job is None:
            spec = await self.worker.scheduler.dscar_job_spec(job_id=job_id)
            job = self._install(job_id, spec)
        for table, part in parts:
            spec_ = job.specs[table]
            a, b = job.layouts[table].bounds[part]
            arr = job.algorithm.init_rows(spec_, a, b, job.xp)
            with self._lock:
                job.parts[(table, int(part))] = job.xp.asarray(arr, dtype=spec_.dtype)
        return {"status": "OK", "device": "gpu" if self.xp.__name__ == "cupy" else "cpu"}

    def _h_pull(self, job_id: str, table: str, part: int, lo: int, hi: int) -> dict:
        with self._lock:
            arr = self.jobs[job_id].parts[(table, part)]
            out = to_host(arr[lo:hi]).copy()
        return {"data": to_serialize(out)}

    def _h_stage(self, job_id: str, key: list, updates: list) -> dict:
        self._stage_local(self.jobs[job_id], tuple(key), updates)
        return {"status": "OK"}

    def _stage_local(self, job: Job, key: tuple, updates: list) -> None:
        with self._lock:
            for table, part, lo, data in updates:
                job.staged[key].append((table, int(part), int(lo), np.array(data, copy=True)))

    def _h_apply(self, job_id: str, clock: int, committed: list) -> dict:
        """Apply the committed attempts' staged updates of ``clock``; drop the rest."""
        job = self.jobs.get(job_id)
        if job is None:
            return {"applied": 0}
        wanted = {(clock, int(s), int(a)) for s, a in committed}
        with self._lock:
            for (table, part), arr in job.parts.items():
                if job.specs[table].kind == "reduction":
                    arr[...] = 0
            keys = sorted(k for k in job.staged if k[0] == clock)
            applied = 0
            for key in keys:
                ups = job.staged.pop(key)
                if key not in wanted:
                    continue
                for table, part, lo, data in ups:
                    arr = job.parts[(table, part)]
                    arr[lo : lo + data.shape[0]] += job.xp.asarray(data)
                    applied += 1
            for key in [k for k in job.staged if k[0] < clock]:
                del job.staged[key]  # leftovers of attempts that never committed
        return {"applied": applied}

    def _h_assign(self, job_id: str, table: str, part: int, lo: int, data) -> dict:
        self._assign_local(self.jobs[job_id], table, part, lo, data)
        return {"status": "OK"}

    def _assign_local(self, job: Job, table: str, part: int, lo: int, data) -> None:
        with self._lock:
            arr = job.parts[(table, part)]
            arr[lo : lo + data.shape[0]] = job.xp.asarray(data)

    async def _h_put_shard(self, job_id: str, shard: int, arrays: dict) -> dict:
        job = self.jobs.get(job_id)
        if job is None:
            spec = await self.worker.scheduler.dscar_job_spec(job_id=job_id)
            job = self._install(job_id, spec)
        prepared = job.algorithm.prepare_shard(dict(arrays), job.xp)
        with self._lock:
            job.shards[int(shard)] = prepared
        return {"status": "OK"}

    def _h_take_shard(self, job_id: str, shard: int) -> dict:
        """Hand a shard's data to the worker that now processes it (it moves)."""
        with self._lock:
            job = self.jobs.get(job_id)
            arrays = None if job is None else job.shards.pop(int(shard), None)
        if arrays is None:
            return {"status": "missing"}
        return {"status": "OK", "arrays": to_serialize({k: to_host(v) for k, v in arrays.items()})}

    def _h_end_job(self, job_id: str) -> dict:
        with self._lock:
            self.jobs.pop(job_id, None)
        return {"status": "OK"}

    def _h_info(self, job_id: str) -> dict:
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None:
                return {"known": False}
            return {
                "known": True,
                "shards": sorted(job.shards),
                "parts": sorted([t, p] for t, p in job.parts),
                "staged": len(job.staged),
                "device": "gpu" if self.xp.__name__ == "cupy" else "cpu",
            }

    # ------------------------------------------------------------ the loop
    def _call(self, method, **kw):
        return sync(self.worker.loop, method, **kw)

    def _loop(self) -> None:
        addr = self.worker.address
        while not self._stop.is_set():
            try:
                item = self._call(self.worker.scheduler.dscar_next, worker=addr, timeout=self.poll_timeout)
            except Exception as e:  # scheduler not ready, closing, or no coordinator yet
                if self._stop.is_set() or self.worker.status.name in ("closing", "closed", "closing_gracefully"):
                    return
                logger.debug("dscar_next failed: %r", e)
                time.sleep(0.2)
                continue
            op = item.get("op")
            if op == "shard":
                self._run_shard(item)
            elif op == "clock_end":
                self._run_clock_end(item)

    def _prepare(self, job: Job, item: dict) -> None:
        with self._lock:
            job.owners = {(t, int(p)): w for t, p, w in item["owners"]}
            if job.cache_clock != item["clock"]:
                job.pull_cache.clear()
                job.cache_clock = item["clock"]

    def _run_shard(self, item: dict) -> None:
        job_id, clock, shard, attempt = item["job"], item["clock"], item["shard"], item["attempt"]
        sched = self.worker.scheduler
        lost_data = False
        try:
            job = self._job(job_id)
            self._prepare(job, item)
            t0 = time.perf_counter()
            data = self._shard_data(job, shard, item.get("fetch_from"))
            if data is None:
                lost_data = True
                raise LookupError(f"the data of shard {shard} is on no live worker")
            ctx = ShardStep(self, job, clock, shard)
            t1 = time.perf_counter()
            job.algorithm.shard_step(ctx, data)
            t2 = time.perf_counter()
            self._send_staged(job, (clock, shard, attempt), ctx.updates)
            t3 = time.perf_counter()
            self._call(
                sched.dscar_commit,
                job_id=job_id,
                clock=clock,
                shard=shard,
                attempt=attempt,
                worker=self.worker.address,
                timings={"data_s": t1 - t0, "pull_s": ctx.pull_s, "compute_s": t2 - t1 - ctx.pull_s, "push_s": t3 - t2},
            )
        except Exception as e:
            logger.warning("dscar shard %s clock %s failed: %r", shard, clock, e)
            try:
                self._call(
                    sched.dscar_fail,
                    job_id=job_id,
                    clock=clock,
                    shard=shard,
                    attempt=attempt,
                    worker=self.worker.address,
                    error="".join(traceback.format_exception_only(type(e), e)).strip(),
                    lost_data=lost_data,
                )
            except Exception:
                pass

    def _shard_data(self, job: Job, shard: int, fetch_from: str | None):
        with self._lock:
            data = job.shards.get(shard)
        if data is not None:
            return data
        arrays = None
        if fetch_from:
            try:
                r = self._call(self.worker.rpc(fetch_from).dscar_take_shard, job_id=job.id, shard=shard)
                if r["status"] == "OK":
                    arrays = r["arrays"]
            except Exception as e:  # the holder is gone: fall back to the source
                logger.info("could not take shard %s from %s: %r", shard, fetch_from, e)
        if arrays is None and job.loader is not None:
            arrays = job.loader.load_shard(shard)
        if arrays is None:
            return None
        data = job.algorithm.prepare_shard(arrays, job.xp)
        with self._lock:
            job.shards[shard] = data
        return data

    def _send_staged(self, job: Job, key: tuple, updates: list) -> None:
        by_owner: dict[str, list] = defaultdict(list)
        for table, part, lo, data in updates:
            by_owner[job.owners[(table, part)]].append([table, part, lo, data])
        me = self.worker.address
        for owner, ups in by_owner.items():
            if owner == me:
                self._stage_local(job, key, ups)
            else:
                ups = [[t, p, lo, to_serialize(d)] for t, p, lo, d in ups]
                self._call(self.worker.rpc(owner).dscar_stage, job_id=job.id, key=list(key), updates=ups)

    def _run_clock_end(self, item: dict) -> None:
        job_id, clock = item["job"], item["clock"]
        sched = self.worker.scheduler
        try:
            job = self._job(job_id)
            self._prepare(job, item)
            t0 = time.perf_counter()
            metrics = job.algorithm.clock_end(ClockEnd(self, job, clock), )
            metrics = {str(k): float(v) for k, v in dict(metrics).items()}
            if "objective" not in metrics:
                raise ValueError(f"{type(job.algorithm).__name__}.clock_end returned no 'objective'")
            self._call(
                sched.dscar_clock_done,
                job_id=job_id,
                clock=clock,
                worker=self.worker.address,
                metrics=metrics,
                seconds=time.perf_counter() - t0,
            )
        except Exception as e:
            logger.warning("dscar clock_end of clock %s failed: %r", clock, e)
            try:
                self._call(
                    sched.dscar_clock_failed,
                    job_id=job_id,
                    clock=clock,
                    worker=self.worker.address,
                    error="".join(traceback.format_exception(type(e), e, e.__traceback__)[-3:]).strip(),
                )
            except Exception:
                pass

    # --------------------------------------------------- table row access
    def read_rows(self, job: Job, table: str, start: int, stop: int | None):
        """Global rows ``[start, stop)`` of ``table``, gathered from their owners."""
        layout = job.layouts[table]
        stop = layout.n_rows if stop is None else stop
        pieces = []
        for part, lo, hi in layout.split(start, stop):
            a = layout.bounds[part][0]
            owner = job.owners[(table, part)]
            if owner == self.worker.address:
                with self._lock:
                    pieces.append(job.parts[(table, part)][lo - a : hi - a].copy())
            else:
                r = self._call(self.worker.rpc(owner).dscar_pull, job_id=job.id, table=table, part=part, lo=lo - a, hi=hi - a)
                pieces.append(job.xp.asarray(r["data"]))
        if len(pieces) == 1:
            return pieces[0]
        return job.xp.concatenate(pieces) if pieces else job.xp.zeros((0, *job.specs[table].trailing))

    def write_rows(self, job: Job, table: str, values, start: int) -> None:
        layout = job.layouts[table]
        values = to_host(values)
        for part, lo, hi in layout.split(start, start + values.shape[0]):
            a = layout.bounds[part][0]
            chunk = np.ascontiguousarray(values[lo - start : hi - start])
            owner = job.owners[(table, part)]
            if owner == self.worker.address:
                self._assign_local(job, table, part, lo - a, chunk)
            else:
                self._call(self.worker.rpc(owner).dscar_assign, job_id=job.id, table=table, part=part, lo=lo - a, data=to_serialize(chunk))


class ShardStep:
    """The ``ShardContext`` of one attempt: cached pulls, staged adds."""

    def __init__(self, server: ParamServer, job: Job, clock: int, shard: int):
        self._server, self._job = server, job
        self.xp, self.clock, self.shard, self.meta, self.tol = job.xp, clock, shard, job.meta, job.tol
        self.updates: list = []
        self.pull_s = 0.0

    def pull(self, table: str, start: int = 0, stop: int | None = None):
        """Rows of ``table`` as of this clock's start (cached for the clock; do not mutate)."""
        key = (table, start, stop)
        cache = self._job.pull_cache
        if key not in cache:
            t0 = time.perf_counter()
            cache[key] = self._server.read_rows(self._job, table, start, stop)
            self.pull_s += time.perf_counter() - t0
        return cache[key]

    def add(self, table: str, values, start: int = 0) -> None:
        """Add ``values`` to rows ``[start, start + len(values))`` of ``table`` if this attempt commits."""
        layout = self._job.layouts[table]
        values = to_host(values)
        if values.shape[1:] != self._job.specs[table].trailing:
            raise ValueError(f"add to {table!r}: rows of shape {values.shape[1:]}, table rows are {self._job.specs[table].trailing}")
        for part, lo, hi in layout.split(start, start + values.shape[0]):
            a = layout.bounds[part][0]
            self.updates.append((table, part, lo - a, np.ascontiguousarray(values[lo - start : hi - start])))


class ClockEnd:
    """The ``ClockContext`` of a clock-end step: fresh pulls, assignments."""

    def __init__(self, server: ParamServer, job: Job, clock: int):
        self._server, self._job = server, job
        self.xp, self.clock, self.meta, self.tol = job.xp, clock, job.meta, job.tol

    def pull(self, table: str, start: int = 0, stop: int | None = None):
        return self._server.read_rows(self._job, table, start, stop)

    def assign(self, table: str, values, start: int = 0) -> None:
        self._server.write_rows(self._job, table, values, start)


def device_of(xp: ModuleType) -> str:
    return "gpu" if xp.__name__ == "cupy" else "cpu"
