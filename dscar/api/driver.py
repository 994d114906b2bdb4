"""The driver: ``fit`` runs in the user's process and steers clocks.

It validates everything it can before any work starts, starts the job on the
coordinator, creates the partitions on their owners, places the data shards,
then runs clocks: begin, wait for the coordinator's report, ask the algorithm
whether it converged. Under BSP with a folded clock end the stopping rule is
evaluated there and the coordinator begins the next clock itself
(``dscar.auto-begin``): the driver then only reads each clock's report, off the
clocks' critical path. Parameter bytes go worker -> driver only once, at the
end, for the result.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import dask.config
import numpy as np
import scipy.sparse as sp
from dask.utils import parse_timedelta
from distributed.comm.core import CommClosedError
from distributed.protocol import to_serialize
from distributed.protocol.pickle import dumps

from .. import checkpoint as ckpt
from . import report, results
from ..core import active_set, shard_count
from .. import validation, wire
from ..algorithm import Algorithm, TableSpec
from .cluster import Cluster, default_memory_limit
from ..comm import call_local, fast_fail_pool, local_scheduler_handler
from .data import ArrayData, FileData, PhasedData, as_data, is_dask
from ..errors import ClusterError, DscarError, InvalidInputError, JobFailedError
from ..faults import Fault, fire_point, resolve, unfired, why_unfired
from ..core.apply_plan import INLINE_BYTES
from ..core.ledger import cut_refusal, restore_candidates
from ..core.membership import new_token
from ..core.monitor import ThroughputMonitor
from ..core.partitions import PartitionMap, by_owner
from ..core.policies import Policy, make_policies
from .progress import ProgressLine
from ..core.protocol import handler_name

logger = logging.getLogger("dscar.driver")

#: seconds one shard's placement on a worker may take before that worker is passed over
PLACE_TIMEOUT_S = 60.0
#: seconds a worker may take to set up its partitions (``init``) or kernels (``warm_up``)
SETUP_TIMEOUT_S = 300.0
#: setup calls (``init``, ``warm_up``) in flight at once: a call to each of hundreds of workers at
#: once opens as many connections together; on a loaded machine connects then time out (``dscar.comm``:
#: 3 s), and each such call waits out SETUP_TIMEOUT_S for a loss that never comes (bench.hollow, 256
#: workers, load average 20: setup stuck over 300 s; 32 at a time: 47-72 s)
SETUP_CONCURRENCY = 32
#: seconds each long poll on a worker's loss lasts (a call that ended leaves its poll on the
#: scheduler, woken by every change, until then)
LOSS_POLL_S = 2.0
#: gathering the model at the end: attempts (an owner may die under it) and the pause between them
GATHER_ATTEMPTS = 5
GATHER_RETRY_S = 0.5
#: ``dscar.report-linger``'s default: a driver of 4 ms clocks wakes about once for 5 (a wake costs the
#: process that hosts the embedded scheduler ~0.2 ms of CPU), and a report reaches it 20 ms late at most
REPORT_LINGER_S = 0.02
#: the longest ``dscar.report-linger`` (the driver's ask times out after 1 s)
MAX_REPORT_LINGER_S = 0.5


@dataclass
class ClockRecord:
    """What one clock did: its metrics, its wall time and where the work ran."""

    clock: int
    #: wall seconds in the driver from its begin_clock to the report; where the coordinator began this clock
    #: itself (``dscar.auto-begin``), on the coordinator from the previous clock's finish to this one's
    #: (the driver may read several reports at once: ``dscar.report-linger``)
    seconds: float
    metrics: dict[str, float]
    shards_per_worker: dict[str, int]
    #: per worker, summed over its attempts: data_s, pull_s, compute_s, push_s (wall seconds) and
    #: compute_cpu_s (the runner thread's CPU in compute_s: less while a step waits, for a core, the GIL
    #: or a GPU)
    timings: dict[str, dict[str, float]]
    #: wall seconds per stage on the coordinator: rebuild, shards, apply, clock_end (and per data
    #: phase: "shards:<phase>", "apply:<phase>"); clock_end_compute is the algorithm's own work
    stage_s: dict[str, float]
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)  # monitor: speed, straggler, batch_scale
    #: a loss cut the clock short: no clock-end step ran, metrics are {"objective": nan, "skipped": 1}
    skipped: bool = False
    #: with a checkpoint store: the newest complete checkpoint's ``age`` (clocks), the
    #: ``rework_estimate`` of a loss now (clocks, ``dscar.core.intervals``) and the ``period`` in force
    checkpoint: dict[str, float] | None = None
    #: under SSP: shard updates of later clocks already applied when this clock ended (how far
    #: fast workers ran ahead instead of waiting at its barrier); 0 under BSP
    ahead: int = 0

    @property
    def objective(self) -> float:
        return self.metrics["objective"]

    @property
    def phase_s(self) -> dict[str, float]:
        """Old name of ``stage_s``."""
        return self.stage_s


@dataclass
class FitResult:
    """Final parameters (host NumPy), per-clock history and the event log."""

    params: dict[str, np.ndarray]  # Dask arrays for tables over fit's result_budget (kept on the cluster)
    history: list[ClockRecord]
    events: list[dict[str, Any]]
    converged: bool
    seconds: float
    setup_seconds: float  # partitions created and data placed, before clock 1
    workers: list[str] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # published: version, clock, bytes, path

    @property
    def checkpoint_bytes(self) -> int:
        return sum(c["bytes"] for c in self.checkpoints)

    @property
    def active_workers(self) -> int:
        """How many workers were active at the end (``dscar.active-workers``: the last ``active-workers``
        event says how many and why; without one, every worker)."""
        for e in reversed(self.events):
            if e.get("kind") == "active-workers":
                return int(e["active"])
        return len(self.workers)

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
            f"in {self.seconds:.2f}s (setup {self.setup_seconds:.2f}s) on {report.workers_phrase(self.events, self.workers)}: "
            f"objective={self.objective:.10g} {extra}".rstrip()
        )

    def save(self, path: str, *, storage_options: dict | None = None) -> None:
        """Write this result (tables, history, events) to ``path``, a directory or an fsspec URL, as
        arrays and JSON (no pickle); ``FitResult.load(path)`` reads it back."""
        results.save_result(self, path, storage_options)

    @classmethod
    def load(cls, path: str, *, storage_options: dict | None = None) -> "FitResult":
        return results.load_result(path, storage_options)

    def event_lines(self, hide: "tuple[str, ...]" = ()) -> list[str]:
        """The events as lines a person reads: in order, times since the start, repeats grouped."""
        return report.event_lines(self.events, hide=hide)

    def events_frame(self):
        """The events as a ``pandas.DataFrame`` (pandas needed), one row each; see ``dscar.api.report``."""
        return report.events_frame(self.events)

    def plot(self, ax=None):
        """The objective per clock with losses, recoveries, checkpoints and stragglers marked (matplotlib
        needed: the ``plot`` extra); returns the figure. See ``dscar.api.plot.plot_fit``."""
        from .plot import plot_fit

        return plot_fit(self, ax=ax)


def inline_bytes() -> int:
    """``dscar.apply-inline-bytes`` as set where the fit is called: the limit below which an attempt's
    updates ride its commit (``apply_plan.rides_commit``). The job's spec carries it to the workers,
    whose own processes do not see a setting made in the user's."""
    return validation.integer("dscar.apply-inline-bytes", dask.config.get("dscar.apply-inline-bytes", INLINE_BYTES), 0)


def _read_ahead(read_ahead: dict[int, dict], clock: int, answer: dict) -> None:
    """Keep the reports an answer of the coordinator brought after ``clock``'s (its ``more``), by clock; their
    events and checkpoints to publish came with the answer."""
    for i, report in enumerate(answer.get("more", ())):
        read_ahead[clock + 1 + i] = {**report, "events": [], "publish": []}


def report_linger() -> float:
    """``dscar.report-linger`` (seconds, or a Dask time string such as "20ms"): how long the coordinator
    holds the driver's ask for a clock's report, where it begins the next clocks itself, so that one answer
    brings the reports of the clocks that finished meanwhile (``Coordinator._h_wait``). 0: one a clock."""
    value = dask.config.get("dscar.report-linger", REPORT_LINGER_S)
    try:
        seconds = parse_timedelta(value, default="seconds")
    except (TypeError, ValueError, KeyError):
        seconds = None
    if seconds is None or not 0 <= seconds <= MAX_REPORT_LINGER_S:
        raise InvalidInputError(f"dscar.report-linger must be a duration from 0 to {MAX_REPORT_LINGER_S} s, "
                                f"not {value!r}")
    return float(seconds)


def elastic_workers() -> int | None:
    """The user's cap on the workers a fit asks Dask's adaptive scaling for (``dscar.core.elastic-workers``;
    None: one per shard, ``dscar.core.elastic.workers_wanted``)."""
    value = dask.config.get("dscar.core.elastic-workers", None)
    if value is not None and (type(value) is not int or value < 0):
        raise InvalidInputError(f"dscar.core.elastic-workers must be a whole number >= 0 or None, not {value!r}")
    return value


def active_workers() -> tuple[str, int]:
    """How many of the cluster's workers a fit keeps active (``dscar.active-workers``: "auto", the
    default, decides from the data's size and the first clock's costs, ``dscar.core.active_set``; "all")
    and the fewest it keeps (``dscar.active-workers-min``, a whole number >= 1)."""
    mode = dask.config.get("dscar.active-workers", "auto")
    if mode not in active_set.MODES:
        raise InvalidInputError(f"dscar.active-workers must be one of {', '.join(map(repr, active_set.MODES))}, "
                                f"not {mode!r}")
    least = dask.config.get("dscar.active-workers-min", 1)
    if type(least) is not int or least < 1:
        raise InvalidInputError(f"dscar.active-workers-min must be a whole number >= 1, not {least!r}")
    return mode, least


def active_start(n_workers: int, data: Any, consistency: str = "bsp", sharding: str = "dynamic") -> int:
    """How many of ``n_workers`` a fit of ``data`` starts on (``active_set.initial_count`` from the
    data's bytes; all of them under ``dscar.active-workers`` "all", SSP or static sharding, which keep
    every worker active): the default shard count is chosen for them."""
    mode, least = active_workers()
    if mode != "auto" or consistency != "bsp" or sharding != "dynamic":
        return n_workers
    return active_set.initial_count(_data_bytes(data), least, n_workers)


def memory_floor(tables: list, n_workers: int, memory_limit: float | None) -> int:
    """The fewest workers whose memory holds the tables (``validation.check_table_memory``)."""
    for k in range(1, n_workers):
        try:
            validation.check_table_memory(tables, k, memory_limit)
            return k
        except InvalidInputError:
            continue
    return max(1, n_workers)


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
    checkpoint: "ckpt.CheckpointConfig | str | None" = None,
    resume: bool = False,
    result_budget: float | None = None,
    consistency: str = "bsp",
    staleness: int | None = None,
) -> FitResult:
    """Train ``algorithm`` on ``data`` on a Dask cluster.

    ``data``: a dict of row-aligned NumPy / SciPy sparse arrays, a ``FileData``,
    a directory path / fsspec URL, or a dict of Dask arrays / DataFrames / Series
    (persisted on the cluster; their row chunks are the shards, read by the workers). ``cluster``: None (an embedded LocalCluster
    of ``n_workers`` processes, closed afterwards), a scheduler address, a
    ``distributed.Client`` or a ``dscar.Cluster``. Stops when the algorithm's
    ``converged(history, tol)`` holds or after ``max_clocks`` clocks.

    Stragglers: ``sharding="dynamic"`` (workers pull shards; the default) or
    ``"static"`` (each worker keeps its own shards: the BSP baseline);
    ``policies``: names or ``dscar.core.policies.Policy`` objects (``"backup"``,
    ``"adaptive"``, ``"restart"``; None for the defaults, ``[]`` for none);
    ``monitor``: ``ThroughputMonitor`` options (window, fraction,
    persistent_after). ``faults``: ``dscar.faults.slow / kill / hang / lose`` specs.

    Failures: ``checkpoint`` (a ``CheckpointConfig`` or a directory / URL with
    the defaults: priority checkpoints, partial recovery) lets the job survive
    the loss of workers that own partitions; ``resume=True`` continues from the
    newest checkpoint in it (same model, same data).

    Consistency: ``"bsp"`` (the default: every shard of clock t is applied before clock t+1
    starts) or ``"ssp"``, stale-synchronous clocks: a shard may run up to ``staleness`` clocks
    ahead of the oldest unfinished clock, its update applied as soon as it commits, so a fast
    worker never waits at a clock's barrier (``staleness`` defaults to, and may not exceed, the
    algorithm's ``max_staleness``; algorithms with data phases run BSP only).

    Results: ``param`` tables come back as NumPy arrays; with ``result_budget`` (bytes), a
    table larger than that stays on the cluster as a Dask array backed by its partitions
    (on the workers that owned them; it needs a ``cluster`` that outlives the fit).
    """
    if not isinstance(algorithm, Algorithm):
        raise InvalidInputError(f"algorithm must be a dscar.Algorithm, not {type(algorithm).__name__}")
    o = validation.fit_options(n_workers=n_workers, n_shards=n_shards, tol=tol, max_clocks=max_clocks,
                               max_failures=max_failures, progress=progress, sharding=sharding, resume=resume)
    n_workers, n_shards, max_clocks, max_failures = o["n_workers"], o["n_shards"], o["max_clocks"], o["max_failures"]
    tol = validation.number("tol", getattr(algorithm, "tol", 1e-6) if tol is None else tol, 0.0, strict_min=True)
    policy_objs = make_policies(policies)
    consistency, staleness = validation.consistency(consistency, staleness, int(getattr(algorithm, "max_staleness", 0)),
                                                    type(algorithm).__name__, policy_objs)
    try:
        ThroughputMonitor(**(monitor or {}))
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"bad monitor options {monitor!r}: {e}") from None
    faults = list(faults)
    validation.fault_clocks(faults, max_clocks)
    elastic_workers()  # (bad settings are said before work starts)
    active_workers()
    report_linger()
    notes: list[dict] = []  # the driver's events from before the job starts
    temporary = ckpt.temporary_store() if checkpoint is None and not resume and ckpt.needs_store(faults) else None
    if temporary is not None:  # injected worker losses need checkpoints to recover from (removed at the end)
        checkpoint = temporary
        notes.append({"time": time.time(), "kind": "checkpoint-store-temporary", "path": temporary})
    if isinstance(checkpoint, str) or hasattr(checkpoint, "__fspath__"):
        checkpoint = ckpt.CheckpointConfig(str(checkpoint))
    if checkpoint is not None:
        if not isinstance(checkpoint, ckpt.CheckpointConfig):
            raise InvalidInputError(f"checkpoint must be a CheckpointConfig or a path/URL, not {type(checkpoint).__name__}")
        checkpoint.validate()
        ckpt.check_writable(checkpoint)
    elif resume:
        raise InvalidInputError("resume=True needs the checkpoint location to resume from")

    owned = cluster is None
    cl = None if owned else Cluster(cluster)
    try:
        if owned and is_dask(data):  # Dask collections are computed by the cluster that trains on them
            cl = Cluster(None, n_workers=n_workers)
            cl.wait_for_workers(n_workers)
        n_live = n_workers if owned else len(cl.wait_for_workers(1))
        # the default shard count is for the workers the fit starts on (``active_start``): the others stand by
        start = active_start(n_live, data, consistency, o["sharding"])
        need = n_live  # shards a phase needs: one per worker, or per starting worker for a default count
        if n_shards is None and not isinstance(data, FileData) and not is_dask(data):
            n_shards = default_n_shards(start, *_data_size(data), balancing=_balancing(o["sharding"], policy_objs),
                                        shards_cost_quality=bool(algorithm.shards_cost_quality))
            need = start
        d = as_data(data, n_shards, None if cl is None else cl.client)
        _check_phases(algorithm, d.meta)
        if consistency == "ssp" and d.meta.phases:
            raise InvalidInputError(f"{type(algorithm).__name__} runs data phases, which need BSP clocks "
                                    "(each phase reads the previous one's result): use consistency='bsp'")
        for name, k in d.meta.phases or (("", d.meta.n_shards),):
            if k < need:
                where = f" in data phase {name!r}" if name else ""
                raise InvalidInputError(f"{k} shard(s){where} for {n_live} workers: give at least one shard per worker")
        algorithm.validate(d.meta)
        tables = [_resolve_parts(t, n_live) for t in algorithm.tables(d.meta)]
        memory_limit = default_memory_limit(n_workers) if owned else cl.memory_limit
        validation.check_table_memory(tables, n_live, memory_limit)
        result_budget = validation.number("result_budget", result_budget, 0.0, optional=True)
        if owned and any(results.over_budget(t, result_budget) for t in tables):
            raise InvalidInputError("tables over result_budget stay on the cluster, so the cluster must outlive "
                                    "the fit: pass cluster= (a dscar.Cluster, a Client or an address)")
        resume_from = ckpt.find_resume(checkpoint, _model_info(algorithm, d.meta), tables, notes) if resume else None
        if resume_from is not None:
            for m in resume_from:  # (any of them may be the one that verifies)
                if (why := cut_refusal(m, d.meta.n_shards, consistency, staleness or 0)) is not None:
                    raise InvalidInputError(f"cannot resume from {checkpoint.url!r}: {why}")
            parts = {t: int(p) for t, _, p, _ in resume_from[0]["tables"]}
            tables = [replace(t, n_parts=parts[t.name]) for t in tables]
        if all(isinstance(f, Fault) and isinstance(f.worker, int) for f in faults):
            resolve(faults, [f"worker {i}" for i in range(n_live)])  # checked before a cluster starts
        if owned and cl is None:
            cl = Cluster(None, n_workers=n_workers)
            cl.wait_for_workers(n_workers)
        run = _Run(cl, algorithm, d, tables, tol, max_failures)
        run.events.extend(notes)
        run.options = {"consistency": consistency, "staleness": staleness,
                       "sharding": sharding, "policies": policy_objs, "faults": faults, "monitor": dict(monitor or {}),
                       "checkpoint": checkpoint, "resume": resume_from, "result_budget": result_budget,
                       "active_floor": memory_floor(tables, n_live, memory_limit),
                       "data_bytes": _data_bytes(data)}
        return run.run(max_clocks, progress)
    finally:
        if owned and cl is not None:
            cl.close()
        ckpt.remove_temporary(temporary)


def _undo_hangs(events: list[dict[str, Any]]) -> None:
    """Injected hangs (SIGSTOP) end with the job, however it ends: SIGCONT every stopped worker process
    of this machine (a worker process on another host is left to its Nanny)."""
    import os
    import signal
    import socket

    for e in events:
        pid, host = e.get("pid"), str(e.get("worker", ""))
        if e.get("kind") != "fault-hang" or not pid:
            continue
        local = any(h in host for h in ("127.0.0.1", "localhost", "inproc", socket.gethostname()))
        if local:
            try:
                os.kill(int(pid), signal.SIGCONT)
            except (OSError, ValueError):
                pass


def _model_info(algorithm: Algorithm, meta) -> dict[str, Any]:
    """What a checkpoint records to recognise its model on resume (JSON only)."""
    import json

    params = {}
    for k, v in algorithm.get_params().items():
        try:
            json.dumps(v)
            params[k] = v
        except TypeError:
            params[k] = repr(v)
    return {"name": algorithm.name, "class": f"{type(algorithm).__module__}.{type(algorithm).__qualname__}",
            "params": json.loads(json.dumps(params)),  # as a manifest gives them back (tuples -> lists)
            "n_rows": meta.n_rows, "shapes": {k: list(v) for k, v in meta.shapes.items()},
            "row_order": ckpt.row_order(algorithm, meta)}


def lost_contact(e: BaseException) -> bool:
    """``e`` says a call to the scheduler or a worker failed on the way (a closed comm, a refused or
    timed-out connection; distributed's connect raises a bare ``OSError`` without an errno), not that
    the called side failed (a worker's disk or file error passed on keeps its own type and errno)."""
    return (isinstance(e, (ConnectionError, CommClosedError, TimeoutError, asyncio.TimeoutError))
            or (type(e) is OSError and e.errno is None))


def default_n_shards(n_workers: int, n_rows: int | None, n_bytes: int | None, *, balancing: bool = True,
                     shards_cost_quality: bool = False) -> int:
    """The shard count of a fit not given ``n_shards``: ``dscar.core.shard_count`` decides (one per worker
    unless the data's step work makes more worth their cost and the fit can balance them)."""
    return shard_count.default_n_shards(n_workers, n_rows, n_bytes, balancing=balancing,
                                        shards_cost_quality=shards_cost_quality)


def _balancing(sharding: str, policies: list) -> bool:
    """Extra shards can even out the workers' load: dynamic sharding moves them, a backup redoes one."""
    return sharding == "dynamic" or any(getattr(p, "name", "") == "backup" for p in policies)


def _data_bytes(data: Any) -> int | None:
    """The bytes of the data the driver holds, every phase's (None: unknown, e.g. read by the workers)."""
    if isinstance(data, ArrayData):
        return _data_size(data.arrays)[1]
    if isinstance(data, PhasedData):
        data = data.parts
    if isinstance(data, dict) and data and all(isinstance(v, (dict, ArrayData)) for v in data.values()):
        sizes = [_data_bytes(part) for part in data.values()]
        return None if None in sizes else sum(sizes)
    return _data_size(data)[1]


def _data_size(data: Any) -> tuple[int | None, int | None]:
    """``(rows, bytes)`` of a dict of arrays (a sparse matrix counts its stored arrays); of a dict of
    phases, the fewest of each over the phases; None for what is unknown."""
    if not isinstance(data, dict) or not data:
        return None, None
    if isinstance(next(iter(data.values())), dict):
        rows, sizes = zip(*(_data_size(v) for v in data.values()))
        return (None if None in rows else min(rows)), (None if None in sizes else min(sizes))
    shape = getattr(next(iter(data.values())), "shape", None)
    total: int | None = 0
    for v in data.values():
        stored = [getattr(v, a, None) for a in ("data", "indices", "indptr", "row", "col")] if sp.issparse(v) else [v]
        sizes = [_nbytes(a) for a in stored if a is not None]
        if not sizes or None in sizes:
            total = None
            break
        total += sum(sizes)
    rows = shape[0] if shape else None
    return (int(rows) if isinstance(rows, (int, np.integer)) else None), total


def _nbytes(a: Any) -> int | None:
    """``a.nbytes`` where it is a known whole number; None for what is unknown without computing it
    (a Dask DataFrame raises NotImplementedError, a Dask array of unknown chunks gives nan)."""
    try:
        n = a.nbytes
    except Exception:  # noqa: BLE001 - any lazy collection that cannot say
        return None
    return int(n) if isinstance(n, (int, np.integer)) else None


def _check_phases(algorithm: Algorithm, meta) -> None:
    """The data has exactly the data phases the algorithm runs, in its order."""
    want = tuple(algorithm.phases)
    have = tuple(n for n, _ in meta.phases)
    if want != have:
        raise InvalidInputError(
            f"{algorithm.name} runs data phases {list(want) or 'none'} per clock, but the data has "
            f"{list(have) or 'none'}: give " + (
                "a dscar.PhasedData (or a dict of phase name -> dict of arrays) with one entry per phase, in order"
                if want else "one set of shards (a dict of arrays, ArrayData or FileData)")
        )


def _resolve_parts(t: TableSpec, n_workers: int) -> TableSpec:
    n_parts = t.n_parts if t.n_parts is not None else n_workers
    return replace(t, n_parts=max(1, min(n_parts, t.n_rows)))


class _Run:
    """One fit on a connected cluster."""

    options: dict[str, Any] = {"sharding": "dynamic", "policies": [], "faults": [], "monitor": {},
                               "checkpoint": None, "resume": None}

    def __init__(self, cl: Cluster, algorithm: Algorithm, data: ArrayData | FileData | PhasedData,
                 tables: list[TableSpec], tol: float, max_failures: int):
        self.cl, self.client = cl, cl.client
        self.algorithm, self.data, self.tables, self.tol = algorithm, data, tables, tol
        self.max_failures = max_failures
        self.job_id = f"{algorithm.name}-{uuid.uuid4().hex[:10]}"
        #: the job's token (``dscar.core.membership``): every call about the job carries it
        self.token = new_token()
        #: the background renewal of the job's lease (``_renew``), while the job runs
        self._renewing: asyncio.Future | None = None
        self.events: list[dict[str, Any]] = []  # the coordinator's, then the driver's own
        self._seen = 0  # how many of the coordinator's events are in self.events
        self.published: list[dict[str, Any]] = []
        self.model = _model_info(algorithm, data.meta)
        self._pool = None  # the driver's own connection pool to workers (``_worker``)
        #: when the last clock reported finished (its ``finished_at`` on the coordinator; else when its report came)
        self._last_report_at: float | None = None
        self._last_clock = 0  # the last clock reported (completed or skipped)

    def _sync(self, fn, *args, **kw):
        return self.client.sync(fn, *args, **kw)

    async def _worker(self, address: str):
        """An rpc to ``address`` through the driver's own pool: a worker that just died fails a
        message in seconds (``dscar.comm``), not after distributed's 30 s connect timeout."""
        if self._pool is None:
            self._pool = fast_fail_pool(self.client.connection_args)
            await self._pool.start()
        return self._pool(address)

    async def _call_worker(self, address: str, op: str, **kw) -> Any:
        return await getattr(await self._worker(address), handler_name(op))(token=self.token, **kw)

    async def _scall(self, op: str, **kw) -> Any:
        """The coordinator's handler ``dscar_<op>`` about this job (with its token: it renews the lease); on an
        embedded cluster's scheduler, which runs on the client's event loop, called directly (``call_local``)."""
        name = handler_name(op)
        local = local_scheduler_handler(self.client, name)
        if local is not None:
            return await call_local(local, self.client.scheduler.address, job_id=self.job_id, token=self.token, **kw)
        return await getattr(self.client.scheduler, name)(job_id=self.job_id, token=self.token, **kw)

    async def _start_renewing(self, lease_s: float) -> None:
        self._renewing = asyncio.ensure_future(self._renew(lease_s / 3))

    async def _renew(self, every_s: float) -> None:
        """Renew the job's lease every ``every_s`` seconds for as long as the job runs, on the
        client's event loop: while the driver's own thread sets up partitions, places data,
        publishes checkpoints or gathers the model, between its calls to the coordinator (each of
        which renews the lease too). A failed renewal is retried at the next period."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self._scall("renew")
            except Exception as e:
                logger.debug("renewing the lease of job %s: %r", self.job_id, e)

    async def _call_unless_lost(self, address: str, op: str, timeout: float, **kw) -> tuple[str, Any]:
        """``op`` on a worker, raced against the coordinator counting it lost to the job (a hung
        worker accepts the connection and never answers; a dead one's call fails before the
        coordinator hears of it): ``("ok", answer)``, ``("lost", None)``, or ``("failed", error)``
        when the call failed on the way or took over ``timeout`` s and the worker was not lost.
        An error the worker raised is raised."""
        async def until_lost() -> dict:
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                r = await self._scall("until_lost", workers=[address], timeout=min(left, LOSS_POLL_S))
                if r["lost"] or r.get("ended"):  # (the job ended: nothing more to wait for)
                    return r
            return {"lost": []}

        call = asyncio.ensure_future(asyncio.wait_for(self._call_worker(address, op, **kw), timeout))
        watch = asyncio.ensure_future(until_lost())
        try:
            await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done() and watch.exception() is not None:
                await asyncio.wait({call})  # the watch itself failed: the deadline decides
            if call.done():
                try:
                    return "ok", call.result()
                except (OSError, asyncio.TimeoutError) as e:
                    if not lost_contact(e):
                        raise
                    error: BaseException = e
                await asyncio.wait({watch})  # a dead worker: the coordinator hears of it within moments
            else:
                call.cancel()
                error = asyncio.TimeoutError(f"{op} on {address}: no answer in {timeout:g} s")
            lost = watch.exception() is None and bool(watch.result()["lost"])
            return ("lost", None) if lost else ("failed", error)
        finally:
            call.cancel()
            watch.cancel()

    def run(self, max_clocks: int, progress: bool | None) -> FitResult:
        t_start = time.perf_counter()
        opts = self.options
        faults = resolve(opts["faults"], self.cl.workers)
        spec = dumps({
            "algorithm": self.algorithm, "meta": self.data.meta, "tables": self.tables,
            "loader": self.data.loader(), "tol": self.tol, "faults": faults, "consistency": opts["consistency"],
            "token": self.token, "inline_bytes": inline_bytes(),
        })
        cfg, resume = opts["checkpoint"], opts["resume"]  # resume: candidate manifests, newest first
        r = self._sync(
            self._scall, "start_job", spec=spec, model=self.algorithm.name,
            n_shards=self.data.meta.n_shards, reloadable=self.data.reloadable,
            tables=[[t.name, t.n_rows, t.n_parts, t.kind] for t in self.tables], max_failures=self.max_failures,
            sharding=opts["sharding"], policies=dumps(opts["policies"]), monitor=opts["monitor"],
            checkpoint=None if cfg is None else cfg.to_msg(), rebuild=list(self.algorithm.rebuild_tables()),
            resume=None if resume is None else resume[0], phases=[list(p) for p in self.data.meta.phases] or None,
            consistency=opts["consistency"], staleness=opts["staleness"], max_clocks=max_clocks,
            shard_bounds=[list(b) for b in self.data.meta.shard_bounds], elastic_workers=elastic_workers(),
            active_workers=active_workers()[0], data_bytes=opts.get("data_bytes"),
            active_floor=max(active_workers()[1], opts.get("active_floor", 1)),
        )
        if r["status"] == "busy":
            raise ClusterError(f"the cluster is running another dscar job ({', '.join(r['jobs'])})")
        if r["status"] != "OK":
            raise ClusterError("the cluster has no workers")
        self.workers = list(r["workers"])
        self._sync(self._start_renewing, float(r["lease"]))
        failure: DscarError | None = None
        finished = False  # the clocks ran and the model was gathered (an unexpected error leaves it False)
        from ..scheduler.dashboard import page_url

        if url := page_url(self.client):
            logger.info("dashboard page of job %s: %s", self.job_id, url)
        try:
            resume = self._sync(self._init_partitions, r["owners"], resume)
            plan = [(int(s), w) for s, w in r["plan"]]  # the coordinator's: data-row tables were owned by it
            if isinstance(self.data, (ArrayData, PhasedData)):
                self._sync(self._place, plan)
            elif opts["sharding"] == "static":  # workers read their own shards' files
                self._sync(self._scall, "placed", placements=[list(p) for p in plan])
            setup_s = time.perf_counter() - t_start
            first = 1 if resume is None else int(resume["clock"]) + 1
            history, converged = self._clocks(first, max_clocks, progress)
            if opts["consistency"] == "ssp":  # later clocks may be running: stop them, let the tables settle
                r = self._sync(self._scall, "stop", clock=self._last_clock or first - 1)
                if r["status"] == "failed":
                    raise JobFailedError(r.get("error") or "the job failed")
            if cfg is not None:  # the last checkpoint's files may still be being written: finish them first,
                # so an owner lost during the gather is restored from the newest checkpoint
                self._publish(self._sync(self._scall, "flush")["publish"])
            params = self._sync(self._gather)
            finished = True
        except DscarError as e:
            failure = e
            raise
        except Exception as e:
            if not lost_contact(e):
                raise
            failure = ClusterError(f"lost contact with the cluster: {type(e).__name__}: {e}")
            raise failure from e
        finally:
            self._sync(self._end_job)
            if finished:
                self._note_late_recovery(self._last_clock)
            _undo_hangs(self.events)
            self.events.sort(key=lambda e: e["time"])
            self._note_unfired(faults)
            if failure is not None:  # what led to the failure, for a post-mortem
                failure.events = list(self.events)
        return FitResult(params, history, self.events, converged,
                         time.perf_counter() - t_start, setup_s, self.workers, self.published)

    def _note_late_recovery(self, last_clock: int) -> None:
        """A worker lost after the last clock's report (while the checkpoints were flushed or the
        model gathered) was recovered before the gather: the model returned is the restored one,
        not the last clock's. Say so (a ``model-restored`` event and a warning): it may lag."""
        after = self._last_report_at
        lost = sorted({e["worker"] for e in self.events
                       if e.get("kind") == "worker-lost" and after is not None and e.get("time", 0.0) > after})
        if lost:
            logger.warning("worker(s) %s lost after the last clock: the model returned is the one "
                           "recovery restored from the checkpoints", ", ".join(lost))
            self.events.append({"time": time.time(), "clock": last_clock, "kind": "model-restored",
                                "workers": lost})

    def _note_unfired(self, faults: list[Fault]) -> None:
        """Injected faults that never fired: an ``unfired-fault`` event and a warning each, with why."""
        for f in unfired(faults, self.events):
            why = why_unfired(f, self.events, self._last_clock)
            logger.warning("the %s fault aimed at %s from clock %d never fired: %s", f.kind, f.worker, f.clock, why)
            self.events.append({"time": time.time(), "clock": self._last_clock, "kind": "unfired-fault",
                                "worker": f.worker, "fault": f.kind, "fault_clock": f.clock, "point": fire_point(f),
                                "reason": why})

    async def _end_job(self) -> None:
        """The coordinator drops the job (its last events come back), then every worker at once.

        The workers are the scheduler's as the coordinator answers: the client's own list, read
        from inside its event loop, is a cached one that may still hold a worker lost minutes ago,
        and a message to it waits out the connect timeout (3 s a fit that lost an in-process worker)."""
        workers = None
        if self._renewing is not None:
            self._renewing.cancel()
        try:
            reply = await self._scall("end_job")
            self._take_events(reply)
            workers = reply.get("workers")
        except Exception:
            pass
        await asyncio.gather(*(self._call_worker(w, "end_job", job_id=self.job_id)
                               for w in (self.cl.workers if workers is None else workers)),
                             return_exceptions=True)
        if self._pool is not None:
            await self._pool.close()

    def _take_events(self, reply: dict) -> None:
        new = list(reply.get("events", ()))
        if reply.get("all_events"):  # (the log from its index ``first_event`` on: the older ones are here already)
            new = new[max(0, self._seen - int(reply.get("first_event", 0))):]
        self.events.extend(new)
        self._seen += len(new)
        for e in new:
            if e.get("kind") == "job-stalled":  # said here too: the scheduler's log may be another machine's
                where = {w: " > ".join(frames[-3:]) for w, frames in e.get("stacks", {}).items() if frames}
                logger.warning("job %s has not moved on for %.1f s at clock %s (%s; attempts running: %s; "
                               "runner threads at: %s)", self.job_id, e["stalled_s"], e["clock"], e["stage"],
                               e.get("running"), where)

    async def _init_partitions(self, owners_msg: list, resume: list[dict] | None) -> dict | None:
        """Initial values on every owner, kernels loaded on every worker; when resuming, the newest
        checkpoint that verifies (returned)."""
        kinds = {t.name: t.kind for t in self.tables}
        owners = PartitionMap.owners_from_msg(owners_msg)
        restored = {k for k in owners if resume is not None and kinds[k[0]] == "param"}  # from the checkpoint
        restore = [(t, p, owners[(t, p)]) for t, p in restored]
        fresh = by_owner(owners, [k for k in owners if k not in restored])
        # an owner lost meanwhile is the coordinator's: it restores those partitions (checkpoint 0) or
        # fails the job, as for a loss in any clock; one that neither answers nor is lost is an error
        sem = asyncio.Semaphore(SETUP_CONCURRENCY)

        async def setup(w: str, op: str, **kw) -> tuple[str, Any]:
            async with sem:
                return await self._call_unless_lost(w, op, SETUP_TIMEOUT_S, job_id=self.job_id, **kw)

        inits = await asyncio.gather(*(setup(w, "init", parts=parts) for w, parts in fresh.items()))
        for w, (outcome, err) in zip(fresh, inits):
            if outcome == "failed":
                raise ClusterError(f"worker {w} did not set up its partitions: {type(err).__name__}: {err}")
        # kernels loaded everywhere before clock 1; a worker lost meanwhile is the clocks' business
        await asyncio.gather(*(setup(w, "warm_up") for w in self.workers), return_exceptions=True)
        if resume is None:
            return None
        cfg = self.options["checkpoint"]
        for m in resume:
            results = await asyncio.gather(*(
                self._call_worker(w, "restore", job_id=self.job_id, table=t, part=p,
                                  chain=restore_candidates([m], t, p)[0][1],
                                  url=cfg.url, storage_options=cfg.storage_options)
                for t, p, w in restore
            ))
            bad = [r.get("error") for r in results if r["status"] != "OK"]
            if not bad:
                self.events.append({"time": time.time(), "clock": m["clock"], "kind": "resumed", "version": m["version"]})
                if m is not resume[0]:  # the coordinator's chains continue from this one
                    await self._scall("rebase", manifest=m)
                return m
            self.events.append({"time": time.time(), "clock": m["clock"], "kind": "checkpoint-corrupt",
                                "version": m["version"], "error": bad[0]})
        raise ckpt.CorruptCheckpointError(f"cannot resume from {cfg.url!r}: no checkpoint verifies")

    def _publish(self, manifests: list[dict]) -> None:
        """Make checkpoints visible: write each manifest atomically, apply retention, tell the coordinator."""
        cfg = self.options["checkpoint"]
        if not manifests or cfg is None:
            return
        fs, root = ckpt.fs_and_root(cfg.url, cfg.storage_options)
        done = {c["version"] for c in self.published}
        for m in sorted(manifests, key=lambda m: m["version"]):
            if m["version"] in done:
                continue
            m = dict(m, model=self.model)
            path, refused = None, []
            try:
                try:
                    path = ckpt.publish(fs, root, m)
                except ckpt.CorruptCheckpointError as e:  # its name is a link: the version stays unpublished
                    refused.append(str(e))
                ckpt.retain(fs, root, cfg.keep, refused)
            except OSError as e:  # the store, not the cluster: say so (and which checkpoint)
                raise JobFailedError(f"publishing checkpoint version {m['version']} to {cfg.url} failed: "
                                     f"{type(e).__name__}: {e}") from e
            told = {e.get("error") for e in self.events if e["kind"] == "checkpoint-corrupt"}
            self.events.extend({"time": time.time(), "clock": m["clock"], "kind": "checkpoint-corrupt", "error": r}
                               for r in refused if r not in told)  # a link retention leaves alone: said once
            if path is None:
                continue
            self._sync(self._scall, "published", version=m["version"])
            self.published.append({"version": m["version"], "clock": m["clock"], "bytes": m["bytes"], "path": path})

    async def _place(self, placements: list[tuple[int, str]]) -> None:
        """Send shards from the driver's arrays to workers (a few at a time).

        A worker that dies under a placement is skipped: its shards are reported to the
        coordinator as unplaced and asked for again (``place``) like any lost worker's."""
        sem = asyncio.Semaphore(4)

        async def send(shard: int, worker: str) -> bool:
            async with sem:
                arrays = {k: to_serialize(v) for k, v in self.data.shard(shard).items()}
                outcome, _ = await self._call_unless_lost(worker, "put_shard", PLACE_TIMEOUT_S, job_id=self.job_id,
                                                          shard=shard, arrays=arrays)
                return outcome == "ok"

        ok = await asyncio.gather(*(send(s, w) for s, w in placements))
        await self._scall("placed", placements=[[s, w] for (s, w), k in zip(placements, ok) if k])

    async def _replace(self, shards: list[int], live: list[str]) -> None:
        """Place ``shards`` again, round robin over the job's ``live`` workers (as the coordinator
        counts them: a worker lost to the job may still be in the cluster)."""
        if not live:
            raise ClusterError("no live worker left to hold the data shards")
        self.events.append({"time": time.time(), "kind": "shards-replaced", "shards": list(shards)})
        await self._place([(s, live[i % len(live)]) for i, s in enumerate(shards)])

    def _clocks(self, first: int, max_clocks: int, progress: bool | None) -> tuple[list[ClockRecord], bool]:
        from tqdm.auto import tqdm

        show = sys.stderr.isatty() if progress is None else progress
        bar = tqdm(total=max_clocks, desc=f"dscar {self.algorithm.name}", unit="clock", disable=not show, leave=False)
        line = ProgressLine()
        history: list[ClockRecord] = []
        metrics_hist: list[dict[str, float]] = []
        converged = False
        begun = False  # the coordinator began this clock itself (the last report's ``next_begun``)
        linger = report_linger()
        read_ahead: dict[int, dict] = {}  # clock -> its report, come with an earlier one's (``more``)
        finished_at = None  # when the last report's clock finished, on the coordinator (its ``finished_at``)
        t0 = time.perf_counter()
        try:
            bar.update(first - 1)
            for clock in range(first, max_clocks + 1):
                if begun and clock in read_ahead:
                    r = read_ahead.pop(clock)
                elif begun:  # (its time counts from the last report)
                    r = self._sync(self._scall, "wait", clock=clock, timeout=1.0, events_from=self._seen, linger=linger)
                    _read_ahead(read_ahead, clock, r)
                else:
                    t0 = time.perf_counter()
                    r = self._sync(self._scall, "begin_clock", clock=clock, wait=1.0, events_from=self._seen,
                                   until=max_clocks if self.algorithm.converged_on_workers else 0,
                                   ahead=self.algorithm.clock_end_reads_only)
                while True:  # the coordinator's answers until the clock's report
                    self._take_events(r)
                    self._publish(r.get("publish", []))
                    if r["status"] == "done":
                        break
                    if r["status"] == "failed":
                        raise JobFailedError(r.get("error") or "the job failed")
                    if r["status"] == "place":
                        self._sync(self._replace, list(r["shards"]), list(r["workers"]))
                    r = self._sync(self._scall, "wait", clock=clock, timeout=1.0, events_from=self._seen,
                                   linger=linger if begun else 0.0)
                    _read_ahead(read_ahead, clock, r)
                self._last_clock = clock
                # a clock the coordinator began itself lasts from the last clock's finish to its own (reports
                # read together came at one time); one the driver began, from its begin_clock
                now = time.perf_counter()
                last_finished, finished_at = finished_at, r.get("finished_at")
                # (on the coordinator's clock, as its events' times: a report read late is not a later end)
                self._last_report_at = time.time() if finished_at is None else finished_at
                if begun and finished_at is not None and last_finished is not None:
                    seconds = finished_at - last_finished
                else:
                    seconds = now - t0
                rec = ClockRecord(clock, seconds, dict(r["metrics"]),
                                  dict(r["shards_per_worker"]), dict(r["timings"]), dict(r["stage_s"]),
                                  dict(r.get("workers", {})), bool(r.get("skipped")), r.get("checkpoint"),
                                  int(r.get("ahead", 0)))
                t0 = now
                history.append(rec)
                if not rec.skipped:  # the stopping rule sees completed clocks only
                    metrics_hist.append(rec.metrics)
                bar.update(1)
                bar.set_postfix_str(line.update(rec, self.events))
                # the rule as the clock end evaluated it on the same history, where it did; the next
                # clock then runs already unless it said stop (``BspSchedule.clock_end_done``)
                begun = bool(r.get("next_begun"))
                stop = r.get("stop")
                if not rec.skipped and (self.algorithm.converged(metrics_hist, self.tol) if stop is None else stop):
                    converged = True
                    break
        finally:
            bar.close()
        return history, converged

    async def _gather(self) -> dict[str, np.ndarray]:
        """The model's param tables from their owners. An owner lost meanwhile is recovered by the
        coordinator (its partitions restored elsewhere): ask for the owners again and retry."""
        for attempt in range(GATHER_ATTEMPTS):
            r = await self._scall("owners")
            if r["status"] != "OK":
                raise JobFailedError(r.get("error") or "the job failed")
            owner = {(t, int(p)): w for t, p, w in r["owners"]}
            try:
                return await self._gather_from(owner)
            except (OSError, LookupError, KeyError) as e:  # an owner died under the gather
                if attempt == GATHER_ATTEMPTS - 1:
                    raise JobFailedError(f"gathering the model failed {GATHER_ATTEMPTS} times; last: {e!r}") from e
                logger.info("gathering the model: %r; asking for the owners again", e)
                await asyncio.sleep(GATHER_RETRY_S)  # the scheduler notices a closed comm within moments
        raise AssertionError("unreachable")

    async def _gather_from(self, owner: dict[tuple[str, int], str]) -> dict[str, np.ndarray]:
        """Every param table at once: the partitions within budget pulled with one message per
        owner, all owners concurrently; the others kept on the cluster."""
        out = {}
        pulled = [t for t in self.tables if t.kind == "param"
                  and not results.over_budget(t, self.options.get("result_budget"))]
        for t in self.tables:
            if t.kind == "param" and t not in pulled:
                out[t.name] = await results.keep_on_cluster(self.client, self.job_id, t, owner)
        groups = by_owner(owner, [(t.name, p) for t in pulled for p in range(t.n_parts)])
        replies = await asyncio.gather(*(self._call_worker(w, "pull_many", job_id=self.job_id,
                                                           parts=[list(k) for k in keys])
                                         for w, keys in groups.items()))
        pieces: dict[tuple[str, int], np.ndarray] = {}
        for (w, keys), r in zip(groups.items(), replies):
            if r.get("status", "OK") != "OK":
                raise LookupError(f"{w} no longer holds all of {', '.join(f'{t}/{p}' for t, p in keys)}")
            pieces.update(zip(keys, wire.decode(r["data"])))
        out.update({t.name: np.concatenate([pieces[(t.name, p)] for p in range(t.n_parts)]) for t in pulled})
        for name in out:  # in the model's result order, where it stores rows in another (``result_rows``)
            if (rows := self.algorithm.result_rows(name, self.data.meta)) is not None:
                out[name] = out[name][rows]
        return {t.name: out[t.name] for t in self.tables if t.name in out}


def jobs(cluster: "Cluster | str | Any") -> list[dict[str, Any]]:
    """The dscar jobs running on ``cluster`` (a ``dscar.Cluster``, a ``distributed.Client`` or a
    scheduler address): for each, ``job`` (its id), ``model``, ``clock``, ``workers`` (live),
    ``lease_age`` (seconds since its driver last renewed its lease) and ``lease_timeout``."""
    cl = Cluster(cluster, set_as_default=False, coordinator_only=True)
    try:
        return list(cl.client.sync(cl.client.scheduler.dscar_jobs)["jobs"])
    finally:
        cl.close()


def cancel(job_id: str, cluster: "Cluster | str | Any") -> None:
    """End the running job ``job_id`` on ``cluster`` by hand, as a lapsed lease would: its workers
    drop its partitions and shards, and its driver, if alive, fails with ``JobFailedError``.
    ``InvalidInputError`` when no such job runs there."""
    if not isinstance(job_id, str) or not job_id:
        raise InvalidInputError(f"job_id must be a job's id (see dscar.jobs), not {job_id!r}")
    cl = Cluster(cluster, set_as_default=False, coordinator_only=True)
    try:
        r = cl.client.sync(cl.client.scheduler.dscar_cancel, job_id=job_id)
    finally:
        cl.close()
    if r["status"] != "OK":
        running = ", ".join(r.get("jobs", ())) or "none"
        raise InvalidInputError(f"no dscar job {job_id!r} runs on this cluster (running: {running})")
