"""Which algorithms converge when their reads are stale: the measurement behind ``max_staleness``.

Under stale-synchronous parallel (SSP) execution with staleness ``s`` a shard step of
clock ``t`` may read tables that lack the updates of clocks ``t-s .. t-1`` (Ho et al.,
NIPS 2013). Whether an algorithm still converges, and in how many clocks, is a
property of the algorithm, not of the engine, so it is measured here without one.
``StaleRun`` runs an algorithm in one process under the worst case SSP allows:

* every shard step of clock ``t`` reads the tables as they stood at the end of clock
  ``t-1-s`` (``s = 0``: BSP, the tables as of its data phase's start), plus
  **its own shard's updates since** (read-my-writes, as Petuum's SSP gives a worker
  its own writes at once: without it a sampler's own counts would not match its
  assignments);
* its updates are added to the *current* tables (a ``param`` table adds them, a
  ``reduction`` table holds the clock's sum, as the engine applies them);
* the clock-end step reads and writes the current tables.

The problems and targets are ``bench.rework``'s (each algorithm stops at its target),
plus ``mlr-m0``, the same MLR without momentum; per model and staleness the table gives
the clocks to the target (or that it was not reached) beside the algorithm's declared
``max_staleness``. No Dask, no timing: clocks are counted. This is the worst case of
ordered applies (a clock's updates visible all at once); with a committed attempt's
update applied at once, most reads would be fresher.

Run ``python -m bench.staleness`` (``--quick``: small problems, about a minute).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from typing import Any

import numpy as np

import dscar
from dscar.api.data import as_data

from bench.common import load_average, machine_info, pyplot, write_json

STALENESS = (0, 1, 2, 4)


class _StepContext:
    """What a shard step sees: stale reads plus the shard's own updates since, staged adds."""

    def __init__(self, run: "StaleRun", shard: int, clock: int, phase: str | None, view: dict[str, np.ndarray]):
        self.xp, self.clock, self.shard, self.phase = np, clock, shard, phase
        self.meta, self.tol, self.batch_scale = run.meta, run.tol, 1.0
        self.state = dict(run.states[shard])
        self.new_state: dict[str, Any] = {}
        self.adds: list[tuple[str, np.ndarray | None, int, np.ndarray]] = []  # (table, rows, start, values)
        self._view = view

    def pull(self, table: str, start: int = 0, stop: int | None = None):
        return self._view[table][start:stop]

    def pull_rows(self, table: str, rows):
        return self._view[table][np.asarray(rows, dtype=np.int64)]

    def add(self, table: str, values, start: int = 0) -> None:  # copied, as the engine stages them:
        self.adds.append((table, None, int(start), np.array(values)))  # a step may reuse its buffers

    def add_rows(self, table: str, rows, values) -> None:
        self.adds.append((table, np.array(rows, dtype=np.int64), 0, np.array(values)))

    def set_state(self, name: str, value) -> None:
        self.new_state[name] = value


class _ClockEndContext:
    def __init__(self, run: "StaleRun", clock: int):
        self.xp, self.clock, self.meta, self.tol, self._run = np, clock, run.meta, run.tol, run

    def pull(self, table: str, start: int = 0, stop: int | None = None):
        return self._run.tables[table][start:stop].copy()

    def pull_rows(self, table: str, rows):
        return self._run.tables[table][np.asarray(rows, dtype=np.int64)]

    def summaries(self, table: str) -> list[list[np.ndarray]]:
        return [self._run.algorithm.summarize(table, self._run.tables[table], 0)]

    def assign(self, table: str, values, start: int = 0) -> None:
        values = np.asarray(values)
        self._run.tables[table][start:start + values.shape[0]] = values

    def flush(self) -> None:
        pass


def _add(target: np.ndarray, rows: np.ndarray | None, start: int, values: np.ndarray) -> None:
    if rows is None:
        target[start:start + values.shape[0]] += values.astype(target.dtype, copy=False)
    else:
        np.add.at(target, rows, values.astype(target.dtype, copy=False))


class StaleRun:
    """One algorithm in one process, every read ``staleness`` clocks stale (the worst case SSP allows)."""

    def __init__(self, algorithm: dscar.Algorithm, data: Any, n_shards: int, staleness: int, tol: float = 1e-6):
        self.algorithm, self.staleness, self.tol = algorithm, int(staleness), float(tol)
        d = as_data(data, n_shards)
        self.meta = d.meta
        algorithm.validate(self.meta)
        algorithm.warm_up(np)
        self.specs = {t.name: t for t in algorithm.tables(self.meta)}
        #: the current tables (what an apply or a clock end changes)
        self.tables = {n: np.array(algorithm.init_rows(t, 0, t.n_rows, np)) for n, t in self.specs.items()}
        self.data = [algorithm.prepare_shard(d.shard(i), np) for i in range(self.meta.n_shards)]
        self.states: list[dict[str, Any]] = [{} for _ in range(self.meta.n_shards)]
        #: the tables at the end of each clock (0: the initial values), as far back as a read may go
        self.ends: dict[int, dict[str, np.ndarray]] = {0: self._copy()}
        #: per shard: (clock, param-table adds) of the clocks a stale read does not see yet
        self.own: list[list[tuple[int, list]]] = [[] for _ in range(self.meta.n_shards)]
        self.history: list[dict[str, float]] = []

    def _copy(self) -> dict[str, np.ndarray]:
        return {n: v.copy() for n, v in self.tables.items()}

    def _params(self, adds: list) -> list:
        return [a for a in adds if self.specs[a[0]].kind == "param"]

    def _apply(self, shard: int, ctx: _StepContext, tables: dict[str, np.ndarray]) -> None:
        """Add a step's updates to ``tables`` (where a table is missing there: the current one); keep its state."""
        for table, rows, start, values in ctx.adds:
            _add(tables.get(table, self.tables[table]), rows, start, values)
        self.states[shard].update(ctx.new_state)

    def _end_clock(self, clock: int) -> dict[str, float]:
        """The clock-end step of ``clock``, over the current tables; its metrics join the history."""
        metrics = self.algorithm.clock_end(_ClockEndContext(self, clock))
        self.history.append(dict(metrics))
        return metrics

    def _result(self, clock: int) -> tuple[int | None, list[float]] | None:
        """After ``clock`` ended: the run's result if it stops here (the target reached: ``clock``; a
        non-finite objective, diverged: None), else None."""
        objectives = [h.get("objective", math.nan) for h in self.history]
        if not math.isfinite(float(objectives[-1])):
            return None, objectives
        if self.algorithm.converged(self.history, self.tol):
            return clock, objectives
        return None

    def _view(self, shard: int, clock: int) -> dict[str, np.ndarray]:
        """The tables a shard step of ``clock`` reads: the end of clock ``clock - 1 - s`` plus its own updates since."""
        if self.staleness == 0:
            return self.tables
        seen = max(0, clock - 1 - self.staleness)
        view = {n: v.copy() for n, v in self.ends[seen].items()}
        for c, adds in self.own[shard]:
            if c > seen:
                for table, rows, start, values in adds:
                    _add(view[table], rows, start, values)
        return view

    def clock(self, t: int) -> dict[str, float]:
        phases = [p for p, _ in self.meta.phases] or [None]
        for i, phase in enumerate(phases):
            shards = self.meta.phase_shards(phase) if phase is not None else range(self.meta.n_shards)
            steps = []
            for s in shards:
                ctx = _StepContext(self, s, t, phase, self._view(s, t))
                self.algorithm.shard_step(ctx, self.data[s])
                steps.append((s, ctx))
            if i == 0:  # a reduction holds the clock's sum over every phase
                for n, spec in self.specs.items():
                    if spec.kind == "reduction":
                        self.tables[n][...] = 0
            for s, ctx in steps:
                self._apply(s, ctx, self.tables)
                if self.staleness:
                    self.own[s].append((t, self._params(ctx.adds)))
        metrics = self._end_clock(t)
        if self.staleness:
            self.ends[t] = self._copy()
            seen = t - self.staleness  # what the next clock reads: the end of this clock, its own updates after it
            self.ends = {c: v for c, v in self.ends.items() if c >= seen}
            for own in self.own:
                own[:] = [(c, a) for c, a in own if c > seen]
        return metrics

    def run(self, max_clocks: int) -> tuple[int | None, list[float]]:
        """Clocks until the algorithm's stopping rule held (None: not within ``max_clocks``), objectives."""
        for t in range(1, max_clocks + 1):
            self.clock(t)
            if (stop := self._result(t)) is not None:
                return stop
        return None, [h.get("objective", math.nan) for h in self.history]


class LaggingRun(StaleRun):
    """SSP as one straggler makes it: the shards of one of ``workers`` workers (every
    ``workers``-th shard) run ``staleness`` clocks behind the others', and a step's update is
    applied as soon as the step ends, which SSP allows. Round ``r``: the on-time shards run clock
    ``r`` side by side (each reads the tables as of the round's start: what every on-time shard
    did up to clock ``r - 1`` and the lagging ones up to ``r - 1 - s``), then the lagging worker
    runs its shards of clock ``r - s`` one after the other (each reads the tables as they are
    then). Clock t ends (its clock-end step runs, over its own reductions) once its lagging shards
    are applied, in round ``t + s``: time to target is counted in rounds. One data phase."""

    def __init__(self, algorithm: dscar.Algorithm, data: Any, n_shards: int, staleness: int, workers: int = 4,
                 tol: float = 1e-6):
        super().__init__(algorithm, data, n_shards, 0, tol)  # reads: the current tables
        if self.meta.phases:
            raise ValueError("LaggingRun models one data phase per clock")
        self.staleness = int(staleness)
        self.lagging = [s for s in range(self.meta.n_shards) if s % workers == 0]
        self.on_time = [s for s in range(self.meta.n_shards) if s % workers]
        #: clock -> its reduction tables' sums so far (a clock's reductions are its own, however late)
        self.sums: dict[int, dict[str, np.ndarray]] = {}

    def _steps(self, shards: list[int], clock: int, side_by_side: bool) -> None:
        """Run ``shards``' steps of ``clock`` and apply them: each at once, or all after the last."""
        view = self._copy() if side_by_side else self.tables
        done = []
        sums = self.sums.setdefault(clock, {n: np.zeros_like(v) for n, v in self.tables.items()
                                            if self.specs[n].kind == "reduction"})
        for shard in shards:
            ctx = _StepContext(self, shard, clock, None, view)
            self.algorithm.shard_step(ctx, self.data[shard])
            done.append((shard, ctx))
            if not side_by_side:
                self._apply(*done.pop(), sums)
        for shard, ctx in done:
            self._apply(shard, ctx, sums)

    def run(self, max_clocks: int) -> tuple[int | None, list[float]]:
        """Clocks until the stopping rule held (None: not within ``max_clocks``); objectives per clock."""
        for r in range(1, max_clocks + self.staleness + 1):
            if r <= max_clocks:
                self._steps(self.on_time, r, side_by_side=True)
            c = r - self.staleness
            if c < 1:
                continue
            self._steps(self.lagging, c, side_by_side=False)
            for n, v in self.sums.pop(c).items():
                self.tables[n][...] = v
            self._end_clock(c)
            if (stop := self._result(c)) is not None:
                return stop
        return None, [h.get("objective", math.nan) for h in self.history]


def without_momentum(problem):
    """``problem``'s MLR with no heavy-ball momentum (``MLRSGD.max_staleness`` depends on it)."""
    def make(seed: int):
        algo = problem.make_algo(seed)
        algo.momentum = 0.0
        return algo

    return dataclasses.replace(problem, name=f"{problem.name}-m0", make_algo=make)


def problems(quick: bool, names: list[str]) -> list:
    from bench import rework

    make = {"lasso": rework.lasso_problem, "lda": rework.lda_problem, "mlr": rework.mlr_problem,
            "mlr-m0": lambda q: without_momentum(rework.mlr_problem(q)),
            "mlr-text": rework.mlr_text_problem, "mf": rework.mf_problem}
    unknown = set(names) - set(make)
    if unknown:
        raise SystemExit(f"unknown model(s) {sorted(unknown)}; choose from {sorted(make)}")
    return [make[n](quick) for n in names]


def measure(problem, staleness: tuple[int, ...], seeds: int, lagging: int | None = None) -> list[dict[str, Any]]:
    """Clocks to target per staleness: every read ``s`` clocks stale, or (``lagging`` workers) one of
    them ``s`` clocks behind with updates applied at once (``s = 0``: BSP either way)."""
    rows = []
    for s in staleness:
        for seed in range(seeds):
            algo = problem.make_algo(seed)
            t0 = time.perf_counter()
            tol = getattr(algo, "tol", 1e-6)
            run = (LaggingRun(algo, problem.data, problem.n_shards, s, lagging, tol=tol) if lagging and s
                   else StaleRun(algo, problem.data, problem.n_shards, s, tol=tol))
            clocks, objective = run.run(problem.max_clocks)
            rows.append({"model": problem.name, "staleness": s, "seed": seed, "clocks": clocks,
                         # time in clocks of work: a lagging run's clock t ends in round t + s
                         "rounds": None if clocks is None else clocks + (s if lagging else 0),
                         "final_objective": objective[-1] if objective else math.nan, "objective": objective,
                         "seconds": time.perf_counter() - t0})
            print(f"  {problem.name:8s} s={s}  seed {seed}: "
                  + (f"target at clock {clocks}" if clocks else f"target not reached in {len(objective)} clocks")
                  + f"  (objective {rows[-1]['final_objective']:.6g}, {rows[-1]['seconds']:.1f} s)", flush=True)
    return rows


def summarise(rows: list[dict], declared: dict[str, int]) -> list[dict[str, Any]]:
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        base = [r["rounds"] for r in rows if r["model"] == model and r["staleness"] == 0 and r["rounds"]]
        b = float(np.median(base)) if base else math.nan
        for s in dict.fromkeys(r["staleness"] for r in rows if r["model"] == model):
            rs = [r for r in rows if r["model"] == model and r["staleness"] == s]
            reached = [r["rounds"] for r in rs if r["rounds"]]
            med = float(np.median(reached)) if len(reached) == len(rs) else math.nan
            out.append({"model": model, "staleness": s, "runs": len(rs), "reached": len(reached),
                        "median_clocks": med, "vs_bsp": med / b if b == b else math.nan,
                        "declared_max_staleness": declared.get(model)})
    return out


def format_table(summary: list[dict]) -> str:
    lines = ["model     s  reached  clocks of work to target (median)  vs s=0   declared max_staleness",
             "-" * 90]
    for r in summary:
        clocks = f"{r['median_clocks']:.0f}" if r["median_clocks"] == r["median_clocks"] else "not reached"
        vs = f"{r['vs_bsp']:.2f}x" if r["vs_bsp"] == r["vs_bsp"] else "-"
        lines.append(f"{r['model']:8s} {r['staleness']:2d}  {r['reached']:3d}/{r['runs']:<3d}  {clocks:>33s}  "
                     f"{vs:>7s}   {r['declared_max_staleness']}")
    return "\n".join(lines)


def plot(path: str, rows: list[dict], title: str) -> None:
    plt = pyplot()
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for r in rows:
            if r["model"] == model and r["seed"] == 0:
                obj = np.asarray(r["objective"], dtype=float)
                ax.plot(np.arange(1, obj.size + 1), obj, label=f"s = {r['staleness']}")
        ax.set_title(model)
        ax.set_xlabel("clock")
        ax.set_ylabel("objective")
        if model != "lda":
            ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.staleness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small problems (bench.rework's quick ones)")
    ap.add_argument("--models", default="lasso,lda,mlr,mlr-m0,mf",
                    help="comma-separated of lasso, lda, mlr, mlr-m0 (MLR without momentum), mlr-text, mf")
    ap.add_argument("--staleness", default=",".join(map(str, STALENESS)), help="comma-separated staleness values")
    ap.add_argument("--lagging", type=int, default=None, metavar="W",
                    help="instead of every read s clocks stale: one of W workers s clocks behind, updates applied at once")
    ap.add_argument("--seeds", type=int, default=None, help="sampler seeds per LDA setting (default 3; 1 with --quick)")
    ap.add_argument("--json", default=None, metavar="PATH")
    ap.add_argument("--plot", default=None, metavar="PATH", help="PNG (default: the JSON's path with .png, else staleness.png)")
    a = ap.parse_args(argv)
    staleness = tuple(int(s) for s in a.staleness.split(","))
    la0 = load_average()
    rows, declared = [], {}
    for p in problems(a.quick, [m for m in a.models.split(",") if m]):
        if a.lagging and isinstance(p.data, dscar.PhasedData):
            print(f"== {p.name}: skipped (--lagging models one data phase per clock)", flush=True)
            continue
        print(f"== {p.name}: {p.threshold_rule}", flush=True)
        seeds = (a.seeds or (1 if a.quick else 3)) if p.seeds > 1 else 1  # a sampler's path is random
        rows += measure(p, staleness, seeds, a.lagging)
        declared[p.name] = int(p.make_algo(0).max_staleness)  # as this problem configures the algorithm
    if not rows:
        print("no model to run")
        return 2
    summary = summarise(rows, declared)
    print()
    print(format_table(summary))
    print(f"load average {la0} -> {load_average()} (clocks are counted, not timed)")
    if a.json:
        write_json(a.json, {"machine": machine_info(), "staleness": staleness, "quick": a.quick, "lagging": a.lagging,
                            "summary": summary, "runs": rows})
    title = (f"Objective per clock, one of {a.lagging} workers s clocks behind (updates applied at once)" if a.lagging
             else "Objective per clock with every read s clocks stale (own updates seen)")
    plot(a.plot or (a.json[:-5] + ".png" if a.json and a.json.endswith(".json") else "staleness.png"), rows, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
