"""Straggler benchmark: time per clock with one of 4 workers slowed, per strategy.

What it measures
----------------
An embedded cluster of 4 worker processes (1 thread each) runs a fixed number
of clocks (10; 6 with ``--quick``) while worker 0 is slowed by ``s`` in
{1, 2, 4, 8} (``dscar.faults.slow(0, s)``: after every shard step that worker
sleeps ``(s - 1)`` x the step's real duration) and in a *transient* variant
(``s = 8`` on clocks 2-4 only). Strategies:

* ``bsp``            static equal sharding with a barrier (``sharding="static"``,
                     no policies): each worker runs only the shards it holds;
* ``dynamic``        dynamic sharding (workers pull shards; a fast worker takes
                     shards from the longest backlog), no policies;
* ``dynamic+backup`` dynamic sharding plus backup attempts (``policies=["backup"]``);
* ``dynamic+adaptive`` dynamic sharding plus the adaptive batch policy
                     (``policies=["adaptive"]``): each worker's minibatch follows
                     its measured speed (``ctx.batch_scale``), the global batch
                     fixed. Only MLR has a minibatch; for the other workloads it
                     is reported as n/a (the reason is printed with the tables).

Workloads
---------
1. ``synthetic-32`` (the clean capacity model, the reference for the targets):
   ``SleepStep``, whose shard step sleeps a fixed ``work_s`` (30 ms; 20 ms with
   ``--quick``) and adds ones to a counter table; it never converges. Sleeping
   uses no CPU, so the 4 workers' capacities are independent even on a 2-core
   machine. ``synthetic-64`` (full mode only): 64 shards of 15 ms, the same work
   per clock in finer pieces (better balance, twice the per-shard overhead).
2. ``lasso`` (real compute): ``LassoCD`` (``tol=1e-30``: it runs every clock;
   a working set of up to 256 coordinates makes each shard's Gram block the main
   cost) on ``make_regression(96_000, 512, 200)``, 32 shards. Caveats: with 4
   CPU-bound worker processes on fewer cores the capacities are not independent
   (while the slowed worker sleeps it frees CPU for the others, so they speed up,
   ratios below 1 are possible and BSP is flattered); and the injected slowdown
   multiplies only the step itself (pulls + compute), not the push and commit
   of its contributions, so a slowed shard cycle is less than ``s`` times longer.
3. ``lda`` (real compute, full mode or ``--only lda``): ``LDAGibbs`` (K = 50,
   no early stop) on a corpus drawn from the LDA model (4000 documents of 200
   tokens, V = 4000), 32 shards; clock 1 draws the assignments, every later
   clock is one Gibbs sweep (the compiled sampler when numba is installed).
   The same caveats as Lasso.
4. ``mlr`` (real compute, full mode or ``--only mlr``): ``MLRSGD`` (local SGD,
   32 steps of 512 rows per shard per clock, ``tol=1e-30``: it runs every
   clock) on ``make_classification(16_384, 128, 10)``, 32 shards. The one
   workload with a minibatch, so the one where ``dynamic+adaptive`` runs:
   the slow worker's shards take smaller minibatches (same number of steps),
   so they finish sooner, and the fast workers' take larger ones. Its time
   per clock is compared with the same ideal, but it does less work on the
   slowed worker than the other strategies (its ratio can fall below 1).
   The same caveats as Lasso.
5. ``mf`` (real compute, full mode or ``--only mf``): ``ALS`` (matrix
   factorization, rank 20, ``tol=1e-30``: it runs every clock) on
   ``make_ratings(10_000, 2_000, 250_000)``, 16 shards per data phase: a clock
   is a user phase then an item phase, each a barrier, so 32 shard steps per
   clock and the shard phase time ``S1`` is the sum of both. The same caveats
   as Lasso.

``--to-target`` measures time to the model's target instead, with stale-synchronous
clocks among the strategies (``bench.time_to_target``).

Method
------
Every (workload, s, strategy) runs in one process on one cluster, interleaved
(strategy order rotated per repeat), repeated (3x in full mode, 1x with
``--quick``); figures are medians over repeats. Time per clock of a run is the
median of ``ClockRecord.seconds`` over clocks 2..N (clock 1 is skipped: warm-up,
and Lasso's screening pass); for the transient variant it is the *mean* over
clocks 2..N (slowed and unslowed clocks alike). A run the engine fails
(``DscarError``) is recorded with its error and left out of the medians.

Ideal time per clock (capacity-weighted). Base: the fastest strategy at s=1
(the issue's "s=1 dynamic time" when dynamic is fastest; the ideal from the
dynamic s=1 runs is in the JSON too). From the base runs take ``S1`` = median
shard-phase wall time (``phase_s["shards"]``) and ``F1`` = median rest of the
clock (apply, clock-end step, driver round trips: work no sharding strategy can
spread). With capacities 1, 1, 1, 1/s the shard phase ideally takes
``S1 * 4 / (3 + 1/s)``, so ``ideal(s) = F1 + S1 * 4 / (3 + 1/s)``. For the
synthetic workload ``S1 = n_shards * t0 / 4`` with ``t0`` the measured per-shard
cycle time (``work_s`` plus per-shard coordination overhead), i.e.
``ideal(s) = F1 + n_shards * t0 / (3 + 1/s)``; ``t0`` and ``F1`` are printed.
The transient ideal is the mean over clocks 2..N of each clock's ideal (that
clock's base shard phase and rest, and its slowdown). Ratio = measured / ideal;
speed-up = BSP time / strategy time at the same s.

Targets (from the issue), checked on every workload, the synthetic one being
the reference: one of 4 workers slowed 4x -> dynamic sharding within 1.15x of
the ideal time per clock; BSP about 4x worse (BSP at s=4 takes ~4x its s=1
time per clock); with s = 8, dynamic at least 3x faster than BSP.

Run
---
    python -m bench.stragglers                 # full: ~12-15 min on 2 cores before LDA, MLR and MF; with them ~30-40 (estimate)
    python -m bench.stragglers --quick         # ~1-2 min: 1 repeat, fewer clocks, small Lasso
    python -m bench.stragglers --quick --only lda,mlr   # small LDA and MLR only (~2 min)
    python -m bench.stragglers --quick --only mf        # small MF only
    python -m bench.stragglers --json out.json --plot out.png

``--json`` writes every run's per-clock times, the medians, ratios, event counts
(backup attempts fired, shards moved, ...) and machine info; ``--plot`` (default
``stragglers.png``) writes ratio-to-ideal vs s, one line per strategy, one panel
per workload.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import dscar
from bench.common import load_average, machine_info, pyplot, usable_cpus, write_json
from dscar import faults

SLOWDOWNS = (1, 2, 4, 8)
TRANSIENT = "transient"
SCENARIOS: tuple = (*SLOWDOWNS, TRANSIENT)
TRANSIENT_FACTOR, TRANSIENT_FROM, TRANSIENT_UNTIL = 8.0, 2, 4

STRATEGIES: dict[str, dict[str, Any]] = {
    "bsp": {"sharding": "static", "policies": []},
    "dynamic": {"sharding": "dynamic", "policies": []},
    "dynamic+backup": {"sharding": "dynamic", "policies": ["backup"]},
}
ADAPTIVE = "dynamic+adaptive"
ADAPTIVE_OPTS: dict[str, Any] = {"sharding": "dynamic", "policies": ["adaptive"]}
ADAPTIVE_KINDS = ("mlr",)  # the workloads with a minibatch (they read ctx.batch_scale)
ADAPTIVE_WHY = {
    "synthetic": "each shard step is one fixed unit of work with no minibatch, so there is no "
                 "batch for the adaptive policy (ctx.batch_scale) to shrink on the slow worker",
    "lasso": "block coordinate descent needs every row's exact contribution (X^T r, Gram, r.r) each "
             "clock; LassoCD has no minibatch and never reads ctx.batch_scale",
    "lda": "a Gibbs sweep resamples every token of the shard each clock; LDAGibbs has no minibatch and "
           "never reads ctx.batch_scale",
    "mf": "each ALS phase solves every row of the shard exactly from all of that row's ratings (an exact "
          "block minimisation); a smaller batch would make the solve inexact, so ALS has no minibatch and "
          "never reads ctx.batch_scale",
}
EVENT_KINDS = ("backup-attempt", "commit-refused", "shard-moved", "straggler", "fault-slow")

TARGET_RATIO = 1.15  # dynamic within 1.15x of ideal at s=4
TARGET_BSP = 4.0  # BSP about 4x worse at s=4 (accepted: 3.5 .. 4.5)
TARGET_SPEEDUP = 3.0  # s=8: dynamic >= 3x faster than BSP


class SleepStep(dscar.Algorithm):
    """Synthetic model: each shard step sleeps ``work_s`` and counts its rows (never converges)."""

    name = "sleepstep"
    data_names = ("row",)

    def __init__(self, work_s: float = 0.03):
        self.work_s = float(work_s)

    def tables(self, meta):
        return [dscar.TableSpec("count", meta.n_rows, n_parts=1)]

    def shard_step(self, ctx, data):
        rows = data["row"]
        time.sleep(self.work_s)
        ctx.add("count", ctx.xp.ones(rows.shape[0]), start=int(rows[0]))

    def clock_end(self, ctx):
        count = dscar.to_host(ctx.pull("count"))
        return {"objective": float(count.sum()), "count_min": float(count.min())}

    def converged(self, history, tol):
        return False


@dataclass
class Workload:
    name: str  # key in the results
    kind: str  # "synthetic" | "lasso" | "lda" | "mlr" | "mf"
    make_algo: Callable[[], dscar.Algorithm]
    data: Any  # a dict of arrays, or a dscar.PhasedData (MF)
    n_shards: int  # shard steps per clock (for MF: both data phases)
    max_clocks: int  # every scenario, the transient one included
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def strategies(self) -> list[str]:
        return list(STRATEGIES) + ([ADAPTIVE] if self.kind in ADAPTIVE_KINDS else [])


def strategy_options(strategy: str) -> dict[str, Any]:
    return ADAPTIVE_OPTS if strategy == ADAPTIVE else STRATEGIES[strategy]


#: workloads run by default in full mode only; with --quick only when named in --only (small sizes)
OPTIONAL_KINDS = ("lda", "mlr", "mf")


def make_workloads(quick: bool, only: set[str] | None) -> list[Workload]:
    from dscar.algorithms.datasets import lasso_alpha_max, make_regression
    from dscar.algorithms.lasso import LassoCD

    clocks = 6 if quick else 10
    out = [synthetic_workload(quick, clocks)]
    if not quick:  # 64 shards of half the work: same work per clock, finer balance, twice the per-shard overhead
        out.append(synthetic_workload(quick, clocks, n_shards=64, work_s=0.015))
    # Lasso: a working set of up to `cap` coordinates makes each shard's Gram block the main cost
    n, p, k_inf, cap = (16_000, 256, 100, 128) if quick else (96_000, 512, 200, 256)
    X, y, _ = make_regression(n, p, k_inf, seed=0)
    alpha = 0.01 * lasso_alpha_max(X, y)
    out.append(Workload(
        "lasso", "lasso", lambda: LassoCD(alpha, tol=1e-30, max_working_set=cap), {"X": X, "y": y},
        32, clocks,
        {"n_samples": n, "n_features": p, "n_informative": k_inf, "alpha": alpha, "max_working_set": cap},
    ))
    for kind in OPTIONAL_KINDS:
        if not quick or (only and kind in only):
            out.append(OPTIONAL_WORKLOADS[kind](quick, clocks))
    if only:
        out = [w for w in out if w.name in only or w.kind in only]
    return out


def synthetic_workload(quick: bool, clocks: int, n_shards: int = 32, work_s: float | None = None) -> Workload:
    """The clean capacity model: ``SleepStep`` over 3200 rows (steps of 30 ms, 20 ms with ``--quick``)."""
    n_rows, work_s = 3200, (0.02 if quick else 0.03) if work_s is None else work_s
    return Workload(
        f"synthetic-{n_shards}", "synthetic", lambda: SleepStep(work_s),
        {"row": np.arange(n_rows, dtype=np.int64)}, n_shards, clocks,
        {"work_s": work_s, "n_rows": n_rows, "work_per_clock_s": work_s * n_shards},
    )


def lda_workload(quick: bool, clocks: int) -> Workload:
    from dscar.algorithms import corpora
    from dscar.algorithms.lda import LDAGibbs, lda_data

    docs, vocab, length, topics = (600, 1000, 100, 20) if quick else (4000, 4000, 200, 50)
    corpus = corpora.synthetic(docs, vocab, length, topics, seed=0)
    return Workload(
        "lda", "lda", lambda: LDAGibbs(topics, seed=0, early_stop=False), lda_data(corpus.X), 32, clocks,
        {"n_docs": docs, "vocab_size": vocab, "doc_length": length, "n_topics": topics, "n_tokens": corpus.n_tokens},
    )


def mlr_workload(quick: bool, clocks: int) -> Workload:
    from dscar.algorithms.datasets import make_classification
    from dscar.algorithms.mlr import MLRSGD

    n, p, k, batch, steps = (8_192, 64, 10, 256, 16) if quick else (16_384, 128, 10, 512, 32)
    X, y, _ = make_classification(n, p, k, seed=0)
    return Workload(
        "mlr", "mlr", lambda: MLRSGD(k, batch_size=batch, steps=steps, tol=1e-30), {"X": X, "y": y}, 32, clocks,
        {"n_samples": n, "n_features": p, "n_classes": k, "batch_size": batch, "steps": steps},
    )


def mf_workload(quick: bool, clocks: int) -> Workload:
    from dscar.algorithms.datasets import make_ratings
    from dscar.algorithms.mf import ALS, ratings_data

    users, items, n, rank = (4_000, 1_000, 80_000, 10) if quick else (10_000, 2_000, 250_000, 20)
    per_phase = 16  # two data phases (users, then items): 2 x 16 shard steps per clock, as many as the others' 32
    u, i, r, _ = make_ratings(users, items, n, rank, seed=0)
    mean = float(r.mean())
    return Workload(
        "mf", "mf", lambda: ALS(users, items, rank, mean=mean, tol=1e-30),
        ratings_data((u, i, r), n_users=users, n_items=items, n_shards=per_phase), 2 * per_phase, clocks,
        {"n_users": users, "n_items": items, "n_ratings": n, "rank": rank, "n_shards_per_phase": per_phase},
    )


OPTIONAL_WORKLOADS: dict[str, Callable[[bool, int], Workload]] = {"lda": lda_workload, "mlr": mlr_workload,
                                                                  "mf": mf_workload}


def scenario_faults(scenario) -> list:
    if scenario == TRANSIENT:
        return [faults.slow(0, TRANSIENT_FACTOR, clock=TRANSIENT_FROM, until=TRANSIENT_UNTIL)]
    return [faults.slow(0, float(scenario))] if scenario > 1 else []


def slowdown_at(scenario, clock: int) -> float:
    if scenario == TRANSIENT:
        return TRANSIENT_FACTOR if TRANSIENT_FROM <= clock <= TRANSIENT_UNTIL else 1.0
    return float(scenario)


def run_one(cl, wl: Workload, scenario, strategy: str, repeat: int) -> dict[str, Any]:
    opts = strategy_options(strategy)
    head = {"workload": wl.name, "scenario": scenario, "strategy": strategy, "repeat": repeat}
    try:
        res = dscar.fit(wl.make_algo(), wl.data, cl, n_shards=wl.n_shards, max_clocks=wl.max_clocks,
                        progress=False, sharding=opts["sharding"], policies=list(opts["policies"]),
                        faults=scenario_faults(scenario))
    except dscar.DscarError as e:  # an engine failure is a result too: recorded, the benchmark goes on
        return {**head, "failed": True, "error": f"{type(e).__name__}: {e}"}
    slowed = res.workers[0]
    hist = res.history
    kinds = Counter(e["kind"] for e in res.events)
    seconds = [r.seconds for r in hist]
    shards_s = [r.phase_s.get("shards", float("nan")) for r in hist]
    steady = seconds[1:] or seconds
    value = statistics.fmean(steady) if scenario == TRANSIENT else statistics.median(steady)
    return {
        **head, "failed": False,
        "n_clocks": res.n_clocks, "converged": res.converged, "setup_s": res.setup_seconds,
        "clocks": [r.clock for r in hist], "clock_s": seconds, "shard_phase_s": shards_s,
        "rest_s": [a - b for a, b in zip(seconds, shards_s)],
        "slowed_worker_shards": [r.shards_per_worker.get(slowed, 0) for r in hist],
        # per clock, summed over workers and divided by n_shards: mean seconds per shard of each part
        "per_shard_timings_s": [
            {k: sum(t.get(k, 0.0) for t in r.timings.values()) / wl.n_shards
             for k in ("data_s", "pull_s", "compute_s", "push_s")} for r in hist
        ],
        "time_per_clock_s": value,
        "events": {k: kinds.get(k, 0) for k in EVENT_KINDS},
        "objective": res.objective,
        # others' load on the machine skews timings: recorded per run
        "loadavg_1m_after": (load_average() or [None])[0],
    }


def _med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def analyse(runs: list[dict], wl: Workload) -> dict[str, Any]:
    """Medians over repeats, the ideal, ratios and speed-ups for one workload."""
    mine = [r for r in runs if r["workload"] == wl.name and not r["failed"]]
    failed = [r for r in runs if r["workload"] == wl.name and r["failed"]]

    # the base: the fastest strategy at s = 1 (its shard phase is what 4 equal workers achieve)
    base_t = {st: _med([r["time_per_clock_s"] for r in mine if r["scenario"] == 1 and r["strategy"] == st])
              for st in wl.strategies}
    base_t = {k: v for k, v in base_t.items() if v == v}
    if not base_t:
        raise RuntimeError(f"{wl.name}: every s=1 run failed; no ideal to compare with")
    base_strategy = min(base_t, key=base_t.get)

    def base_stats(strategy: str):
        rs = [r for r in mine if r["scenario"] == 1 and r["strategy"] == strategy]
        S = _med([_med(r["shard_phase_s"][1:]) for r in rs])
        F = _med([_med(r["rest_s"][1:]) for r in rs])
        per_clock = {c: (_med([r["shard_phase_s"][c - 1] for r in rs if len(r["clock_s"]) >= c]),
                         _med([r["rest_s"][c - 1] for r in rs if len(r["clock_s"]) >= c]))
                     for c in range(1, wl.max_clocks + 1)}
        return S, F, per_clock

    S1, F1, per_clock = base_stats(base_strategy)

    def ideal_of(S: float, F: float, s: float) -> float:
        return F + S * 4.0 / (3.0 + 1.0 / s)

    def ideal_for(scen) -> float:
        if scen == TRANSIENT:  # per clock: that clock's base cost and slowdown
            return statistics.fmean(ideal_of(*per_clock[c], slowdown_at(scen, c)) for c in range(2, wl.max_clocks + 1))
        return ideal_of(S1, F1, float(scen))

    table: dict[str, dict[str, dict[str, Any]]] = {}
    for scen in SCENARIOS:
        ideal = ideal_for(scen)
        row: dict[str, dict[str, Any]] = {}
        for strat in wl.strategies:
            rs = [r for r in mine if r["scenario"] == scen and r["strategy"] == strat]
            nfail = sum(1 for r in failed if r["scenario"] == scen and r["strategy"] == strat)
            if not rs:
                row[strat] = {"failed_runs": nfail, "ideal_s": ideal}
                continue
            t = _med([r["time_per_clock_s"] for r in rs])
            row[strat] = {
                "time_per_clock_s": t, "ideal_s": ideal, "ratio_to_ideal": t / ideal,
                "per_repeat_s": [r["time_per_clock_s"] for r in rs], "failed_runs": nfail,
                "backup_attempts": sum(r["events"]["backup-attempt"] for r in rs),
                "commits_refused": sum(r["events"]["commit-refused"] for r in rs),
                "shards_moved": sum(r["events"]["shard-moved"] for r in rs),
                "slowed_worker_shards_median": _med([x for r in rs for x in r["slowed_worker_shards"][1:]]),
                "n_clocks": [r["n_clocks"] for r in rs],
            }
        bsp = row.get("bsp", {}).get("time_per_clock_s")
        if bsp:
            for cell in row.values():
                if "time_per_clock_s" in cell:
                    cell["speedup_over_bsp"] = bsp / cell["time_per_clock_s"]
        if ADAPTIVE not in wl.strategies:
            row[ADAPTIVE] = {"n/a": ADAPTIVE_WHY[wl.kind]}
        table[str(scen)] = row
    out = {"strategies": wl.strategies, "base_strategy": base_strategy, "base_time_per_clock_s": base_t,
           "S1_shard_phase_s": S1, "F1_rest_of_clock_s": F1, "table": table, "info": wl.info,
           "n_shards": wl.n_shards, "max_clocks": wl.max_clocks, "failed_runs": len(failed),
           "failures": [{k: r[k] for k in ("scenario", "strategy", "repeat", "error")} for r in failed]}
    if "dynamic" in base_t:  # the definition: ideal from the s=1 dynamic time, for reference
        Sd, Fd, _ = base_stats("dynamic")
        out["ideal_from_dynamic_s1"] = {str(s): ideal_of(Sd, Fd, s) for s in SLOWDOWNS}
    if wl.kind == "synthetic":
        t0 = S1 * 4.0 / wl.n_shards
        out["t0_shard_cycle_s"] = t0
        out["per_shard_overhead_s"] = t0 - wl.info["work_s"]
        out["ideal_formula_without_F1"] = {str(s): wl.n_shards * t0 / (3 + 1 / s) for s in SLOWDOWNS}
    out["targets"] = targets(table)
    if wl.kind == "synthetic":  # what BSP can be at s=4 when only the work (not the overhead) is slowed
        c, o = wl.info["work_s"], out["per_shard_overhead_s"]
        bsp4 = (F1 + wl.n_shards / 4 * (4 * c + o)) / (F1 + S1)
        out["bsp_s4_over_s1_expected"] = bsp4
        for t in out["targets"]:
            if "worse" in t["target"]:
                t["measured"] += f"; expected {bsp4:.2f}x: the slowdown scales the {c * 1e3:.0f} ms step, not the {o * 1e3:.1f} ms overhead"
    return out


def targets(table: dict) -> list[dict[str, Any]]:
    out = []
    def ok(row):
        return {k: v for k, v in row.items() if "time_per_clock_s" in v}

    s4, s8, s1 = ok(table.get("4", {})), ok(table.get("8", {})), ok(table.get("1", {}))
    for strat in ("dynamic", "dynamic+backup"):
        if strat in s4:
            r = s4[strat]["ratio_to_ideal"]
            out.append({"target": f"s=4: {strat} within {TARGET_RATIO}x of ideal time/clock",
                        "measured": f"{r:.3f}x", "value": r, "met": r <= TARGET_RATIO})
    if "bsp" in s4 and "bsp" in s1:
        x = s4["bsp"]["time_per_clock_s"] / s1["bsp"]["time_per_clock_s"]
        ri = s4["bsp"]["ratio_to_ideal"]
        out.append({"target": f"s=4: BSP about {TARGET_BSP:.0f}x worse (BSP time/clock vs its s=1 time; 3.5-4.5)",
                    "measured": f"{x:.2f}x its s=1 time ({ri:.2f}x ideal)", "value": x, "met": 3.5 <= x <= 4.5})
    for strat in ("dynamic", "dynamic+backup"):
        if strat in s8 and "speedup_over_bsp" in s8[strat]:
            sp = s8[strat]["speedup_over_bsp"]
            out.append({"target": f"s=8: {strat} >= {TARGET_SPEEDUP:.0f}x faster than BSP",
                        "measured": f"{sp:.2f}x", "value": sp, "met": sp >= TARGET_SPEEDUP})
    return out


def format_table(name: str, a: dict[str, Any]) -> str:
    strats = a["strategies"]
    adaptive_na = ADAPTIVE not in strats
    lines = []
    head = f"== {name}: {a['n_shards']} shards, {a['max_clocks']} clocks"
    if "t0_shard_cycle_s" in a:
        head += (f"; work {a['info']['work_s'] * 1e3:.0f} ms/shard, measured t0 {a['t0_shard_cycle_s'] * 1e3:.1f} ms/shard "
                 f"(overhead {a['per_shard_overhead_s'] * 1e3:.1f} ms)")
    else:
        head += f"; {a['info']}"
    lines.append(head)
    lines.append(f"   ideal(s) = F1 + S1*4/(3+1/s), S1 = {a['S1_shard_phase_s'] * 1e3:.0f} ms shard phase, "
                 f"F1 = {a['F1_rest_of_clock_s'] * 1e3:.0f} ms rest of clock (s=1, {a['base_strategy']}, "
                 f"the fastest at s=1: " + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in a['base_time_per_clock_s'].items())
                 + " ms/clock)")
    if a["failed_runs"]:
        lines.append(f"   {a['failed_runs']} run(s) FAILED (engine error, excluded): "
                     + "; ".join(f"s={f['scenario']} {f['strategy']} rep {f['repeat']}: {f['error'].splitlines()[0]}"
                                 for f in a["failures"]))
    col = 27
    na_head = f" | {ADAPTIVE}" if adaptive_na else ""
    lines.append(f"{'s':>10} {'ideal ms':>9} | " + " | ".join(f"{s:^{col}}" for s in strats) + na_head)
    lines.append(f"{'':>10} {'':>9} | " + " | ".join(f"{'ms/clk  ratio  vs BSP  bkp':^{col}}" for _ in strats)
                 + (" |" if adaptive_na else ""))
    for scen in SCENARIOS:
        row = a["table"].get(str(scen), {})
        label = f"{TRANSIENT_FACTOR:.0f}x c{TRANSIENT_FROM}-{TRANSIENT_UNTIL}" if scen == TRANSIENT else str(scen)
        ideal = next((c["ideal_s"] for c in row.values() if "ideal_s" in c), float("nan"))
        cells = []
        for s in strats:
            c = row.get(s)
            if c is None or "time_per_clock_s" not in c:
                cells.append(f"{'FAILED' if c else '-':^{col}}")
                continue
            cells.append(f"{c['time_per_clock_s'] * 1e3:6.0f} {c['ratio_to_ideal']:6.2f}x {c.get('speedup_over_bsp', float('nan')):6.2f}x "
                         f"{c['backup_attempts']:4d}")
        lines.append(f"{label:>10} {ideal * 1e3:9.0f} | " + " | ".join(cells) + (" | n/a" if adaptive_na else ""))
    if adaptive_na:
        lines.append(f"   {ADAPTIVE}: n/a: {ADAPTIVE_WHY[a['kind']]}.")
    else:
        lines.append(f"   {ADAPTIVE}: the slowed worker's minibatches shrink with its measured speed (the global batch "
                     "fixed), so it does less of the work than under the other strategies; its ratio can fall below 1.")
    lines.append("   (ms/clk: median time per clock over clocks 2..N, median over repeats; transient: mean over clocks 2..N;"
                 " bkp: backup attempts fired, all repeats)")
    for t in a["targets"]:
        lines.append(f"   target: {t['target']:<74} {'MET' if t['met'] else 'NOT MET':>7}  (measured {t['measured']})")
    return "\n".join(lines)


def plot(analyses: dict[str, dict], path: str) -> None:
    plt = pyplot()
    names = list(analyses)
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    xs = list(SLOWDOWNS)
    xt = 16  # where the transient point goes
    for ax, name in zip(axes[0], names):
        tab = analyses[name]["table"]
        for strat, marker in zip(analyses[name]["strategies"], "osd^"):
            ys = [tab.get(str(s), {}).get(strat, {}).get("ratio_to_ideal", np.nan) for s in xs]
            line, = ax.plot(xs, ys, marker=marker, label=strat)
            yt = tab.get(TRANSIENT, {}).get(strat, {}).get("ratio_to_ideal", np.nan)
            ax.plot([xt], [yt], marker=marker, linestyle="none", color=line.get_color(), fillstyle="none")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.axhline(TARGET_RATIO, color="grey", linestyle=":", linewidth=0.8, label=f"{TARGET_RATIO}x target")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs + [xt])
        ax.set_xticklabels([str(s) for s in xs] + ["8x\nc2-4"])
        ax.set_xlabel("slowdown s of 1 of 4 workers")
        ax.set_ylabel("time per clock / ideal")
        ax.set_title(name)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--to-target" in argv:  # time to the model's target, SSP included: bench.time_to_target
        from bench import time_to_target

        return time_to_target.main([a for a in argv if a != "--to-target"])
    ap = argparse.ArgumentParser(prog="python -m bench.stragglers", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat, fewer clocks, small Lasso (~1-2 min)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats (default 3, 1 with --quick)")
    ap.add_argument("--json", metavar="PATH", help="write raw per-clock times, medians, ratios, events")
    ap.add_argument("--plot", metavar="PATH", default="stragglers.png", help="PNG plot (default stragglers.png)")
    ap.add_argument("--only", metavar="NAMES",
                    help="comma-separated workloads (synthetic, lasso, lda, mlr, mf, synthetic-32, ...); "
                         "lda, mlr and mf run in full mode, or with --quick when named here")
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    only = set(args.only.split(",")) if args.only else None

    t_start = time.perf_counter()
    info_before = machine_info()
    workloads = make_workloads(args.quick, only)
    runs: list[dict] = []
    with dscar.Cluster(n_workers=4) as cl:
        cl.wait_for_workers(4)
        for rep in range(repeats):
            for wl in workloads:
                order = wl.strategies
                order = order[rep % len(order):] + order[: rep % len(order)]  # rotate: no strategy always first
                for scen in SCENARIOS:
                    for strat in order:
                        r = run_one(cl, wl, scen, strat, rep)
                        runs.append(r)
                        what = (f"FAILED: {r['error'].splitlines()[0]}" if r["failed"] else
                                f"{r['time_per_clock_s'] * 1e3:7.0f} ms/clock  backups={r['events']['backup-attempt']} "
                                f"slowed-worker shards={r['slowed_worker_shards']}")
                        print(f"[{time.perf_counter() - t_start:6.0f}s] rep {rep} {wl.name:<13} s={scen!s:<9} "
                              f"{strat:<15} {what}", file=sys.stderr, flush=True)
    analyses = {}
    for wl in workloads:
        a = analyse(runs, wl)
        a["kind"] = wl.kind
        analyses[wl.name] = a
    print()
    loads = [r["loadavg_1m_after"] for r in runs if r.get("loadavg_1m_after") is not None]
    print(f"Stragglers: 4 workers, worker 0 slowed s x; {repeats} repeat(s); "
          f"{usable_cpus(info_before)} usable CPU(s); 1-min load average "
          + (f"{min(loads):.1f}..{max(loads):.1f} (median {statistics.median(loads):.1f}) during the runs" if loads else "n/a"))
    for name, a in analyses.items():
        print()
        print(format_table(name, a))
        if a["kind"] != "synthetic":
            print("   caveat: 4 CPU-bound worker processes share this machine's cores; a sleeping slowed worker frees\n"
                  "   CPU for the others, so capacities are not independent (ratios < 1 possible, BSP flattered).")
    print(f"\ntotal {time.perf_counter() - t_start:.0f}s")
    if args.plot:
        plot(analyses, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        out = {
            "quick": args.quick, "repeats": repeats, "n_workers": 4, "scenarios": [str(s) for s in SCENARIOS],
            "strategies": {**STRATEGIES, ADAPTIVE: {**ADAPTIVE_OPTS, "workloads": list(ADAPTIVE_KINDS)}},
            "transient": {"factor": TRANSIENT_FACTOR, "from": TRANSIENT_FROM, "until": TRANSIENT_UNTIL},
            "machine": {**info_before, "loadavg_after": load_average()},
            "seconds": time.perf_counter() - t_start,
            "workloads": analyses, "runs": runs,
        }
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    # re-import under the package name so SleepStep pickles as bench.stragglers.SleepStep, not __main__
    from bench.stragglers import main as _main

    sys.exit(_main())
