"""Multinomial logistic regression benchmark: dscar (1 and 2 workers) vs scikit-learn.

What it measures
----------------
For every solver, in one run, side by side: the wall time to a *target
objective* ``P(W, b) <= P* (1 + 1e-2)`` and the test accuracy of the model it
returns, where ``P`` is the regularised cross-entropy dscar's ``MLRSGD`` minimises::

    P(W, b) = 1/n sum_i CE(softmax(x_i W + b), y_i) + l2/2 ||W||_F^2   (bias not penalised)

scikit-learn's ``LogisticRegression`` (lbfgs, multinomial, ``penalty="l2"``)
minimises ``C sum_i CE + 1/2 ||W||^2``: the same problem for ``C = 1 / (n l2)``.
The target is an SGD-level precision (1 %): minibatch SGD is not a
high-precision solver; the test accuracy shows what that precision buys.

Datasets (fixed train/test splits):

* ``digits``: ``sklearn.datasets.load_digits``, stratified 75/25 split
  (``random_state=0``), standardised with the training split's mean and
  standard deviation (constant pixels: scale 1); 1347 x 64, 10 classes; ``l2 = 1e-3``.
* ``synthetic``: ``dscar.algorithms.datasets.make_classification(250_000, 100, 10, seed=0)``
  (a true multinomial logistic model, Gaussian features), rows 0..200k train,
  the last 50k test; ``l2 = 1e-4``. ``--quick``: 25k rows (20k train) x 50.

Solvers
-------
* ``scikit-learn``: ``LogisticRegression(C=1/(n l2), solver="lbfgs")``; its ``tol``
  is the loosest of 1e-2, 1e-3, ... 1e-8 that reaches the target in the untimed
  warm-up fit.
* ``sgd-ovr``: ``SGDClassifier(loss="log_loss", penalty="l2", alpha=l2)``, its
  defaults otherwise (``max_iter=1000, tol=1e-3``, "optimal" learning rate,
  ``random_state=0``). It fits *one-vs-rest* binary logistic models, not the
  multinomial one: its objective is a different function, so "reached" does not
  apply; its multinomial ``P`` (softmax of its decision function) is shown for
  information, and its time is that of its own stopping rule.
* ``dscar-1w`` / ``dscar-2w``: ``dscar.algorithms.mlr.MLRSGD`` on embedded clusters of
  1 and 2 worker processes, the same shards in both (so both run the same algorithm and,
  being deterministic, the same clocks: digits 4, the engine's default for one worker;
  synthetic 8), stopping at the first clock whose
  measured objective (of the clock-start model, over all rows) is <= the
  target (``MLRSGD(target=...)``): the time includes that last clock's updates,
  and the returned model (after it) is re-evaluated here. Settings: digits
  ``lr=1, decay=0.05`` (inverse schedule), ``momentum=0.7``, ``batch_size=32``,
  ``steps=24``; synthetic ``lr=0.5, decay=0.05``, no momentum, ``batch_size=256``,
  one pass over each shard per clock. "solve" = the clocks
  (``res.seconds - res.setup_seconds``); "total" = ``res.seconds`` (also placing
  the data on the workers).

Method: reference ``P*`` from a tight lbfgs solve (``tol=1e-10``; its gradient norm
is printed). Repeats: 3 (1 with ``--quick``), order rotated each repeat; figures
are medians, the relative objective gap is the worst over repeats. In-process
solvers run with one BLAS thread (``threadpoolctl``), and scikit-learn's lbfgs once
more with two (``scikit-learn-2t``: its only parallelism is BLAS); dscar's worker
processes are pinned to one each. Equal cores: ``dscar-1w`` against ``scikit-learn``,
``dscar-2w`` against ``scikit-learn-2t``.
Both dscar clusters are started and warmed up by one untimed fit before any timing.

Run
---
    python -m bench.mlr                 # full: a few minutes on 2 cores
    python -m bench.mlr --quick         # well under a minute
    python -m bench.mlr --json out.json # also write every figure
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from bench.common import load_average, log, machine_info, usable_cpus, write_json

TARGET = 1e-2  # relative objective gap to reach: P <= P* (1 + TARGET)
SK_TOLS = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8)
DSCAR_MAX_CLOCKS = 200
MAX_ATTEMPTS_EXTRA = 2  # extra attempts when a dscar fit fails (engine error), per repeat

IN_PROCESS = ("scikit-learn", "scikit-learn-2t", "sgd-ovr")
PEERS = {"dscar-1w": "scikit-learn", "dscar-2w": "scikit-learn-2t"}  # equal cores
DSCAR = ("dscar-1w", "dscar-2w")
SOLVERS = (*IN_PROCESS, *DSCAR)


# --------------------------------------------------------------------------- data
@dataclass
class Dataset:
    name: str
    X: np.ndarray
    y: np.ndarray
    Xte: np.ndarray
    yte: np.ndarray
    l2: float
    dscar: dict[str, Any]  # MLRSGD settings
    info: dict[str, Any]
    ref: dict[str, Any] = field(default_factory=dict)
    n_shards: int = 8  # dscar's shards, on 1 worker and on 2 alike

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def n_classes(self) -> int:
        return int(self.y.max()) + 1

    def objective(self, W: np.ndarray, b: np.ndarray) -> float:
        from dscar.algorithms.mlr import objective

        return objective(self.X, self.y, W, b, self.l2)

    def rel_gap(self, W, b) -> float:
        return (self.objective(W, b) - self.ref["P_star"]) / self.ref["P_star"]

    def accuracy(self, W, b) -> float:
        return float(np.mean(np.argmax(self.Xte @ W + b, axis=1) == self.yte))


def make_datasets(quick: bool) -> list[Dataset]:
    from dscar.algorithms.datasets import make_classification
    from dscar.algorithms.mlr import load_digits_split

    Xtr, Xte, ytr, yte = load_digits_split(test_size=0.25, seed=0)
    digits = Dataset("digits", Xtr, ytr, Xte, yte, 1e-3,
                     dict(lr=1.0, decay=0.05, momentum=0.7, batch_size=32, steps=24),
                     {"source": "sklearn.datasets.load_digits, stratified 75/25 split (random_state=0), "
                                "standardised with the training split's statistics"}, n_shards=4)
    n_train, n_test, p = (20_000, 5_000, 50) if quick else (200_000, 50_000, 100)
    X, y, _ = make_classification(n_train + n_test, p, 10, seed=0)
    synth = Dataset("synthetic", X[:n_train], y[:n_train], X[n_train:], y[n_train:], 1e-4,
                    dict(lr=0.5, decay=0.05, momentum=0.0, batch_size=256, steps=None),
                    {"source": f"make_classification({n_train + n_test}, {p}, 10, seed=0): first {n_train} "
                               f"rows train, last {n_test} test"})
    out = [digits, synth]
    for d in out:
        d.info.update(n_train=d.n, n_test=len(d.yte), n_features=d.X.shape[1], n_classes=d.n_classes, l2=d.l2,
                      sklearn_C=1.0 / (d.n * d.l2))
    return out


def reference(d: Dataset) -> None:
    """``P*`` from a tight lbfgs solve, with the gradient norm of ``P`` there."""
    from sklearn.linear_model import LogisticRegression

    from dscar.algorithms.mlr import MLRSGD

    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = LogisticRegression(C=1.0 / (d.n * d.l2), tol=1e-10, max_iter=100_000).fit(d.X, d.y)
    W, b = m.coef_.T.copy(), m.intercept_.copy()
    gW, gb = MLRSGD._grad(np, d.X, d.y, np.arange(d.n), W, b)
    grad = np.concatenate([(gW / d.n + d.l2 * W).ravel(), gb / d.n])
    d.ref = {"solver": "LogisticRegression(lbfgs, tol=1e-10)", "seconds": time.perf_counter() - t,
             "P_star": d.objective(W, b), "grad_norm": float(np.linalg.norm(grad)), "n_iter": int(m.n_iter_[0]),
             "test_accuracy": d.accuracy(W, b)}


# --------------------------------------------------------------------------- solvers
class Fit(NamedTuple):
    seconds: float  # solve
    W: np.ndarray  # features x classes
    b: np.ndarray
    n_iter: int
    total_seconds: float  # including data placement (== seconds in process)
    extra: dict[str, Any]


def run_sklearn(d: Dataset, tol: float, threads: int = 1) -> Fit:
    import threadpoolctl
    from sklearn.linear_model import LogisticRegression

    m = LogisticRegression(C=1.0 / (d.n * d.l2), tol=tol, max_iter=10_000)
    t = time.perf_counter()
    with warnings.catch_warnings(), threadpoolctl.threadpool_limits(threads, user_api="blas"):
        warnings.simplefilter("ignore")
        m.fit(d.X, d.y)
    s = time.perf_counter() - t
    return Fit(s, m.coef_.T.copy(), m.intercept_.copy(), int(m.n_iter_[0]), s, {})


def run_sgd(d: Dataset) -> Fit:
    from sklearn.linear_model import SGDClassifier

    m = SGDClassifier(loss="log_loss", penalty="l2", alpha=d.l2, random_state=0)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.fit(d.X, d.y)
    s = time.perf_counter() - t
    return Fit(s, m.coef_.T.copy(), m.intercept_.copy(), int(m.n_iter_), s, {})


def run_dscar(cl, d: Dataset) -> Fit:
    import dscar
    from dscar.algorithms.mlr import MLRSGD

    target = d.ref["P_star"] * (1 + TARGET)
    algo = MLRSGD(d.n_classes, l2=d.l2, target=target, **d.dscar)
    res = dscar.fit(algo, {"X": d.X, "y": d.y}, cl, n_shards=d.n_shards, max_clocks=DSCAR_MAX_CLOCKS,
                    progress=False)
    extra = {"setup_s": res.setup_seconds, "converged": res.converged, "n_shards": d.n_shards,
             "clocks": [{"clock": r.clock, "seconds": r.seconds, **r.metrics} for r in res.history]}
    return Fit(res.seconds - res.setup_seconds, res.params["W"][:-1].copy(), res.params["W"][-1].copy(), res.n_clocks,
               res.seconds, extra)


# --------------------------------------------------------------------------- analysis / output
def summarise(d: Dataset, name: str, fits: list[Fit], failures: list[str], settings: dict) -> dict[str, Any]:
    gaps = [d.rel_gap(f.W, f.b) for f in fits]
    accs = [d.accuracy(f.W, f.b) for f in fits]
    out: dict[str, Any] = {
        "settings": settings, "repeats": len(fits), "failures": failures,
        "solve_s": [f.seconds for f in fits], "total_s": [f.total_seconds for f in fits],
        "rel_objective_gap": gaps, "test_accuracy": accs, "n_iter": [f.n_iter for f in fits],
    }
    if fits:
        out.update(median_solve_s=statistics.median(out["solve_s"]), median_total_s=statistics.median(out["total_s"]),
                   worst_rel_objective_gap=max(gaps), median_test_accuracy=statistics.median(accs))
        if name in DSCAR:  # stopped by the target rule: the clock-start model of the last clock reached it
            out["stop_rule_reached"] = all(f.extra["converged"] for f in fits)
        out["reached"] = None if name == "sgd-ovr" else bool(max(gaps) <= TARGET)
    else:
        out["reached"] = False
    if name in DSCAR and fits:
        out["clocks"] = [f.extra["clocks"] for f in fits]
        out["median_clock_s"] = statistics.median(c["seconds"] for f in fits for c in f.extra["clocks"])
        out["median_setup_s"] = statistics.median(f.extra["setup_s"] for f in fits)
    return out


def format_dataset(d: Dataset, res: dict[str, dict]) -> str:
    i, ref = d.info, d.ref
    lines = [f"== {d.name}: {i['n_train']} train / {i['n_test']} test x {i['n_features']}, {i['n_classes']} classes "
             f"({i['source']}); l2 = {d.l2:g} (scikit-learn C = 1/(n l2) = {i['sklearn_C']:.4g})",
             f"   P* = {ref['P_star']:.10g} ({ref['solver']}, {ref['n_iter']} iterations, ||grad P|| = "
             f"{ref['grad_norm']:.1e}, test accuracy {ref['test_accuracy']:.4f}); target P <= P* (1 + {TARGET:g})"]
    hdr = (f"{'solver':<15} {'settings':<34} {'solve s':>8} {'total s':>8} {'rep':>3} {'rel. obj. gap':>13} "
           f"{'reached':>11} {'iters':>5} {'test acc':>8}")
    lines += [hdr, "-" * len(hdr)]
    for name in SOLVERS:
        r = res.get(name)
        if r is None:
            continue
        st = r["settings"]
        if not r.get("repeats"):
            lines.append(f"{name:<15} {st['label']:<34} {'FAILED':>8}  {'; '.join(r['failures'])[:80]}")
            continue
        reached = "n/a (OvR)" if r["reached"] is None else "yes" if r["reached"] else "NOT REACHED"
        it = r["n_iter"]
        its = str(it[0]) if len(set(it)) == 1 else f"{min(it)}-{max(it)}"
        fail = f"  ({len(r['failures'])} failed attempt(s))" if r["failures"] else ""
        lines.append(f"{name:<15} {st['label']:<34} {r['median_solve_s']:8.3f} {r['median_total_s']:8.3f} "
                     f"{r['repeats']:>3} {r['worst_rel_objective_gap']:13.2e} {reached:>11} {its:>5} "
                     f"{r['median_test_accuracy']:8.4f}{fail}")
    lines.append("   medians over repeats; rel. obj. gap = (P - P*)/P* of the returned model, worst over repeats; "
                 "iters: lbfgs iterations,\n   epochs (sgd-ovr), clocks (dscar); total = solve + placing the data "
                 "on the workers (dscar)")
    for dn, pn in PEERS.items():  # equal cores
        sk, ds = res.get(pn, {}), res.get(dn, {})
        if "median_solve_s" in sk and "median_solve_s" in ds:
            lines.append(f"   {dn} / {pn} (equal cores) time to target: solve "
                         f"{ds['median_solve_s'] / sk['median_solve_s']:.2f}x, total "
                         f"{ds['median_total_s'] / sk['median_total_s']:.2f}x; test accuracy {dn} - {pn} = "
                         f"{100 * (ds['median_test_accuracy'] - sk['median_test_accuracy']):+.2f} points")
    for name in DSCAR:
        r = res.get(name, {})
        if "median_clock_s" in r:
            lines.append(f"   {name}: median clock {1e3 * r['median_clock_s']:.1f} ms, setup {r['median_setup_s']:.2f} s")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.mlr", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small synthetic data, 1 repeat")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (default 3, 1 with --quick)")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON (and a plot next to it)")
    ap.add_argument("--plot", metavar="PATH", help="the plot's path (default: the JSON's, .png)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    warnings.filterwarnings("ignore", message=r"Port \d+ is already in use")

    import threadpoolctl

    import dscar

    t0 = time.perf_counter()
    machine = machine_info(versions=("sklearn",), threadpools=True)
    blas = threadpoolctl.threadpool_limits(1, user_api="blas")  # in-process solvers: see the docstring
    datasets = make_datasets(args.quick)
    for d in datasets:
        reference(d)
        log(t0, f"{d.name}: P* = {d.ref['P_star']:.10g} in {d.ref['seconds']:.1f}s, |grad| {d.ref['grad_norm']:.1e}")

    settings: dict[str, dict[str, dict[str, Any]]] = {}
    for d in datasets:  # choosing runs = untimed warm-ups of the in-process solvers
        s: dict[str, dict[str, Any]] = {}
        for tol in SK_TOLS:
            f = run_sklearn(d, tol)
            g = d.rel_gap(f.W, f.b)
            s["scikit-learn"] = {"tol": tol, "label": f"lbfgs tol={tol:g}", "warmup_rel_gap": g,
                                 "why": "loosest tol of 1e-2..1e-8 reaching the target in the warm-up"}
            if g <= TARGET:
                break
        s["scikit-learn-2t"] = {**s["scikit-learn"], "label": f"lbfgs tol={s['scikit-learn']['tol']:g}, 2 BLAS thr"}
        f = run_sgd(d)
        s["sgd-ovr"] = {"label": f"SGDClassifier alpha={d.l2:g}", "warmup_rel_gap": d.rel_gap(f.W, f.b),
                        "why": "scikit-learn defaults; one-vs-rest, not the multinomial objective"}
        dk = (f"lr={d.dscar['lr']:g}, mom={d.dscar['momentum']:g}, batch={d.dscar['batch_size']}, "
              f"steps={d.dscar['steps'] or '1 pass'}, {d.n_shards} shards")
        for name in DSCAR:
            s[name] = {**d.dscar, "label": dk,
                       "n_shards": d.n_shards, "target": d.ref["P_star"] * (1 + TARGET)}
        settings[d.name] = s
        log(t0, f"{d.name}: scikit-learn tol {s['scikit-learn']['tol']:g}")

    fits: dict[str, dict[str, list[Fit]]] = {d.name: {s: [] for s in SOLVERS} for d in datasets}
    fails: dict[str, dict[str, list[str]]] = {d.name: {s: [] for s in SOLVERS} for d in datasets}

    def one(name: str, d: Dataset, clusters: dict[str, Any]) -> Fit | None:
        if name.startswith("scikit-learn"):
            return run_sklearn(d, settings[d.name]["scikit-learn"]["tol"], 2 if name.endswith("2t") else 1)
        if name == "sgd-ovr":
            return run_sgd(d)
        try:
            return run_dscar(clusters[name], d)
        except dscar.DscarError as e:  # an engine failure is recorded, the benchmark goes on
            fails[d.name][name].append(f"{type(e).__name__}: {str(e).splitlines()[0]}")
            log(t0, f"{d.name} {name} FAILED: {fails[d.name][name][-1]}")
            return None

    worker_threadpools: dict[str, Any] = {}
    with dscar.Cluster(n_workers=1) as c1, dscar.Cluster(n_workers=2) as c2:
        clusters = {"dscar-1w": c1, "dscar-2w": c2}
        for name, cl in clusters.items():
            cl.wait_for_workers(int(name[-2]))
            cl.client.run(lambda: threadpoolctl.threadpool_limits(1) and None)  # 1 BLAS thread per worker process
            worker_threadpools[name] = cl.client.run(threadpoolctl.threadpool_info)
            for d in datasets:  # warm-up (untimed)
                f = one(name, d, clusters)
                if f is not None:
                    log(t0, f"{d.name} {name} warm-up: {f.total_seconds:.2f}s, {f.n_iter} clocks, "
                             f"rel gap {d.rel_gap(f.W, f.b):.1e}")
        order = list(SOLVERS)
        for rep in range(repeats):
            rot = order[rep % len(order):] + order[: rep % len(order)]
            for d in datasets:
                for name in rot:
                    f = None
                    for _ in range(1 + (MAX_ATTEMPTS_EXTRA if name in DSCAR else 0)):
                        f = one(name, d, clusters)
                        if f is not None:
                            break
                    if f is None:
                        continue
                    fits[d.name][name].append(f)
                    log(t0, f"rep {rep} {d.name:<9} {name:<12} solve {f.seconds:7.3f}s total {f.total_seconds:7.3f}s "
                             f"iters {f.n_iter:4d} rel gap {d.rel_gap(f.W, f.b):.1e} test acc {d.accuracy(f.W, f.b):.4f}")
    blas.restore_original_limits()

    results: dict[str, Any] = {}
    print()
    print(f"Multinomial logistic regression: time to P <= P*(1 + {TARGET:g}) and test accuracy; {repeats} repeat(s); "
          f"{usable_cpus(machine)} usable CPU(s), load avg before "
          f"{', '.join(f'{x:.1f}' for x in machine.get('loadavg', ()))}")
    print("P = mean cross-entropy + l2/2 ||W||^2 (bias free) = scikit-learn's objective / (C n) with C = 1/(n l2)")
    print("Cores: scikit-learn and sgd-ovr on 1 BLAS thread, scikit-learn-2t (lbfgs) on 2 (threadpoolctl); dscar-Nw = "
          "N worker processes x 1 thread (BLAS pinned to 1); dscar-1w is compared with scikit-learn, dscar-2w with "
          f"scikit-learn-2t; load average now {load_average()}")
    for d in datasets:
        res = {name: summarise(d, name, fits[d.name][name], fails[d.name][name], settings[d.name][name])
               for name in SOLVERS}
        results[d.name] = {"info": d.info, "reference": d.ref, "solvers": res}
        print()
        print(format_dataset(d, res))
    total = time.perf_counter() - t0
    print(f"\ntotal {total:.0f}s")
    if args.json:
        machine["worker_threadpools"] = worker_threadpools
        machine["loadavg_after"] = load_average()
        out = {"quick": args.quick, "repeats": repeats, "target_rel_gap": TARGET, "solvers": list(SOLVERS),
               "machine": machine, "seconds": total, "datasets": results}
        write_json(args.json, out)
    png = args.plot or (os.path.splitext(args.json)[0] + ".png" if args.json else None)
    if png:
        from bench.lasso import plot_solve_times

        plot_solve_times(png, results, SOLVERS, f"solve s to P*(1 + {TARGET:g}) (grey: not reached)")
    return 0


if __name__ == "__main__":
    from bench.mlr import main as _main  # under the package name (pickling, one module object)

    sys.exit(_main())
