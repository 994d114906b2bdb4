"""What the benchmarks' workers unpickle: the models and plugins of bench.chaos and bench.elastic.

A worker imports the module that defines the model it runs. These live apart from the benchmark
harnesses, which import dscar's coordinator, the hollow cluster and more (~0.4 s of a worker's CPU):
a worker that joins mid-run (``bench.elastic``) or is restarted (``bench.chaos``) would pay that from the
running workers' clocks on a shared machine, a cost of the harness, not of dscar. This module imports only
numpy, dscar's Algorithm API and distributed's WorkerPlugin.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
from distributed.diagnostics.plugin import WorkerPlugin

import dscar
from dscar import Algorithm, TableSpec

FANOUT_ROWS = 16  #: rows of the table every shard step adds to (one partition per worker)
CHECK_KEYS = ("missing", "duplicated", "corrupt", "ahead", "past", "state")


# ------------------------------------------------------------------- the checker (pure)
def check_seen(seen: np.ndarray, bad: np.ndarray, clock: int, staleness: int = 0) -> dict[str, int]:
    """Exactly-once check of a completed clock (see the module docstring); counts per kind of breach.

    ``seen`` / ``bad``: (n_shards, n_columns) as of the clock's clock-end step; column c counts the
    applied updates of clock c. Under SSP (``staleness`` s) the columns of clocks ``clock + 1 ..
    clock + s`` may already hold updates (0 or 1 each: shards run ahead), later ones none.
    """
    seen = np.asarray(seen, dtype=float)
    bad = np.asarray(bad, dtype=float)
    if not 1 <= clock < seen.shape[1]:
        raise ValueError(f"clock {clock} outside the table's columns 1..{seen.shape[1] - 1}")
    col = seen[:, clock]
    out = {
        "missing": int(np.sum(col == 0)),
        "duplicated": int(np.sum(col >= 2)),
        "corrupt": int(np.sum((col != 0) & (col != 1) & (col < 2))),  # negative, fractional, NaN
        "ahead": int(np.count_nonzero(seen[:, clock + 1 + staleness:])) + int(np.count_nonzero(seen[:, 0]))
        + int(np.sum((seen[:, clock + 1:clock + 1 + staleness] != 0) & (seen[:, clock + 1:clock + 1 + staleness] != 1))),
        "past": int(np.sum((seen[:, 1:clock] != 0) & (seen[:, 1:clock] != 1))),
        "state": int(np.count_nonzero(bad[:, clock])),
    }
    out["violations"] = sum(out[k] for k in CHECK_KEYS)
    return out


def check_final(seen: np.ndarray, last_clock: int, last_completed: bool, staleness: int = 0) -> int:
    """Breaches in the final parameters: every column 0 or 1, nothing after ``last_clock`` (under SSP
    after ``last_clock + staleness``) or in column 0, and ``last_clock``'s column all 1 when that
    clock completed."""
    seen = np.asarray(seen, dtype=float)
    top = last_clock + staleness
    n = int(np.count_nonzero(seen[:, top + 1:])) + int(np.count_nonzero(seen[:, 0]))
    n += int(np.sum((seen[:, 1:top + 1] != 0) & (seen[:, 1:top + 1] != 1)))
    if last_completed and last_clock >= 1:
        n += int(np.sum(seen[:, last_clock] != 1))
    return n


class ExactlyOnce(Algorithm):
    """Exactly-once counters (module docstring): ``seen``, ``bad`` (n_shards x clocks+1) and ``steps``."""

    name = "exactly-once"
    data_names = ("x",)

    #: its updates commute, so stale-synchronous clocks are fine (what it checks holds under SSP)
    max_staleness = 2
    #: its clock end only reads (the check): it runs while the next clock begins, and would see that clock's
    #: updates in its columns were they applied before it reported
    clock_end_reads_only = True

    def __init__(self, clocks: int, work_s: float = 0.0, marker: str | None = None, staleness: int = 0,
                 n_parts: int | None = None):
        self.clocks = clocks  #: columns 1..clocks (one per clock)
        self.work_s = work_s  #: seconds each shard step sleeps
        self.marker = marker  #: a file the first shard step creates (the chaos monkey waits for it)
        self.staleness = staleness  #: the run's SSP staleness (0: BSP): how far ahead columns may be
        #: partitions of the tables of the shards' rows (``seen``, ``bad``, ``steps``); None: dscar's default
        #: (one a worker at the start)
        self.n_parts = n_parts

    def tables(self, meta):
        n, cols, parts = meta.n_shards, self.clocks + 1, self.n_parts
        return [TableSpec("seen", n, (cols,), n_parts=parts), TableSpec("bad", n, (cols,), n_parts=parts),
                TableSpec("steps", n, n_parts=parts),
                TableSpec("fanout", FANOUT_ROWS)]

    def rebuild_tables(self):
        return ["steps"]

    def rebuild_step(self, ctx, data):
        ctx.add("steps", ctx.xp.asarray([self._count(ctx)]), start=ctx.shard)

    @staticmethod
    def _count(ctx) -> float:
        c = ctx.state.get("count")
        return 0.0 if c is None else float(dscar.to_host(c).reshape(-1)[0])

    def mark(self, ctx, row: str, clock: int) -> None:
        v = np.zeros((1, self.clocks + 1))
        v[0, clock] = 1.0
        ctx.add(row, ctx.xp.asarray(v), start=ctx.shard)

    def shard_step(self, ctx, data):
        if self.marker and not os.path.exists(self.marker):
            open(self.marker, "w").close()
        if self.work_s:
            time.sleep(self.work_s)
        k = self._count(ctx)
        t = float(dscar.to_host(ctx.pull("steps", ctx.shard, ctx.shard + 1))[0])
        self.mark(ctx, "seen", ctx.clock)
        if t != k:
            self.mark(ctx, "bad", ctx.clock)
        ctx.set_state("count", ctx.xp.asarray([k + 1.0]))
        ctx.add("steps", ctx.xp.asarray([1.0]), start=ctx.shard)
        ctx.add("fanout", ctx.xp.ones(FANOUT_ROWS))  # an update for every partition owner (mid-push kills land)

    def clock_end(self, ctx):
        c = check_seen(dscar.to_host(ctx.pull("seen")), dscar.to_host(ctx.pull("bad")), ctx.clock, self.staleness)
        return {"objective": float(ctx.clock), **{k: float(v) for k, v in c.items()}}

    def converged(self, history, tol):
        return False


# ------------------------------------------------------------------- bench.elastic
class Churned(ExactlyOnce):
    """``ExactlyOnce`` that reports each clock to the churn driver (``converged`` runs in this process) and
    stops 2 clocks after the driver's last event."""

    converged_on_workers = False  # (the churn driver's hook: it runs in the driver's process)

    def __init__(self, clocks: int, work_s: float, n_parts: int | None = None):
        super().__init__(clocks, work_s, n_parts=n_parts)
        self.driver = None  #: the churn driver (bench.elastic.ChurnDriver), in the driver's process only
        self.ticks: list[tuple[float, int]] = []  #: (time, clocks in the history) at each clock's end
        self.coordinator = None  #: the in-process scheduler's dscar coordinator, read at each clock's end
        self.layouts: list[dict[str, Any] | None] = []  #: ``layout_of`` at each clock's end (as ``ticks``)
        #: ``bench.elastic.memory_copies`` at the last clock's end (None: no memory tier, or not reached)
        self.copies: dict[str, Any] | None = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items()
                if k not in ("driver", "ticks", "coordinator", "layouts", "copies")}

    def converged(self, history, tol):
        self.ticks.append((time.time(), len(history)))
        if self.coordinator is not None:
            from bench.elastic import layout_of  # (the driver's process: bench.elastic is loaded there)

            self.layouts.append(layout_of(self.coordinator))
        if self.driver is None:
            return False
        self.driver.tick(len(history))
        last = (self.driver.done_at is not None and len(history) >= self.driver.done_at + 2) or len(history) >= self.clocks
        if last and self.coordinator is not None:
            from bench.elastic import memory_copies

            self.copies = memory_copies(self.coordinator, self.driver.client)
        return last


def copies_held(dask_worker) -> dict[str, int]:
    """Job -> the memory tier's copies this worker keeps for it (``bench.elastic.memory_copies``)."""
    from dscar.worker.plugin import PLUGIN_NAME

    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return {} if plugin is None else {j: len(job.mirrors.copies) for j, job in list(plugin.jobs.items())}


#: in partitions that split evenly over 2 and over 3 owners
PB_ROWS, PB_COLS, PB_PARTS, PB_SHARDS = 24_000, 8, 6, 12


class PullBound(Algorithm):
    """A model whose shard step is one pull of ``1 / n_shards`` of the rows of ``w``, spread over every
    partition (so a step asks every owner at once, and each owner's share of the pulls is its share of
    the rows), and a one-row update: nothing else. It
    reports each clock to ``pull_bound`` (``converged`` runs in this process), which grows the cluster
    and stops the fit."""

    name = "pull-bound"
    data_names = ("x",)
    converged_on_workers = False  # (the hook runs in the driver's process)

    def __init__(self, n_shards: int = PB_SHARDS):
        self.n_shards = n_shards
        self.hook = None  #: called at each clock's end with the history's length: True stops the fit

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "hook"}

    def tables(self, meta):
        return [TableSpec("w", PB_ROWS, (PB_COLS,), n_parts=PB_PARTS)]

    def shard_step(self, ctx, data):
        rows = np.arange(ctx.shard, PB_ROWS, self.n_shards)  # a row in n_shards of every partition: every owner at once
        ctx.pull_rows("w", rows)
        ctx.add("w", ctx.xp.ones((1, PB_COLS)), start=ctx.shard)

    def clock_end(self, ctx):
        return {"objective": float(dscar.to_host(ctx.pull("w", 0, 1)).sum())}

    def converged(self, history, tol):
        return bool(self.hook(len(history))) if self.hook is not None else False


class SlowServing(WorkerPlugin):
    """Every worker (a joiner too: a plugin is set up on each worker that arrives) serves ``pull``s one
    at a time at ``s_per_row`` seconds per row, and records ``(time, rows)`` of each pull it served."""

    name = "dscar-bench-slow-serving"

    def __init__(self, s_per_row: float):
        self.s_per_row = s_per_row

    def setup(self, worker) -> None:
        handler = worker.handlers["dscar_pull"]  # (dscar's plugin was registered first: it is set up first)
        lock = asyncio.Lock()
        served: list[tuple[float, int]] = []
        worker.dscar_bench_served = served
        s_per_row = self.s_per_row

        async def pull(comm, **kw):
            rows = len(kw["rows"]) if kw.get("rows") is not None else int(kw.get("hi") or 0) - int(kw.get("lo") or 0)
            async with lock:
                await asyncio.sleep(rows * s_per_row)
            served.append((time.time(), rows))
            out = handler(comm, **kw)
            return await out if asyncio.iscoroutine(out) else out

        worker.handlers["dscar_pull"] = pull
