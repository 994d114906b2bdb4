"""Explicit matrix factorization benchmark: dscar's ALS (2 workers) vs lenskit, scikit-surprise, implicit.

What it measures
----------------
For every solver, in one run, side by side on the same data: the wall time per
iteration (median over the iterations; an ALS iteration solves every user row
then every item row) and the test RMSE after ``--iters`` iterations.

Data: ``dscar.algorithms.datasets.make_ratings`` (a planted rank-20 model with user /
item biases, power-law activity, rating noise ``N(0, 0.5^2)``: the best
reachable test RMSE is 0.5), split by ``dscar.algorithms.mf.train_test_split`` (20 %
held out, warm users and items only):

* ``small``: 20k users x 4k items x 500k ratings; ``--quick``: 2k x 500 x 20k;
* ``large``: 100k users x 20k items x 5M ratings (not with ``--quick``).

Solvers (rank 20 everywhere; regularization ``REG`` weighted by each row's
rating count, the weighted-lambda form both dscar's and lenskit's ALS use):

* ``dscar-2w-64`` / ``dscar-2w-32``: ``dscar.algorithms.mf.ALS`` (biases learned jointly,
  weighted reg; ``dtype`` float64, or float32 for the Gram matrices as lenskit) on an
  embedded cluster of 2 worker processes (one BLAS thread each), 8 shards per
  phase. Time per iteration: the clock's wall time seen by the driver
  (``ClockRecord.seconds``: both phases, all coordination and the metrics).
  Its test RMSE is the per-clock metric the job computes.
* ``lenskit``: ``lenskit.als.BiasedMFScorer`` (lenskit 2025, PyTorch CPU; float32,
  fixed damped biases, weighted reg ``REG``), trained epoch by epoch with its
  trainer; test RMSE from its embeddings and bias model.
* ``surprise-svd``: ``surprise.SVD(n_factors=20)`` — *SGD*, not ALS, its own
  defaults otherwise (``lr_all=0.005, reg_all=0.02``); time per epoch = fit time / epochs.
* ``implicit-als``: ``implicit.cpu.als.AlternatingLeastSquares(factors=20)`` fit
  to the ratings as *confidences* (implicit feedback): it solves a different
  problem (all user-item pairs, weighted), so its test RMSE is not comparable and
  shown as ``-``; its time per iteration is shown for scale.

lenskit, scikit-surprise and implicit are the ``bench-mf`` extra (lenskit pulls
PyTorch: keep it out of the test environment); a solver whose package is missing
is reported as skipped.

Run
---
    python -m bench.mf                  # small and large (5M ratings): several minutes on 2 cores
    python -m bench.mf --quick          # seconds
    python -m bench.mf --json out.json  # also write every figure
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from bench.common import load_average, machine_info, write_json

RANK = 20
REG = 0.1  # lenskit's default
NOISE = 0.5
SHARDS_PER_PHASE = 8


@dataclass
class Dataset:
    name: str
    n_users: int
    n_items: int
    train: tuple
    test: tuple

    @property
    def n_ratings(self) -> int:
        return len(self.train[2]) + len(self.test[2])


@dataclass
class Result:
    solver: str
    per_iter_s: float | None = None
    iters: int = 0
    test_rmse: float | None = None
    setup_s: float | None = None
    note: str = ""
    iter_s: list[float] = field(default_factory=list)
    rmse_curve: list[float] = field(default_factory=list)  # test RMSE after each iteration (ALS solvers)


def make_datasets(quick: bool) -> list[Dataset]:
    from dscar.algorithms.datasets import make_ratings
    from dscar.algorithms.mf import train_test_split

    sizes = [("small", 2_000, 500, 20_000)] if quick else [("small", 20_000, 4_000, 500_000),
                                                            ("large", 100_000, 20_000, 5_000_000)]
    out = []
    for name, nu, ni, n in sizes:
        u, i, r, _ = make_ratings(nu, ni, n, RANK, NOISE, seed=0)
        train, test = train_test_split(u, i, r, 0.2, seed=0)
        out.append(Dataset(name, nu, ni, train, test))
    return out


def _rmse(pred: np.ndarray, r: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(r) - pred) ** 2)))


def run_dscar(cl, d: Dataset, iters: int, dtype: str) -> Result:
    import dscar
    from dscar.algorithms.mf import ALS, ratings_data

    mean = float(d.train[2].mean())
    algo = ALS(d.n_users, d.n_items, RANK, reg=REG, mean=mean, tol=1e-12, dtype=dtype)
    data = ratings_data(d.train, d.test, n_users=d.n_users, n_items=d.n_items, n_shards=SHARDS_PER_PHASE)
    res = dscar.fit(algo, data, cl, max_clocks=iters)
    secs = [h.seconds for h in res.history]
    curve = [h.metrics["test_rmse"] for h in res.history]
    return Result(f"dscar-2w-{dtype[-2:]}", statistics.median(secs), res.n_clocks, curve[-1], res.setup_seconds,
                  note=f"ALS, {dtype}", iter_s=secs, rmse_curve=curve)


def run_lenskit(d: Dataset, iters: int) -> Result:
    import pandas as pd
    from lenskit.als import BiasedMFConfig, BiasedMFScorer
    from lenskit.data import from_interactions_df
    from lenskit.training import TrainingOptions

    t0 = time.perf_counter()
    u, i, r = d.train
    ds = from_interactions_df(pd.DataFrame({"user_id": u, "item_id": i, "rating": r}))
    scorer = BiasedMFScorer(BiasedMFConfig(embedding_size=RANK, epochs=iters, regularization=REG))
    trainer = scorer.create_trainer(ds, TrainingOptions(rng=0))
    setup = time.perf_counter() - t0
    tu, ti, tr = d.test
    un, inum = ds.users.numbers(tu), ds.items.numbers(ti)
    secs, curve = [], []
    for _ in range(iters):
        t = time.perf_counter()
        trainer.train_epoch()
        secs.append(time.perf_counter() - t)
        b = scorer.bias  # scored outside the timed epoch
        pred = b.global_bias + b.user_biases[un] + b.item_biases[inum]
        curve.append(_rmse(pred + np.einsum("ij,ij->i", scorer.user_embeddings[un], scorer.item_embeddings[inum]), tr))
    trainer.finalize()
    return Result("lenskit", statistics.median(secs), iters, curve[-1], setup, note="ALS, float32",
                  iter_s=secs, rmse_curve=curve)


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
    return Result("surprise-svd", per, iters, _rmse(np.clip(pred, lo, hi), tr), setup, note="SGD")


def run_implicit(d: Dataset, iters: int) -> Result:
    import scipy.sparse as sp
    from implicit.cpu.als import AlternatingLeastSquares

    u, i, r = d.train
    X = sp.csr_matrix((r - r.min() + 1.0, (u, i)), shape=(d.n_users, d.n_items))  # positive confidences
    model = AlternatingLeastSquares(factors=RANK, regularization=REG, iterations=iters, random_state=0,
                                    num_threads=2, calculate_training_loss=False)
    t = time.perf_counter()
    model.fit(X, show_progress=False)
    return Result("implicit-als", (time.perf_counter() - t) / iters, iters, None, note="implicit feedback")


def format_table(d: Dataset, results: list[Result]) -> str:
    lines = [f"{d.name}: {d.n_users:,} users x {d.n_items:,} items, {len(d.train[2]):,} train / "
             f"{len(d.test[2]):,} test ratings; rank {RANK}, reg {REG} (weighted); noise floor RMSE {NOISE}",
             f"  {'solver':<14} {'s/iter':>9} {'iters':>5} {'test RMSE':>9} {'setup s':>8}  "
             f"{'vs lenskit s/iter':>17}  note"]
    lk = next((x.per_iter_s for x in results if x.solver == "lenskit" and x.per_iter_s), None)
    for x in results:
        f = lambda v, fmt, w: ("-" if v is None else format(v, fmt)).rjust(w)  # noqa: E731
        ratio = f(x.per_iter_s / lk if (lk and x.per_iter_s) else None, ".2f", 17)
        lines.append(f"  {x.solver:<14} {f(x.per_iter_s, '.3f', 9)} {x.iters:>5} {f(x.test_rmse, '.4f', 9)} "
                     f"{f(x.setup_s, '.2f', 8)}  {ratio}  {x.note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.mf", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one small dataset, few iterations")
    ap.add_argument("--iters", type=int, default=None, help="iterations per solver (default 15, 3 with --quick)")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    args = ap.parse_args(argv)
    iters = args.iters or (3 if args.quick else 15)
    t0 = time.perf_counter()
    datasets = make_datasets(args.quick)
    print(f"[{time.perf_counter() - t0:6.1f}s] data generated", flush=True)

    import dscar

    machine = machine_info()
    machine.update(cpus=machine["cpu_count"], load=load_average())  # the keys this script's JSON has always had
    out: dict[str, Any] = {"machine": machine, "iters": iters, "rank": RANK, "reg": REG, "datasets": {}}
    with dscar.Cluster(n_workers=2) as cl:
        for d in datasets:
            solvers: list[tuple[str, Callable[[], Result]]] = [
                ("dscar-2w-64", lambda: run_dscar(cl, d, iters, "float64")),
                ("dscar-2w-32", lambda: run_dscar(cl, d, iters, "float32")),
                ("lenskit", lambda: run_lenskit(d, iters)),
                ("surprise-svd", lambda: run_surprise(d, iters)),
                ("implicit-als", lambda: run_implicit(d, iters)),
            ]
            results = []
            for name, run in solvers:
                try:
                    res = run()
                except ImportError as e:
                    res = Result(name, note=f"skipped: {e} (pip install 'dscar[bench-mf]')")
                results.append(res)
                print(f"[{time.perf_counter() - t0:6.1f}s] {d.name} {name}: "
                      f"{res.per_iter_s if res.per_iter_s is not None else '-'} s/iter, RMSE {res.test_rmse}", flush=True)
            print(format_table(d, results), flush=True)
            for x in results:
                if x.rmse_curve:
                    print(f"  test RMSE by iteration, {x.solver}: " + " ".join(f"{v:.4f}" for v in x.rmse_curve))
            out["datasets"][d.name] = {"n_users": d.n_users, "n_items": d.n_items, "n_train": len(d.train[2]),
                                       "n_test": len(d.test[2]), "results": [vars(r) for r in results]}
    out["machine"]["load_end"] = load_average()
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
