"""Explicit matrix factorization benchmark: dscar's ALS on 1 and 2 workers vs lenskit on 1 and 2 threads.

What it measures
----------------
For every solver, in one run, side by side on the same data: the wall time per
iteration (median over the iterations; an ALS iteration solves every user row
then every item row) and the test RMSE after ``--iters`` iterations.

Data: ``dscar.algorithms.datasets.make_ratings`` (a planted rank-20 model with user /
item biases, power-law activity, rating noise ``N(0, 0.5^2)``: the best
reachable test RMSE is 0.5), split by ``dscar.algorithms.mf.train_test_split`` (20 %
held out, warm users and items only):

* ``small``: 3k users x 1k items x 70k ratings (synthetic, the size of the real 66k-rating
  set of issue 10), at ``reg`` 0.1 and 3 (strong regularisation); ``--quick``: 2k x 500 x 20k;
* ``large``: 100k users x 20k items x 5M ratings (not with ``--quick``).

Equal cores. Every table row says how many cores the solver had: dscar on an embedded
cluster of 1 (``dscar-1w-*``) or 2 (``dscar-2w-*``) worker processes of one thread each
(the compiled ALS kernel uses no BLAS; the workers' BLAS pools are pinned to 1 thread by
threadpoolctl), lenskit on 1 or 2 threads (``LK_NUM_THREADS`` = ``LK_NUM_BACKEND_THREADS`` =
its rayon pool and its torch / BLAS pools, set before lenskit is imported, in a child process
per thread count). Ratios compare equal cores: ``dscar-1w`` over ``lenskit-1t``, ``dscar-2w``
over ``lenskit-2t``. The load average is printed with every table.

Pair by pair. ``--repeats R`` (default 3; 1 with ``--quick``) runs every timed solver R
times, interleaved (a repeat runs dscar-1w, lenskit-1t, dscar-2w, lenskit-2t one after the
other, both dscar clusters kept up), so a slow minute of a shared machine hits both sides of a
comparison: the table gives each solver's median over the repeats, and under it the ratio
dscar / lenskit of every repeat (same cores, same repeat) with their median.

Solvers (rank 20 everywhere; regularization ``reg`` weighted by each row's rating count,
the weighted-lambda form both dscar's and lenskit's ALS use):

* ``dscar-Nw-64`` / ``dscar-Nw-32``: ``dscar.algorithms.mf.ALS`` (biases learned jointly with their
  own ridge ``bias_reg = 5``; the normal equations accumulated in float64, or float32 as lenskit),
  4 shards per worker and phase (dscar's default). Time per iteration: the clock's wall time seen by the driver
  (``ClockRecord.seconds``: both phases, all coordination and the metrics). Its test RMSE is the
  per-clock metric the job computes.
* ``lenskit-Nt``: ``lenskit.als.BiasedMFScorer`` (lenskit 2025, Rust kernel; float32, fixed
  biases damped by 5, weighted reg ``reg``), trained epoch by epoch with its trainer; test
  RMSE from its embeddings and bias model, outside the timed epoch.
* ``surprise-svd`` (SGD, single-threaded) and ``implicit-als-Nt`` (implicit feedback: another
  problem, RMSE not comparable) when installed, for scale.

lenskit, scikit-surprise and implicit are the ``bench-mf`` extra (lenskit pulls PyTorch: keep
it out of the test environment); a solver whose package is missing is reported as skipped.

RMSE across data seeds. One draw of the small dataset decides "no worse than lenskit" by
differences of a few 1e-4, less than the spread between draws: ``--rmse-seeds N`` also trains
dscar (1 worker, float32) and lenskit (1 thread) on N draws (data seeds 0..N-1) at each of the
small dataset's regs and prints, per reg, the mean (with its standard error) and median of
dscar's test RMSE less lenskit's, and on how many draws dscar is no worse.

Run
---
    python -m bench.mf                  # small and large (5M ratings): several minutes on 2 cores
    python -m bench.mf --quick          # seconds
    python -m bench.mf --json out.json  # also write every figure, and a plot next to it (--plot PATH)
    python -m bench.mf --datasets small --rmse-seeds 8   # and test RMSE over 8 draws of the small set
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from bench.common import load_average, machine_info, pyplot, write_json

RANK = 20
REG = 0.1  # lenskit's default
NOISE = 0.5
SHARDS_PER_WORKER = 4  # per phase: dscar's default (4 per worker)


@dataclass
class Dataset:
    name: str
    n_users: int
    n_items: int
    train: tuple
    test: tuple
    regs: tuple = (REG,)

    @property
    def n_ratings(self) -> int:
        return len(self.train[2]) + len(self.test[2])


@dataclass
class Result:
    solver: str
    cores: int = 1
    reg: float = REG
    per_iter_s: float | None = None
    cpu_per_iter_s: float | None = None  # CPU seconds per iteration, all the solver's processes and threads
    iters: int = 0
    test_rmse: float | None = None
    setup_s: float | None = None
    note: str = ""
    iter_s: list[float] = field(default_factory=list)
    rmse_curve: list[float] = field(default_factory=list)  # test RMSE after each iteration (ALS solvers)
    repeat: int = 0  # which interleaved repeat (``--repeats``)
    repeats_s: list[float] = field(default_factory=list)  # merged: per_iter_s of every repeat


def merge(results: list[Result]) -> list[Result]:
    """One row per solver and reg: the median over its repeats (the first repeat's curves and notes)."""
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault((r.solver, r.reg), []).append(r)
    out = []
    for rs in groups.values():
        per = [r.per_iter_s for r in rs if r.per_iter_s is not None]
        cpu = [r.cpu_per_iter_s for r in rs if r.cpu_per_iter_s is not None]
        out.append(replace(rs[0], per_iter_s=statistics.median(per) if per else None,
                           cpu_per_iter_s=statistics.median(cpu) if cpu else None, repeats_s=per))
    return out


def paired_ratios(results: list[Result], reg: float) -> dict[str, list[float]]:
    """Per repeat, dscar-Nw-* s/iter over lenskit-Nt's of the same repeat (equal cores)."""
    lk = {(r.cores, r.repeat): r for r in results if r.solver.startswith("lenskit") and r.reg == reg and r.per_iter_s}
    out: dict[str, list[float]] = {}
    for r in results:
        peer = lk.get((r.cores, r.repeat))
        if r.solver.startswith("dscar") and r.reg == reg and r.per_iter_s and peer:
            out.setdefault(r.solver, []).append(r.per_iter_s / peer.per_iter_s)
    return out


def rmse_differences(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per reg, over the data seeds: dscar's test RMSE less lenskit's (negative: dscar better), its
    mean, standard error and median, and the seeds where dscar is no worse."""
    out: dict[str, dict[str, Any]] = {}
    for reg in sorted({r["reg"] for r in rows}):
        diffs = [r["dscar"] - r["lenskit"] for r in rows if r["reg"] == reg]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
        out[str(reg)] = {"diffs": diffs, "mean": statistics.fmean(diffs), "se": se,
                         "median": statistics.median(diffs), "no_worse": sum(d <= 0 for d in diffs), "n": len(diffs)}
    return out


def make_datasets(quick: bool, only: list[str] | None = None, seed: int = 0) -> list[Dataset]:
    from dscar.algorithms.datasets import make_ratings
    from dscar.algorithms.mf import train_test_split

    sizes = [("small", 2_000, 500, 20_000, (REG, 3.0))] if quick else [
        ("small", 3_000, 1_000, 70_000, (REG, 3.0)), ("large", 100_000, 20_000, 5_000_000, (REG,))]
    out = []
    for name, nu, ni, n, regs in sizes:
        if only and name not in only:
            continue
        u, i, r, _ = make_ratings(nu, ni, n, RANK, NOISE, seed=seed)
        train, test = train_test_split(u, i, r, 0.2, seed=seed)
        out.append(Dataset(name, nu, ni, train, test, regs))
    return out


def _rmse(pred: np.ndarray, r: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(r) - pred) ** 2)))


def run_dscar(cl, workers: int, d: Dataset, iters: int, dtype: str, reg: float) -> Result:
    import dscar
    from dscar.algorithms.mf import ALS, ratings_data

    mean = float(d.train[2].mean())
    algo = ALS(d.n_users, d.n_items, RANK, reg=reg, mean=mean, tol=1e-12, dtype=dtype)
    data = ratings_data(d.train, d.test, n_users=d.n_users, n_items=d.n_items, n_shards=SHARDS_PER_WORKER * workers)

    def cpu() -> float:  # the driver (with the embedded scheduler) and every worker process
        return time.process_time() + sum(cl.client.run(time.process_time).values())

    cpus = []
    for clocks in (1, iters):  # CPU per iteration: the difference of a 1-clock and an iters-clock fit
        c0 = cpu()
        res = dscar.fit(algo, data, cl, max_clocks=clocks)
        cpus.append(cpu() - c0)
    secs = [h.seconds for h in res.history]
    curve = [h.metrics["test_rmse"] for h in res.history]
    return Result(f"dscar-{workers}w-{dtype[-2:]}", workers, reg, statistics.median(secs),
                  (cpus[1] - cpus[0]) / max(iters - 1, 1), res.n_clocks, curve[-1], res.setup_seconds,
                  note=f"ALS, {dtype}, compiled kernel", iter_s=secs, rmse_curve=curve)


def lenskit_child(path: str, iters: int, reg: float) -> dict[str, Any]:
    """Runs in a child process whose LK_NUM_THREADS is set (lenskit's rayon pool is set up once per process)."""
    import pandas as pd
    from lenskit.als import BiasedMFConfig, BiasedMFScorer
    from lenskit.data import from_interactions_df
    from lenskit.training import TrainingOptions

    z = np.load(path)
    t0 = time.perf_counter()
    ds = from_interactions_df(pd.DataFrame({"user_id": z["u"], "item_id": z["i"], "rating": z["r"]}))
    scorer = BiasedMFScorer(BiasedMFConfig(embedding_size=RANK, epochs=iters, regularization=reg))
    trainer = scorer.create_trainer(ds, TrainingOptions(rng=0))
    setup = time.perf_counter() - t0
    un, inum = ds.users.numbers(z["tu"]), ds.items.numbers(z["ti"])
    secs, curve, cpu = [], [], 0.0
    for _ in range(iters):
        t, c = time.perf_counter(), time.process_time()
        trainer.train_epoch()
        secs.append(time.perf_counter() - t)
        cpu += time.process_time() - c
        b = scorer.bias  # scored outside the timed epoch
        pred = b.global_bias + b.user_biases[un] + b.item_biases[inum]
        curve.append(_rmse(pred + np.einsum("ij,ij->i", scorer.user_embeddings[un], scorer.item_embeddings[inum]),
                           z["tr"]))
    trainer.finalize()
    import threadpoolctl
    import torch

    return {"secs": secs, "curve": curve, "setup": setup, "cpu_per_iter": cpu / iters, "torch_threads": torch.get_num_threads(),
            "blas": [p.get("num_threads") for p in threadpoolctl.threadpool_info()]}


def run_lenskit(d: Dataset, iters: int, threads: int, reg: float, data_path: str) -> Result:
    import importlib.util

    if importlib.util.find_spec("lenskit") is None:
        raise ImportError("No module named 'lenskit'")
    env = {**os.environ, "LK_NUM_THREADS": str(threads), "LK_NUM_BACKEND_THREADS": str(threads),
           "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    r = subprocess.run([sys.executable, "-m", "bench.mf", "--lenskit-child", data_path, "--iters", str(iters),
                        "--reg", repr(reg)], env=env, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise RuntimeError(f"lenskit child failed: {r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return Result(f"lenskit-{threads}t", threads, reg, statistics.median(out["secs"]), out["cpu_per_iter"], iters,
                  out["curve"][-1],
                  out["setup"], note=f"ALS, float32 (torch {out['torch_threads']} thr, BLAS {out['blas']})",
                  iter_s=out["secs"], rmse_curve=out["curve"])


def run_surprise(d: Dataset, iters: int) -> Result:
    import pandas as pd
    from surprise import SVD, Dataset as SDataset, Reader

    t0 = time.perf_counter()
    u, i, r = d.train
    lo, hi = float(min(r.min(), d.test[2].min())), float(max(r.max(), d.test[2].max()))
    trainset = SDataset.load_from_df(pd.DataFrame({"u": u, "i": i, "r": r}), Reader(rating_scale=(lo, hi))) \
        .build_full_trainset()
    setup = time.perf_counter() - t0
    algo = SVD(n_factors=RANK, n_epochs=iters, random_state=0)
    t = time.perf_counter()
    algo.fit(trainset)
    per = (time.perf_counter() - t) / iters
    tu, ti, tr = d.test
    iu = np.array([trainset.to_inner_uid(x) for x in tu.tolist()])
    ii = np.array([trainset.to_inner_iid(x) for x in ti.tolist()])
    pred = trainset.global_mean + algo.bu[iu] + algo.bi[ii] + np.einsum("ij,ij->i", algo.pu[iu], algo.qi[ii])
    return Result("surprise-svd", 1, REG, per, None, iters, _rmse(np.clip(pred, lo, hi), tr), setup, note="SGD")


def run_implicit(d: Dataset, iters: int, threads: int) -> Result:
    import scipy.sparse as sp
    from implicit.cpu.als import AlternatingLeastSquares

    u, i, r = d.train
    X = sp.csr_matrix((r - r.min() + 1.0, (u, i)), shape=(d.n_users, d.n_items))  # positive confidences
    model = AlternatingLeastSquares(factors=RANK, regularization=REG, iterations=iters, random_state=0,
                                    num_threads=threads, calculate_training_loss=False)
    t = time.perf_counter()
    model.fit(X, show_progress=False)
    return Result(f"implicit-als-{threads}t", threads, REG, (time.perf_counter() - t) / iters, None, iters, None,
                  note="implicit feedback")


def save_npz(d: Dataset, path: str) -> str:
    """The dataset's ratings where the lenskit child reads them (``--lenskit-child``); returns ``path``."""
    np.savez(path, u=d.train[0], i=d.train[1], r=d.train[2], tu=d.test[0], ti=d.test[1], tr=d.test[2])
    return path


def rmse_across_seeds(cl, n_seeds: int, quick: bool, iters: int, tmp: str) -> dict[str, Any]:
    """Test RMSE of dscar (1 worker, float32) and lenskit (1 thread) on ``n_seeds`` draws of the small
    dataset: one draw's difference is often smaller than the spread between draws."""
    rows = []
    for seed in range(n_seeds):
        d = make_datasets(quick, ["small"], seed=seed)[0]
        path = save_npz(d, os.path.join(tmp, f"small-seed{seed}.npz"))
        for reg in d.regs:
            a = run_dscar(cl, 1, d, iters, "float32", reg).test_rmse
            try:
                b = run_lenskit(d, iters, 1, reg, path).test_rmse
            except ImportError as e:
                print(f"  RMSE across seeds skipped: {e} (pip install 'dscar[bench-mf]')", flush=True)
                return {"rows": rows, "skipped": str(e)}
            rows.append({"seed": seed, "reg": reg, "dscar": a, "lenskit": b})
            print(f"  small, data seed {seed}, reg {reg:g}: test RMSE dscar-1w-32 {a:.5f}, lenskit-1t {b:.5f}, "
                  f"difference {a - b:+.5f}", flush=True)
    return {"rows": rows, "summary": rmse_differences(rows)}


def format_rmse_summary(summary: dict[str, dict[str, Any]]) -> str:
    lines = []
    for reg, s in summary.items():
        se = "-" if s["se"] is None else f"{s['se']:.5f}"
        lines.append(f"small, {s['n']} data seeds, reg {float(reg):g}: test RMSE dscar-1w-32 - lenskit-1t: mean "
                     f"{s['mean']:+.5f} (se {se}), median {s['median']:+.5f}; dscar no worse on {s['no_worse']} "
                     f"of {s['n']}")
    return "\n".join(lines)


def format_table(d: Dataset, results: list[Result], reg: float) -> str:
    load = load_average()
    lines = [f"{d.name}: {d.n_users:,} users x {d.n_items:,} items, {len(d.train[2]):,} train / "
             f"{len(d.test[2]):,} test ratings; rank {RANK}, reg {reg:g} (weighted); noise floor RMSE {NOISE}; "
             f"load average {' '.join(f'{x:.2f}' for x in load) if load else '-'}",
             "  cores: dscar-Nw = N worker processes x 1 thread; lenskit-Nt = N rayon + N torch/BLAS threads "
             "(threadpoolctl / LK_NUM_*); ratio = s/iter over lenskit's on the same number of cores",
             "  CPU s/iter: CPU seconds per iteration of all the solver's processes and threads (dscar: driver, "
             "scheduler and workers; the difference of a 1-clock and an N-clock fit): on a shared machine the "
             "load-independent figure",
             f"  {'solver':<16} {'cores':>5} {'s/iter':>9} {'CPU s/iter':>10} {'iters':>5} {'test RMSE':>9} "
             f"{'setup s':>8}  {'vs lenskit same cores: wall, CPU, RMSE':>40}  note"]
    lk = {x.cores: x for x in results if x.solver.startswith("lenskit") and x.per_iter_s}
    for x in results:
        f = lambda v, fmt, w: ("-" if v is None else format(v, fmt)).rjust(w)  # noqa: E731
        peer = lk.get(x.cores)
        ratio = None
        if peer and x.per_iter_s and not x.solver.startswith("lenskit"):
            ratio = f"{x.per_iter_s / peer.per_iter_s:.2f}x"
            if x.cpu_per_iter_s and peer.cpu_per_iter_s:
                ratio += f", {x.cpu_per_iter_s / peer.cpu_per_iter_s:.2f}x"
            if x.test_rmse is not None and peer.test_rmse is not None:
                ratio += f", {x.test_rmse - peer.test_rmse:+.4f}"
        lines.append(f"  {x.solver:<16} {x.cores:>5} {f(x.per_iter_s, '.4f', 9)} {f(x.cpu_per_iter_s, '.4f', 10)} "
                     f"{x.iters:>5} {f(x.test_rmse, '.4f', 9)} {f(x.setup_s, '.2f', 8)}  {(ratio or '-'):>40}  {x.note}")
    return "\n".join(lines)


def plot(path: str, out: dict[str, Any]) -> None:
    """Seconds per iteration by solver (bars, one panel per dataset and reg) and test RMSE by iteration."""
    plt = pyplot()
    panels = [(name, reg, [r for r in ds["results"] if r["reg"] == reg and r["per_iter_s"]])
              for name, ds in out["datasets"].items() for reg in ds["regs"]]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.5 * len(panels), 7), squeeze=False)
    for j, (name, reg, res) in enumerate(panels):
        ax = axes[0][j]
        ax.bar([r["solver"] for r in res], [r["per_iter_s"] for r in res],
               color=["C0" if r["solver"].startswith("dscar") else "C1" for r in res])
        ax.set_title(f"{name}, reg {reg:g}: s / iteration")
        ax.tick_params(axis="x", rotation=60)
        ax = axes[1][j]
        for r in res:
            if r["rmse_curve"]:
                ax.plot(range(1, len(r["rmse_curve"]) + 1), r["rmse_curve"], label=r["solver"])
        ax.set_xlabel("iteration")
        ax.set_ylabel("test RMSE")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.mf", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one small dataset, few iterations")
    ap.add_argument("--iters", type=int, default=None, help="iterations per solver (default 10, 3 with --quick)")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON (and a plot next to it)")
    ap.add_argument("--plot", metavar="PATH", help="the plot's path (default: the JSON's, .png)")
    ap.add_argument("--datasets", nargs="+", choices=("small", "large"), help="only these datasets (default: all)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="interleaved repeats of every timed solver (default 3; 1 with --quick)")
    ap.add_argument("--rmse-seeds", type=int, default=0, metavar="N",
                    help="also compare test RMSE on N draws of the small dataset (data seeds 0..N-1; "
                         "dscar 1 worker float32 vs lenskit 1 thread, at each of its regs)")
    ap.add_argument("--lenskit-child", metavar="NPZ", help=argparse.SUPPRESS)
    ap.add_argument("--reg", type=float, default=REG, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    iters = args.iters or (3 if args.quick else 10)
    repeats = args.repeats or (1 if args.quick else 3)
    if args.lenskit_child:
        print(json.dumps(lenskit_child(args.lenskit_child, iters, args.reg)))
        return 0
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # the driver: scoring and data prep only; every solver's cores are set explicitly
    t0 = time.perf_counter()
    datasets = [d for d in make_datasets(args.quick, args.datasets) if not args.datasets or d.name in args.datasets]
    print(f"[{time.perf_counter() - t0:6.1f}s] data generated; load average {load_average()}", flush=True)

    import threadpoolctl

    import dscar

    machine = machine_info(threadpools=True)
    machine.update(cpus=machine["cpu_count"], load=load_average())
    out: dict[str, Any] = {"machine": machine, "iters": iters, "rank": RANK, "datasets": {}}
    results: dict[str, list[Result]] = {d.name: [] for d in datasets}

    def record(d: Dataset, name: str, run: Callable[[], Result], repeat: int = 0) -> None:
        try:
            res = run()
        except ImportError as e:
            res = Result(name, note=f"skipped: {e} (pip install 'dscar[bench-mf]')")
        res.repeat = repeat
        results[d.name].append(res)
        print(f"[{time.perf_counter() - t0:6.1f}s] {d.name} {res.solver} reg {res.reg:g} (repeat {repeat + 1}): "
              f"{res.per_iter_s if res.per_iter_s is not None else '-'} s/iter, RMSE {res.test_rmse}", flush=True)

    worker_pools = {}
    with contextlib.ExitStack() as stack:
        clusters = {w: stack.enter_context(dscar.Cluster(n_workers=w)) for w in (1, 2)}
        for workers, cl in clusters.items():
            cl.client.run(lambda: threadpoolctl.threadpool_limits(1) and None)  # pinned for the workers' lifetime
            worker_pools[f"{workers}w"] = cl.client.run(threadpoolctl.threadpool_info)
            warm = datasets[0]  # compile the kernels on the workers (numba's cache) before timing
            for dtype in ("float32", "float64"):
                run_dscar(cl, workers, Dataset("warm", warm.n_users, warm.n_items, warm.train, warm.test), 1, dtype, REG)
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        paths = {}
        for d in datasets:
            paths[d.name] = save_npz(d, os.path.join(tmp, f"{d.name}.npz"))
        for repeat in range(repeats):  # interleaved: dscar and lenskit of one repeat run back to back
            for d in datasets:
                for reg in d.regs:
                    for workers, cl in clusters.items():
                        for dtype in ("float64", "float32"):
                            record(d, f"dscar-{workers}w", lambda: run_dscar(cl, workers, d, iters, dtype, reg), repeat)
                        record(d, f"lenskit-{workers}t", lambda: run_lenskit(d, iters, workers, reg, paths[d.name]),
                               repeat)
        if args.rmse_seeds:
            out["rmse_across_seeds"] = rmse_across_seeds(clusters[1], args.rmse_seeds, args.quick, iters, tmp)
    machine["worker_threadpools"] = worker_pools
    for d in datasets:  # for scale, not compared: once each
        record(d, "surprise-svd", lambda: run_surprise(d, iters))
        for threads in (1, 2):
            record(d, f"implicit-als-{threads}t", lambda: run_implicit(d, iters, threads))
    for d in datasets:
        merged = merge(results[d.name])
        ratios = {}
        for reg in d.regs:
            rows = [x for x in merged if x.reg == reg or x.per_iter_s is None]
            print(format_table(d, rows, reg), flush=True)
            ratios[str(reg)] = paired_ratios(results[d.name], reg)
            for solver, rs in ratios[str(reg)].items():
                print(f"  paired, {solver} / lenskit same cores, by repeat: {' '.join(f'{x:.2f}x' for x in rs)}"
                      f"  -> median {statistics.median(rs):.2f}x")
            for x in rows:
                if x.rmse_curve:
                    print(f"  test RMSE by iteration, {x.solver}: " + " ".join(f"{v:.4f}" for v in x.rmse_curve))
        out["datasets"][d.name] = {"n_users": d.n_users, "n_items": d.n_items, "n_train": len(d.train[2]),
                                   "n_test": len(d.test[2]), "regs": list(d.regs), "repeats": repeats,
                                   "results": [vars(r) for r in merged], "runs": [vars(r) for r in results[d.name]],
                                   "paired_ratios": ratios}
    if out.get("rmse_across_seeds", {}).get("summary"):
        print(format_rmse_summary(out["rmse_across_seeds"]["summary"]), flush=True)
    out["machine"]["load_end"] = load_average()
    if args.json:
        write_json(args.json, out)
    png = args.plot or (os.path.splitext(args.json)[0] + ".png" if args.json else None)
    if png:
        plot(png, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
