"""The driver: ``fit`` runs in the user's process and steers clocks.

It validates everything it can before any work starts, starts the job on the
coordinator, creates the partitions on their owners, places the data shards,
then runs clocks: begin, wait for the coordinator's report, ask the algorithm
whether it converged. Parameter bytes go worker -> driver only once, at the
end, for the result.
"""
from __future__ import annotations

import asyncio
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from distributed.protocol import to_serialize
from distributed.protocol.pickle import dumps

from .algorithm import Algorithm, TableSpec
from .cluster import Cluster
from .data import ArrayData, FileData, as_data
from .errors import ClusterError, InvalidInputError, JobFailedError
from .faults import Fault, resolve
from .monitor import ThroughputMonitor
from .partitions import row_bounds
from .policies import Policy, make_policies

#: shards per worker when ``n_shards`` is not given
SHARDS_PER_WORKER = 4


@dataclass
class ClockRecord:
    """What one clock did: its metrics, its wall time and where the work ran."""

    clock: int
    seconds: float
    metrics: dict[str, float]
    shards_per_worker: dict[str, int]
    timings: dict[str, dict[str, float]]  # per worker: data_s, pull_s, compute_s, push_s
    phase_s: dict[str, float]  # shards, apply, clock_end (wall, on the coordinator)
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)  # monitor: speed, straggler, batch_scale

    @property
    def objective(self) -> float:
        return self.metrics["objective"]


@dataclass
class FitResult:
    """Final parameters (host NumPy), per-clock history and the event log."""

    params: dict[str, np.ndarray]
    history: list[ClockRecord]
    events: list[dict[str, Any]]
    converged: bool
    seconds: float
    setup_seconds: float  # partitions created and data placed, before clock 1
    workers: list[str] = field(default_factory=list)

    @property
    def n_clocks(self) -> int:
        return len(self.history)

    @property
    def objective(self) -> float:
        return self.history[-1].objective if self.history else float("nan")

    def summary(self) -> str:
        last = self.history[-1].metrics if self.history else {}
        extra = " ".join(f"{k}={v:.3g}" for k, v in last.items() if k != "objective")
        return (
            f"{'converged' if self.converged else 'stopped'} after {self.n_clocks} clocks "
            f"in {self.seconds:.2f}s (setup {self.setup_seconds:.2f}s) on {len(self.workers)} worker(s): "
            f"objective={self.objective:.10g} {extra}".rstrip()
        )


def fit(
    algorithm: Algorithm,
    data: Any,
    cluster: "Cluster | str | Any | None" = None,
    *,
    n_workers: int = 2,
    n_shards: int | None = None,
    tol: float | None = None,
    max_clocks: int = 100,
    max_failures: int = 3,
    progress: bool | None = None,
    sharding: str = "dynamic",
    policies: "list[str | Policy] | None" = None,
    faults: "list[Fault] | tuple[Fault, ...]" = (),
    monitor: dict[str, Any] | None = None,
) -> FitResult:
    """Train ``algorithm`` on ``data`` on a Dask cluster.

    ``data``: a dict of row-aligned NumPy / SciPy sparse arrays, a ``FileData``,
    or a directory path / fsspec URL. ``cluster``: None (an embedded LocalCluster
    of ``n_workers`` processes, closed afterwards), a scheduler address, a
    ``distributed.Client`` or a ``dscar.Cluster``. Stops when the algorithm's
    ``converged(history, tol)`` holds or after ``max_clocks`` clocks.

    Stragglers: ``sharding="dynamic"`` (workers pull shards; the default) or
    ``"static"`` (each worker keeps its own shards: the BSP baseline);
    ``policies``: names or ``dscar.policies.Policy`` objects (``"backup"``,
    ``"adaptive"``, ``"restart"``; None for the defaults, ``[]`` for none);
    ``monitor``: ``ThroughputMonitor`` options (window, fraction,
    persistent_after). ``faults``: ``dscar.faults.slow / kill / hang`` specs.
    """
    if not isinstance(algorithm, Algorithm):
        raise InvalidInputError(f"algorithm must be a dscar.Algorithm, not {type(algorithm).__name__}")
    if max_clocks < 1:
        raise InvalidInputError(f"max_clocks must be >= 1, got {max_clocks}")
    tol = float(getattr(algorithm, "tol", 1e-6) if tol is None else tol)
    if not tol > 0:
        raise InvalidInputError(f"tol must be > 0, got {tol}")
    if cluster is None and n_workers < 1:
        raise InvalidInputError(f"n_workers must be >= 1, got {n_workers}")
    if sharding not in ("dynamic", "static"):
        raise InvalidInputError(f"sharding must be 'dynamic' or 'static', not {sharding!r}")
    policy_objs = make_policies(policies)
    try:
        ThroughputMonitor(**(monitor or {}))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"bad monitor options {monitor!r}: {e}") from None
    faults = list(faults)

    owned = cluster is None
    cl = None if owned else Cluster(cluster)
    try:
        n_live = n_workers if owned else len(cl.wait_for_workers(1))
        if n_shards is None and not isinstance(data, FileData):
            n_shards = SHARDS_PER_WORKER * n_live
            rows = _n_rows(data)
            if rows is not None:
                n_shards = max(n_live, min(n_shards, rows))
        d = as_data(data, n_shards)
        if d.meta.n_shards < n_live:
            raise InvalidInputError(
                f"{d.meta.n_shards} shard(s) for {n_live} workers: give at least one shard per worker"
            )
        algorithm.validate(d.meta)
        tables = [_resolve_parts(t, n_live) for t in algorithm.tables(d.meta)]
        if all(isinstance(f, Fault) and isinstance(f.worker, int) for f in faults):
            resolve(faults, [f"worker {i}" for i in range(n_live)])  # checked before a cluster starts
        if owned:
            cl = Cluster(None, n_workers=n_workers)
            cl.wait_for_workers(n_workers)
        run = _Run(cl, algorithm, d, tables, tol, max_failures)
        run.options = {"sharding": sharding, "policies": policy_objs, "faults": faults, "monitor": dict(monitor or {})}
        return run.run(max_clocks, progress)
    finally:
        if owned and cl is not None:
            cl.close()


def _n_rows(data: Any) -> int | None:
    if isinstance(data, dict) and data:
        first = next(iter(data.values()))
        shape = getattr(first, "shape", None)
        if shape:
            return int(shape[0])
    return None


def _resolve_parts(t: TableSpec, n_workers: int) -> TableSpec:
    n_parts = t.n_parts if t.n_parts is not None else n_workers
    return replace(t, n_parts=max(1, min(n_parts, t.n_rows)))


class _Run:
    """One fit on a connected cluster."""

    options: dict[str, Any] = {"sharding": "dynamic", "policies": [], "faults": [], "monitor": {}}

    def __init__(self, cl: Cluster, algorithm: Algorithm, data: ArrayData | FileData,
                 tables: list[TableSpec], tol: float, max_failures: int):
        self.cl, self.client = cl, cl.client
        self.algorithm, self.data, self.tables, self.tol = algorithm, data, tables, tol
        self.max_failures = max_failures
        self.job_id = f"{algorithm.name}-{uuid.uuid4().hex[:10]}"
        self.events: list[dict[str, Any]] = []  # the coordinator's, then the driver's own
        self._seen = 0  # how many of the coordinator's events are in self.events

    def _sync(self, fn, *args, **kw):
        return self.client.sync(fn, *args, **kw)

    def run(self, max_clocks: int, progress: bool | None) -> FitResult:
        t_start = time.perf_counter()
        opts = self.options
        faults = resolve(opts["faults"], self.cl.workers)
        spec = dumps({
            "algorithm": self.algorithm, "meta": self.data.meta, "tables": self.tables,
            "loader": self.data.loader(), "tol": self.tol, "faults": faults,
        })
        r = self._sync(
            self.client.scheduler.dscar_start_job, job_id=self.job_id, spec=spec,
            n_shards=self.data.meta.n_shards, reloadable=self.data.reloadable,
            tables=[[t.name, t.n_rows, t.n_parts] for t in self.tables], max_failures=self.max_failures,
            sharding=opts["sharding"], policies=dumps(opts["policies"]), monitor=opts["monitor"],
        )
        if r["status"] == "busy":
            raise ClusterError(f"the cluster is running another dscar job ({', '.join(r['jobs'])})")
        if r["status"] != "OK":
            raise ClusterError("the cluster has no workers")
        self.workers = list(r["workers"])
        try:
            self._sync(self._init_partitions, r["owners"])
            n, w = self.data.meta.n_shards, self.workers
            plan = [(i, w[i * len(w) // n]) for i in range(n)]  # contiguous blocks of shards
            if isinstance(self.data, ArrayData):
                self._sync(self._place, plan)
            elif opts["sharding"] == "static":  # workers read their own shards' files
                self._sync(self.client.scheduler.dscar_placed, job_id=self.job_id, placements=[list(p) for p in plan])
            setup_s = time.perf_counter() - t_start
            history, converged = self._clocks(max_clocks, progress)
            params = self._sync(self._gather)
        finally:
            try:
                r = self._sync(self.client.scheduler.dscar_end_job, job_id=self.job_id)
                self._take_events(r)
            except Exception:
                pass
            for w in self.cl.workers:
                try:
                    self._sync(self.client.rpc(w).dscar_end_job, job_id=self.job_id)
                except Exception:
                    pass
        self.events.sort(key=lambda e: e["time"])
        return FitResult(params, history, self.events, converged,
                         time.perf_counter() - t_start, setup_s, self.workers)

    def _take_events(self, reply: dict) -> None:
        new = list(reply.get("events", ()))
        if reply.get("all_events"):
            new = new[self._seen :]
        self.events.extend(new)
        self._seen += len(new)

    async def _init_partitions(self, owners_msg: list) -> None:
        by_owner: dict[str, list] = {}
        for t, p, w in owners_msg:
            by_owner.setdefault(w, []).append([t, p])
        await asyncio.gather(*(
            self.client.rpc(w).dscar_init(job_id=self.job_id, parts=parts) for w, parts in by_owner.items()
        ))

    async def _place(self, placements: list[tuple[int, str]]) -> None:
        """Send shards from the driver's arrays to workers (a few at a time)."""
        sem = asyncio.Semaphore(4)

        async def send(shard: int, worker: str) -> None:
            async with sem:
                arrays = {k: to_serialize(v) for k, v in self.data.shard(shard).items()}
                await self.client.rpc(worker).dscar_put_shard(job_id=self.job_id, shard=shard, arrays=arrays)

        await asyncio.gather(*(send(s, w) for s, w in placements))
        await self.client.scheduler.dscar_placed(job_id=self.job_id, placements=[[s, w] for s, w in placements])

    async def _replace(self, shards: list[int]) -> None:
        info = await self.client.scheduler.identity()
        live = sorted(info["workers"])
        if not live:
            raise ClusterError("no live worker left to hold the data shards")
        self.events.append({"time": time.time(), "kind": "shards-replaced", "shards": list(shards)})
        await self._place([(s, live[i % len(live)]) for i, s in enumerate(shards)])

    def _clocks(self, max_clocks: int, progress: bool | None) -> tuple[list[ClockRecord], bool]:
        from tqdm.auto import tqdm

        show = sys.stderr.isatty() if progress is None else progress
        bar = tqdm(total=max_clocks, desc=f"dscar {self.algorithm.name}", unit="clock", disable=not show, leave=False)
        history: list[ClockRecord] = []
        metrics_hist: list[dict[str, float]] = []
        converged = False
        sched = self.client.scheduler
        try:
            for clock in range(1, max_clocks + 1):
                t0 = time.perf_counter()
                r = self._sync(sched.dscar_begin_clock, job_id=self.job_id, clock=clock)
                if r["status"] != "OK":
                    raise JobFailedError(r.get("error") or "the job failed")
                while True:
                    r = self._sync(sched.dscar_wait, job_id=self.job_id, clock=clock, timeout=1.0,
                                   events_from=self._seen)
                    self._take_events(r)
                    if r["status"] == "done":
                        break
                    if r["status"] == "failed":
                        raise JobFailedError(r["error"])
                    if r["status"] == "place":
                        self._sync(self._replace, list(r["shards"]))
                rec = ClockRecord(clock, time.perf_counter() - t0, dict(r["metrics"]),
                                  dict(r["shards_per_worker"]), dict(r["timings"]), dict(r["phase_s"]),
                                  dict(r.get("workers", {})))
                history.append(rec)
                metrics_hist.append(rec.metrics)
                bar.update(1)
                bar.set_postfix(objective=f"{rec.objective:.6g}")
                if self.algorithm.converged(metrics_hist, self.tol):
                    converged = True
                    break
        finally:
            bar.close()
        return history, converged

    async def _gather(self) -> dict[str, np.ndarray]:
        owners = await self.client.scheduler.dscar_owners(job_id=self.job_id)
        owner = {(t, int(p)): w for t, p, w in owners}
        out = {}
        for t in self.tables:
            if t.kind != "param":
                continue
            parts = await asyncio.gather(*(
                self.client.rpc(owner[(t.name, p)]).dscar_pull(job_id=self.job_id, table=t.name, part=p, lo=0, hi=b - a)
                for p, (a, b) in enumerate(row_bounds(t.n_rows, t.n_parts))
            ))
            out[t.name] = np.concatenate([np.asarray(r["data"]) for r in parts])
        return out
