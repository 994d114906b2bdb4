"""Does a second worker help? Time for 1 and for 2 workers to reach the same target, and where a clock's time goes.

What it measures
----------------
For each case, an embedded cluster of 1 worker process and one of 2 (one thread each, BLAS and
numba pinned to 1 thread) fit the same model on the same data with the engine's default shard
count (``dscar.api.driver.default_n_shards``; ``--shards-per-worker N`` fixes it):

* ``lda``  LDA, K = 200 (20 with ``--quick``), on the ``lda`` package's Reuters corpus;
* ``als``  ALS, rank 20, on 70k generated ratings (3k users x 1k items; 20k with ``--quick``);
* ``mlr``  MLR by local SGD on scikit-learn's digits;
* ``lda-large`` / ``als-large`` (not with ``--quick``; ``--cases`` picks): a 50k-document synthetic
  corpus (K = 50) and 1 M ratings (30k users x 5k items).

Target: the objective the 1-worker fit reached at clock ``clocks`` of the case, loosened by
``TARGET_SLACK`` relative (every case's objective is minimised). Time to target: the clocks' wall
seconds (``ClockRecord.seconds``, setup and the final gather left out) summed up to the first clock
whose objective reaches it; over the repeats, each clock's median seconds summed up to the median
number of clocks to the target (``median_time_to``; the median of the repeats' own times is
``fit_time_s`` in the JSON); ``ratio`` = 1-worker time / 2-worker time (> 1: the second worker helps).
A 2-worker fit that never reaches it within ``2 x clocks`` shows ``inf``.

Both fits are asked for the same ``2 x clocks`` clocks (``fit_clocks``): a fit's last clock is
cheaper than the others (no next clock begins beside its report: ``dscar.auto-begin``), so a
1-worker fit stopped at the target clock would be timed on a cheaper clock than the 2-worker one
(ALS ``--quick``: ~1 ms of a ~75 ms time to target). Both clusters stay up side by side and the
repeats alternate between them (``rep_order``), so a change of the shared machine's load hits both.

Where a clock goes (median over the clocks after the first, ms), from the coordinator's stage
times (``ClockRecord.stage_s``) and the workers' step timings (``ClockRecord.timings``, the slowest
worker): ``shards`` (first grant to last commit: the steps themselves are ``pull`` + ``compute`` +
``push``; ``cpu_share``: the steps' CPU seconds over their wall seconds, below 1 where a step waited
for a core), ``apply``, ``clock_end`` (its ``clock_end_compute`` is the algorithm's own work),
``other`` (the clock's wall time less the stages: the driver's begin/report round trips), ``busy``
(how many workers ran a shard step in the clock: an active worker can run none), and the
scheduler event loop's CPU per clock (``time.thread_time`` on that thread: the timed fit's less a
2-clock fit's, over the clocks between, so setup and the final gather cancel).

Both fits run with ``dscar.active-workers`` "auto", the default (``--active-workers all`` keeps every
worker active, as dscar did before issue 43): on 2 workers the engine may keep one active and the
other standing by, where the clock is too small to pay for the second; ``active`` says how many were
active at the end of the fit (median).

Acceptance (issue 43): where one worker's clock takes >= 20 ms, 2 workers >= 1.3x faster; in the
smaller cases (MLR on digits) at most 10 % slower. The machine is shared: the load average is
printed with the figures, and before/after comparisons must be side by side.

Usage: ``python -m bench.scaling [--quick] [--cases lda,als,mlr] [--repeats N] [--active-workers auto|all]
[--json PATH] [--plot PATH]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_k, "1")  # inherited by the worker processes

import dask.config  # noqa: E402
import numpy as np  # noqa: E402

import dscar  # noqa: E402
from bench.common import load_average, log, machine_info, pyplot, warn_busy, write_json  # noqa: E402

#: the target: the 1-worker fit's objective at the case's ``clocks`` (``target_of``), loosened by this much (relative)
TARGET_SLACK = 2e-3
#: acceptance: a case whose 1-worker clock takes at least this long must gain SPEEDUP_MIN from a second worker
BIG_CLOCK_S = 0.020
SPEEDUP_MIN = 1.3
#: ... and a smaller one may lose at most this much (2-worker time / 1-worker time)
SLOWDOWN_MAX = 1.10


@dataclass
class Case:
    name: str
    clocks: int
    #: () -> (algorithm, data): a fresh algorithm each fit
    make: Callable[[], tuple[Any, Any]]


def lda_case(quick: bool, large: bool = False) -> Case:
    from dscar.algorithms import corpora
    from dscar.algorithms.lda import LDAGibbs, lda_data

    if large:
        c, K, clocks = corpora.synthetic(50_000, 20_000, 100, 50, seed=0), 50, 20
    else:
        c, K, clocks = corpora.reuters(), (20 if quick else 200), (6 if quick else 30)
    data = lda_data(c.X)
    return Case("lda-large" if large else "lda", clocks,
                lambda: (LDAGibbs(K, 0.1, 0.01, seed=0, early_stop=False), data))


def als_case(quick: bool, large: bool = False) -> Case:
    from dscar.algorithms.datasets import make_ratings
    from dscar.algorithms.mf import ALS, train_test_split

    nu, ni, n = (30_000, 5_000, 1_000_000) if large else ((2_000, 500, 20_000) if quick else (3_000, 1_000, 70_000))
    u, i, r, _ = make_ratings(nu, ni, n, 20, 0.5, seed=0)
    train, test = train_test_split(u, i, r, 0.2, seed=0)
    mean = float(train[2].mean())
    return Case("als-large" if large else "als", 6 if quick else 10,
                lambda: (ALS(nu, ni, 20, reg=0.05, mean=mean, tol=1e-12),
                                       (train, test, nu, ni)))


def mlr_case(quick: bool) -> Case:
    from dscar.algorithms.mlr import MLRSGD, load_digits_split

    X, _, y, _ = load_digits_split(test_size=0.25, seed=0)
    return Case("mlr", 8 if quick else 15,
                lambda: (MLRSGD(int(y.max()) + 1, l2=1e-3, lr=1.0, decay=0.05, momentum=0.7, batch_size=32, steps=24,
                                tol=1e-12), {"X": X, "y": y}))


def _data(case: Case, data: Any, n_workers: int, spw: int | None) -> tuple[Any, int | None]:
    """The fit's data and ``n_shards`` (None: the engine's default)."""
    if case.name.startswith("als"):
        from dscar.algorithms.mf import ratings_data

        train, test, nu, ni = data
        if spw is None:  # ratings_data needs a count: the engine's default for one phase's data
            from dscar.api.driver import _data_size, active_start, default_n_shards

            phase = {"row": train[0], "col": train[1], "rating": train[2]}
            start = active_start(n_workers, {"user": phase, "item": phase})  # (the workers the fit starts on)
            spw_n = default_n_shards(start, *_data_size(phase))
        else:
            spw_n = spw * n_workers
        return ratings_data(train, test, n_users=nu, n_items=ni, n_shards=spw_n), None
    return data, (None if spw is None else spw * n_workers)


def loop_cpu_s() -> float:
    """CPU seconds of the thread this runs on: the scheduler's event loop (``run_on_scheduler``)."""
    return time.thread_time()


def split(res: dscar.FitResult) -> dict[str, float]:
    """Median ms per clock (after the first) of each part of a clock (module docstring)."""
    recs = [r for r in res.history[1:] if not r.skipped] or res.history
    keys = ("shards", "apply", "clock_end", "clock_end_compute")
    out = {k: 1e3 * statistics.median(r.stage_s.get(k, 0.0) for r in recs) for k in keys}
    for part in ("pull_s", "compute_s", "compute_cpu_s", "push_s"):
        out[part[:-2]] = 1e3 * statistics.median(max((t.get(part, 0.0) for t in r.timings.values()), default=0.0)
                                                  for r in recs)
    # the steps' CPU over their wall time (the slowest worker's): below 1, a step waited for a core
    out["cpu_share"] = out["compute_cpu"] / out["compute"] if out["compute"] > 0 else float("nan")
    out["clock"] = 1e3 * statistics.median(r.seconds for r in recs)
    out["other"] = 1e3 * statistics.median(
        r.seconds - sum(r.stage_s.get(k, 0.0) for k in ("rebuild", "shards", "apply", "clock_end")) for r in recs)
    out["n_shards"] = sum(recs[-1].shards_per_worker.values())
    # workers that ran a shard step: an active worker may run none (a worker that asks first can take a
    # whole pass of short steps in one work item, ``dispatch.BATCH_TARGET_S``) and still hold partitions
    out["busy"] = statistics.median(sum(1 for n in r.shards_per_worker.values() if n > 0) for r in recs)
    return out


def time_to(res: dscar.FitResult, target: float) -> float:
    """Seconds of clocks until the objective first reaches ``target`` (inf: never)."""
    total = 0.0
    for r in res.history:
        total += r.seconds
        if r.objective <= target:
            return total
    return float("inf")


def clocks_to(res: dscar.FitResult, target: float) -> int | None:
    """How many clocks until the objective first reaches ``target`` (None: never)."""
    return next((i + 1 for i, r in enumerate(res.history) if r.objective <= target), None)


def median_time_to(seconds: list[list[float]], clocks: list[int | None]) -> float:
    """Time to target over repeats: each clock's median seconds over the repeats (``seconds[rep][clock]``),
    summed over the median number of clocks to the target (``clocks``, one per repeat; None: never).

    A burst of the shared machine's load lands on one clock of one repeat; a clock's median leaves
    it out, where the median of the repeats' totals keeps it whenever it hit most of them (a quick
    fit's whole time to target is ~0.1 s, a handful of such bursts)."""
    k = statistics.median_high([float("inf") if c is None else c for c in clocks])
    if k == float("inf"):
        return k
    return sum(statistics.median(s[j] for s in seconds if len(s) > j) for j in range(int(k)))


def one_fit(cl: dscar.Cluster, case: Case, n_workers: int, clocks: int, spw: int | None,
            active: str = "auto") -> tuple[dscar.FitResult, float]:
    """A fit of ``clocks`` clocks and the scheduler loop's CPU seconds over it (setup and gather included);
    ``active``: ``dscar.active-workers``."""
    with dask.config.set({"dscar.active-workers": active}):
        algo, data = case.make()
        data, n_shards = _data(case, data, n_workers, spw)
        cpu = cl.client.run_on_scheduler(loop_cpu_s)
        res = dscar.fit(algo, data, cl, n_shards=n_shards, max_clocks=clocks, progress=False)
    return res, cl.client.run_on_scheduler(loop_cpu_s) - cpu


def fit_clocks(case: Case) -> int:
    """The clocks every timed fit is asked for, on 1 worker as on 2: room for the 2-worker fit to need
    more clocks than the 1-worker one, and the target clock never the last of either (module docstring)."""
    return 2 * case.clocks


def target_of(res: dscar.FitResult, case: Case) -> float:
    """The target: the objective of ``res`` (a 1-worker fit) at clock ``case.clocks``, loosened by
    ``TARGET_SLACK``."""
    return res.history[case.clocks - 1].objective * (1 + TARGET_SLACK)


def rep_order(rep: int) -> tuple[int, int]:
    """The worker counts in the order repeat ``rep`` runs them: alternating, so neither side always
    runs first."""
    return (1, 2) if rep % 2 == 0 else (2, 1)


def run_case(case: Case, repeats: int, spw: int | None, t0: float, active: str = "auto") -> dict[str, Any]:
    runs: dict[int, list[dict]] = {1: [], 2: []}
    target = None
    clusters: dict[int, dscar.Cluster] = {}
    try:
        for w in (1, 2):
            clusters[w] = dscar.Cluster(n_workers=w, set_as_default=False)
            clusters[w].wait_for_workers(w)
            one_fit(clusters[w], case, w, 2, spw, active)  # warm the processes: imports, compiled kernels, connections
        for rep in range(repeats):
            for w in rep_order(rep):
                cl = clusters[w]
                # the scheduler's CPU per clock: a long fit's less a 2-clock one's (setup and gather cancel)
                short, cpu_short = one_fit(cl, case, w, 2, spw, active)
                res, cpu_long = one_fit(cl, case, w, fit_clocks(case), spw, active)
                cpu_ms = (cpu_long - cpu_short) / max(res.n_clocks - short.n_clocks, 1) * 1e3
                if target is None:  # (repeat 0 runs the 1-worker fit first)
                    target = target_of(res, case)
                r = {"time_s": time_to(res, target), "clocks_to_target": clocks_to(res, target), "sched_cpu_ms": cpu_ms,
                     **split(res), "active": res.active_workers, "objectives": [h.objective for h in res.history],
                     "clock_s": [h.seconds for h in res.history]}
                runs[w].append(r)
                log(t0, f"{case.name} {w}w rep {rep}: {r['time_s']:.3f} s to target, {r['clock']:.1f} ms/clock, "
                        f"{r['n_shards']} shards, {r['active']} active")
    finally:
        for cl in clusters.values():
            cl.close()
    per_rep = ("objectives", "clock_s", "clocks_to_target")
    med = {w: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in per_rep} for w, rs in runs.items()}
    for w, rs in runs.items():  # (the median of the repeats' own times stays, as ``fit_time_s``)
        med[w]["fit_time_s"] = med[w]["time_s"]
        med[w]["time_s"] = median_time_to([r["clock_s"] for r in rs], [r["clocks_to_target"] for r in rs])
    t1, t2 = med[1]["time_s"], med[2]["time_s"]
    ratio = t1 / t2 if t2 > 0 else float("nan")
    big = med[1]["clock"] >= BIG_CLOCK_S * 1e3
    met = ratio >= SPEEDUP_MIN if big else (t2 / t1 <= SLOWDOWN_MAX)
    return {"case": case.name, "clocks": case.clocks, "target": target, "by_workers": med,
            "runs": {str(w): rs for w, rs in runs.items()}, "ratio_1w_over_2w": ratio,
            "criterion": f">= {SPEEDUP_MIN}x" if big else f"2w <= {SLOWDOWN_MAX}x 1w's time", "met": bool(met)}


def format_tables(rows: list[dict]) -> str:
    lines = [f"{'case':<10} {'target':>10} {'1w s':>8} {'2w s':>8} {'2w active':>9} {'1w/2w':>6}  criterion"]
    for r in rows:
        b = r["by_workers"]
        lines.append(f"{r['case']:<10} {r['target']:>10.5g} {b[1]['time_s']:>8.3f} {b[2]['time_s']:>8.3f} "
                     f"{b[2]['active']:>9.3g} {r['ratio_1w_over_2w']:>6.2f}  {r['criterion']}: "
                     f"{'MET' if r['met'] else 'NOT MET'}")
    lines.append("")
    lines.append("where a clock goes (median ms per clock; pull/compute/push: the slowest worker's steps)")
    cols = ("n_shards", "active", "busy", "clock", "shards", "pull", "compute", "cpu_share", "push", "apply",
            "clock_end", "clock_end_compute", "other", "sched_cpu_ms")
    lines.append(f"{'case':<10} {'W':>2} " + " ".join(f"{c[:9]:>9}" for c in cols))
    for r in rows:
        for w, m in r["by_workers"].items():
            lines.append(f"{r['case']:<10} {w:>2} " + " ".join(f"{m[c]:>9.3g}" if c in ("n_shards", "active", "busy")
                                                            else f"{m[c]:>9.2f}" for c in cols))
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(rows))
    for k, (w, c) in enumerate(((1, "tab:blue"), (2, "tab:orange"))):
        a1.bar(x + (k - 0.5) * 0.4, [r["by_workers"][w]["time_s"] for r in rows], 0.4, color=c, label=f"{w} worker(s)")
    a1.set_xticks(x, [r["case"] for r in rows])
    a1.set_ylabel("seconds to target")
    a1.set_yscale("log")
    a1.legend()
    a1.set_title("time to the same target")
    a2.bar(x, [r["ratio_1w_over_2w"] for r in rows], color="tab:green")
    a2.axhline(SPEEDUP_MIN, color="r", ls="--", label=f"{SPEEDUP_MIN}x (clocks >= {BIG_CLOCK_S * 1e3:g} ms)")
    a2.axhline(1 / SLOWDOWN_MAX, color="k", ls=":", label=f"1/{SLOWDOWN_MAX} (smaller cases)")
    a2.set_xticks(x, [r["case"] for r in rows])
    a2.set_ylabel("1w time / 2w time")
    a2.legend(fontsize=8)
    a2.set_title("speed-up from a second worker")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 repeat (~1 min)")
    ap.add_argument("--cases", default=None, help="comma-separated: lda,als,mlr,lda-large,als-large "
                                                   "(default lda,als,mlr; the large ones too without --quick)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats (default 3, 1 with --quick)")
    ap.add_argument("--shards-per-worker", type=int, default=None, help="fix the shard count (default: the engine's)")
    ap.add_argument("--active-workers", choices=("auto", "all"), default="auto",
                    help="dscar.active-workers for every fit (default auto, the engine's default)")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    ap.add_argument("--plot", metavar="PATH", default="scaling.png", help="PNG plot (default scaling.png)")
    args = ap.parse_args(argv)
    warn_busy()
    repeats = args.repeats or (1 if args.quick else 3)
    names = args.cases.split(",") if args.cases else (["lda", "als", "mlr"] + ([] if args.quick else ["lda-large", "als-large"]))
    makers = {"lda": lambda: lda_case(args.quick), "als": lambda: als_case(args.quick), "mlr": lambda: mlr_case(args.quick),
              "lda-large": lambda: lda_case(args.quick, True), "als-large": lambda: als_case(args.quick, True)}
    unknown = [n for n in names if n not in makers]
    if unknown:
        ap.error(f"unknown case(s) {unknown}: choose from {sorted(makers)}")
    t0 = time.perf_counter()
    machine = machine_info(threadpools=True)
    rows = [run_case(makers[n](), repeats, args.shards_per_worker, t0, args.active_workers) for n in names]
    load = load_average()
    print(f"\nA second worker: time to the 1-worker fit's objective at the case's clocks (x {1 + TARGET_SLACK:g}); "
          f"each clock's median over {repeats} repeat(s), summed to the median clock count to the target "
          f"(the median of the repeats' own times: fit_time_s in --json); "
          f"shards: {args.shards_per_worker or 'engine default'} per worker; "
          f"dscar.active-workers: {args.active_workers}")
    print(f"load average: {', '.join(f'{x:.2f}' for x in load) if load else 'n/a'}")
    print(format_tables(rows))
    print(f"total {time.perf_counter() - t0:.0f}s")
    if args.plot:
        plot(rows, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        write_json(args.json, {"quick": args.quick, "repeats": repeats, "cases": rows,
                               "shards_per_worker": args.shards_per_worker, "target_slack": TARGET_SLACK,
                               "active_workers": args.active_workers,
                               "machine": {**machine, "loadavg_after": load}, "seconds": time.perf_counter() - t0})
    return 0


if __name__ == "__main__":
    from bench.scaling import main as _main

    sys.exit(_main())
