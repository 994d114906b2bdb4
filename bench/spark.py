"""Apache Spark MLlib as a peer: the same models on the same data, 2 cores each, and a killed worker mid-ALS.

What it measures
----------------
One run, side by side, every figure from that run; dscar on an embedded cluster of 2 worker processes
(one BLAS thread each), Spark MLlib on ``local[2]`` (one JVM, 2 task slots; driver memory 6g). Both
are started and each model of each system is warmed up by a small untimed fit (numba compiles on dscar's
workers; the JVM's JIT) before it is timed: "total" is the fit call,
data already in each system's memory (a cached, counted Spark DataFrame; NumPy arrays in dscar's
driver, which the fit places on the workers: dscar's total includes that, Spark's includes nothing
like it). Quality is computed here, in NumPy, the same way for both, from each system's parameters.

* **ALS** (``make_ratings``, rank 20, noise 0.5, 20 % held out, warm users/items): no biases in
  either (dscar ``biases=False, mean=train mean``; Spark gets the ratings minus that mean), both
  weighted-lambda regularisation ``reg=0.1`` (Spark's ``regParam`` is scaled by each row's rating
  count, ALS-WR, as dscar's ``reg_mode="weighted"``). Time per iteration: dscar the median clock
  (``ClockRecord.seconds``: both phases, all coordination); Spark does not time its iterations, so it
  is fitted with ``maxIter`` = 1, N/2 and N, twice each, alternating (``per_iteration``): its time per
  iteration is the least-squares slope of fit time against iterations when that slope is more than two
  standard errors above zero, else (a set so small that fixed costs and noise swamp the iterations)
  the N-iteration fit's time / N, an upper bound, marked ``<=`` in the table. Neither can be negative
  (the old ``(T(N) - T(1)) / (N - 1)`` printed -0.667 s on ``--quick``). Test RMSE from the factors
  (``mean + U_u . V_i``).
* **LDA** (Reuters from the ``lda`` package: 395 docs, 4,258 words, 84,010 tokens; K = 50, the same
  number of iterations for all): dscar collapsed Gibbs (``alpha=0.1, beta=0.01``, 2 shards); Spark
  ``em`` (it refuses priors <= 1: its defaults ``50/K + 1`` and ``1.1``) and ``online``
  (``alpha=0.1, beta=0.01``, ``subsamplingRate=1``: every iteration sees every document, as a Gibbs
  sweep does). Throughput: tokens x iterations / total fit time. Quality: per-token log-likelihood of
  the corpus, ``sum n_dw log(theta_d . phi_w) / N``, with each system's topics ``phi`` and document
  mixtures ``theta`` folded in by the same EM fold-in (``dscar.algorithms.lda.LDA.transform``).
* **Lasso** (``make_regression(n, p, 50 informative, noise 1)``, ``alpha = 0.0045 alpha_max``, with an
  intercept): dscar ``LassoCD`` (duality-gap stop, tol 1e-6) vs Spark ``LinearRegression(
  elasticNetParam=1, regParam=alpha, standardization=False)`` (its ``auto`` solver, ``tol=1e-6``):
  the same objective ``1/(2n) ||y - Xw - b||^2 + alpha ||w||_1``, evaluated here for both.
* **Logistic regression** (``make_classification``, 10 classes, ``l2 = 1e-4``, bench/mlr.py's
  "synthetic" set and dscar settings): the time to reach ``P <= P* (1 + 1e-2)``, ``P*`` from a tight
  scikit-learn lbfgs solve: dscar ``MLRSGD(target=...)``; Spark ``LogisticRegression(family=
  "multinomial", regParam=l2, elasticNetParam=0, standardization=False)`` refitted with ``maxIter``
  = the first L-BFGS iteration whose objective (its ``objectiveHistory``, the same function) reached
  the target; also its time to its own convergence (``tol=1e-6``). Test accuracy of both.
* **Failure** (ALS, the failure set, ``N`` iterations): Spark on ``local-cluster[2,1,4096]`` (a
  master, 2 worker JVMs, one 1-core executor each): one executor JVM SIGKILLed at the start of
  iteration ``N/2``, i.e. after ``(N/2 - 1) / N`` of the failure-free fit's time; its worker starts a
  new executor and Spark recomputes lost blocks from lineage (no checkpoint directory). dscar: 2
  workers, priority checkpoints (``r=0.1``, every clock) and partial recovery, worker 1 killed
  (``os._exit``) at the start of clock ``N/2``. Both: time with the kill minus time without, medians of
  ``--repeats`` alternating pairs (3; each run's figures are printed too: on a shared machine the
  spread between runs is of the order of dscar's whole recovery).

Not like-for-like (also printed): Spark's factors are float32, dscar's float64; neither fits biases
(Spark cannot); Spark found no native BLAS and uses its Java fallback (the JVM's BLAS warning);
LDA's EM runs with other priors (Spark refuses ``alpha, beta <= 1`` for EM) and the three LDA
algorithms differ (Gibbs sampling, EM, online variational Bayes): quality is shown, not equalised;
Spark's default ALS blocks (10) and 4 SQL shuffle partitions; dscar's totals include placing the data
on its workers; a Spark executor loss is recovered by recomputation, dscar's by restoring the lost
partitions from checkpoints (whose cost, paid in every clock, is in its failure-free time).

Needs the ``bench-spark`` extra (pyspark, pyarrow) and a Java 17+ runtime (Debian:
``apt-get install -y openjdk-17-jre-headless``). Never run in CI.

Run
---
    python -m bench.spark                   # about 10 minutes on 2 shared cores
    python -m bench.spark --quick           # small sizes, ~3 minutes (most of it JVM start-up)
    python -m bench.spark --json out.json   # also every figure, and out.png
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.common import load_average, log, machine_info, pyplot, write_json

RANK, REG, NOISE = 20, 0.1, 0.5
LDA_ALPHA, LDA_BETA = 0.1, 0.01
LASSO_ALPHA_RATIO = 0.0045
MLR_L2, MLR_TARGET = 1e-4, 1e-2
SIZES = {
    # sized so that one run stays near 10 minutes on 2 shared cores (Spark's JVMs start twice)
    "full": dict(als=(20_000, 4_000, 500_000, 10), lda=(50, 50), lasso=(50_000, 1_000),
                 mlr=(100_000, 25_000, 100), failure=(20_000, 4_000, 500_000, 10)),
    "quick": dict(als=(2_000, 500, 20_000, 3), lda=(10, 5), lasso=(5_000, 100),
                  mlr=(10_000, 2_000, 20), failure=(2_000, 500, 20_000, 4)),
}
NOT_LIKE_FOR_LIKE = [
    "ALS: Spark's factors are float32, dscar's float64; neither learns biases (Spark's ALS has none)",
    "Spark found no native BLAS: its Java fallback does the ALS / L-BFGS arithmetic (dscar: OpenBLAS, numba)",
    "LDA: three algorithms (collapsed Gibbs, EM, online VB); Spark's EM refuses priors <= 1 (runs 50/K+1, 1.1)",
    "dscar's totals include placing the data on its workers; Spark's data is cached in its JVM before timing",
    "failure: Spark recomputes lost blocks from lineage; dscar restores the lost partitions from its priority "
    "checkpoints, whose cost is in its failure-free time too",
    "Spark: default ALS blocks (10), spark.sql.shuffle.partitions=4; dscar: 8 shards per ALS phase",
]


@dataclass
class Row:
    """One system's figures on one workload."""

    workload: str
    system: str
    total_s: float | None = None  #: the fit call
    per_iter_s: float | None = None
    quality: float | None = None
    quality_name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- sessions
def spark_session(master: str):
    from pyspark.sql import SparkSession

    t = time.perf_counter()
    spark = (SparkSession.builder.master(master).appName("dscar-bench")
             .config("spark.driver.memory", "6g").config("spark.executor.memory", "2g")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark, time.perf_counter() - t


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


# --------------------------------------------------------------------------- ALS
def ratings(nu: int, ni: int, n: int):
    from dscar.algorithms.datasets import make_ratings
    from dscar.algorithms.mf import train_test_split

    u, i, r, _ = make_ratings(nu, ni, n, RANK, NOISE, seed=0)
    return train_test_split(u, i, r, 0.2, seed=0)


def als_rmse(U: np.ndarray, V: np.ndarray, mean: float, test) -> float:
    tu, ti, tr = test
    pred = mean + np.einsum("ij,ij->i", U[tu], V[ti])
    return float(np.sqrt(np.mean((tr - pred) ** 2)))


def dscar_als(cl, train, test, nu, ni, iters, faults=(), checkpoint=None) -> tuple[Any, float]:
    import dscar
    from dscar.algorithms.mf import ALS, ratings_data

    mean = float(train[2].mean())
    algo = ALS(nu, ni, RANK, reg=REG, reg_mode="weighted", biases=False, mean=mean, tol=1e-12)
    data = ratings_data(train, test, n_users=nu, n_items=ni, n_shards=8)
    res = dscar.fit(algo, data, cl, max_clocks=iters, progress=False, faults=list(faults), checkpoint=checkpoint)
    return res, mean


def spark_als_df(spark, train):
    import pandas as pd

    u, i, r = train
    mean = float(r.mean())
    df = spark.createDataFrame(pd.DataFrame({"u": u.astype(np.int32), "i": i.astype(np.int32), "r": r - mean}))
    df = df.cache()
    df.count()
    return df, mean


def spark_als_fit(df, iters: int):
    from pyspark.ml.recommendation import ALS

    als = ALS(rank=RANK, maxIter=iters, regParam=REG, userCol="u", itemCol="i", ratingCol="r", seed=0,
              implicitPrefs=False, nonnegative=False)
    return _timed(lambda: als.fit(df))


def spark_factors(model, nu: int, ni: int) -> tuple[np.ndarray, np.ndarray]:
    out = []
    for frame, n in ((model.userFactors, nu), (model.itemFactors, ni)):
        pdf = frame.toPandas()
        M = np.zeros((n, RANK))
        M[pdf["id"].to_numpy()] = np.stack(pdf["features"].to_numpy())
        out.append(M)
    return out[0], out[1]


def bench_als(spark, cl, size, t0) -> list[Row]:
    nu, ni, n, iters = size
    train, test = ratings(nu, ni, n)
    what = f"{nu:,} users x {ni:,} items, {len(train[2]):,} train / {len(test[2]):,} test ratings, rank {RANK}"
    res, mean = dscar_als(cl, train, test, nu, ni, iters)
    d = Row("als", "dscar", res.seconds, statistics.median(r.seconds for r in res.history),
            als_rmse(res.params["user"], res.params["item"], mean, test), "test RMSE",
            {"data": what, "iters": res.n_clocks, "setup_s": res.setup_seconds})
    log(t0, f"als dscar: {d.total_s:.2f}s, {d.per_iter_s:.3f} s/iter, RMSE {d.quality:.4f}")
    df, mean = spark_als_df(spark, train)
    spark_als_fit(df, 1)  # untimed: the JVM compiles ALS's code paths (the first fit took 2-4x the next one)
    counts, secs, model = [], [], None
    for _ in range(SPARK_FIT_REPEATS):  # alternating, so a change of load hits every length alike
        for n_it in per_iter_points(iters):
            m, t = spark_als_fit(df, n_it)
            counts.append(n_it)
            secs.append(t)
            if n_it == iters:
                model = m
    U, V = spark_factors(model, nu, ni)
    tn = statistics.median(t for c, t in zip(counts, secs) if c == iters)
    est = per_iteration(counts, secs)
    s = Row("als", "spark", tn, est.seconds, als_rmse(U, V, mean, test), "test RMSE",
            {"data": what, "iters": iters, "per_iter": vars(est), "fits": {"iters": counts, "seconds": secs}})
    df.unpersist()
    log(t0, f"als spark: {s.total_s:.2f}s, {s.per_iter_s:.3f} s/iter ({est.method}), RMSE {s.quality:.4f}")
    return [d, s]


#: each ``maxIter`` of Spark's ALS is fitted this many times (alternating): the slope's spread comes from them
SPARK_FIT_REPEATS = 2


def per_iter_points(iters: int) -> list[int]:
    """The ``maxIter`` values Spark's ALS is fitted with to find its time per iteration: 1, the middle, ``iters``."""
    return sorted({1, max(1, iters // 2), iters})


@dataclass
class PerIteration:
    """Spark's time per iteration, from fits of several lengths (Spark does not time its iterations)."""

    seconds: float  #: the figure reported: never negative
    method: str  #: "slope" (least squares over the fits) or "upper bound" (the longest fits' time / iterations)
    slope_s: float  #: least-squares slope of fit time against iterations (<= 0 where noise dominates; nan: no line)
    slope_se_s: float  #: its standard error (inf without a spread to estimate it from)
    intercept_s: float  #: the fixed cost of a fit (job set-up) by the same line


def per_iteration(iters: list[int], seconds: list[float]) -> PerIteration:
    """Time per iteration from fits of ``iters[j]`` iterations that took ``seconds[j]``.

    The marginal cost is the least-squares slope of time against iterations, reported only when it is
    resolved: more than two standard errors above zero. Otherwise (a set so small that the fixed cost
    and the noise swamp the iterations, as ``--quick``'s) the figure is the median time of the longest
    fits divided by their iterations: an upper bound that includes the fixed cost, never negative, and
    labelled as such. The difference of two single fits, ``(T(N) - T(1)) / (N - 1)``, went negative on
    ``--quick`` (-0.667 s) and is not used.
    """
    if len(iters) != len(seconds) or not iters:
        raise ValueError("per_iteration needs one time per fit, and at least one fit")
    if min(iters) < 1 or min(seconds) < 0:
        raise ValueError("fits need >= 1 iteration and a time >= 0")
    x, y = np.asarray(iters, dtype=float), np.asarray(seconds, dtype=float)
    top = float(x.max())
    bound = float(np.median(y[x == top])) / top
    if len(set(iters)) < 2 or len(iters) < 3:
        return PerIteration(bound, "upper bound", float("nan"), float("inf"), float("nan"))
    A = np.stack([np.ones_like(x), x], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - (a + b * x)
    se = float(np.sqrt((resid @ resid) / (len(x) - 2) / ((x - x.mean()) ** 2).sum()))
    if b > 0 and b > 2 * se:
        return PerIteration(float(b), "slope", float(b), se, float(a))
    return PerIteration(bound, "upper bound", float(b), se, float(a))


# --------------------------------------------------------------------------- LDA
def lda_loglik(X, phi: np.ndarray) -> float:
    """Per-token log-likelihood of the corpus ``X`` (docs x words) under topics ``phi`` (K x V), the
    document mixtures folded in by dscar's EM fold-in (the same for every system)."""
    from dscar.algorithms.lda import LDA

    folder = LDA(phi.shape[0])
    folder.components_ = phi / phi.sum(axis=1, keepdims=True)
    theta = folder.transform(X, max_iter=100)
    Xc = X.tocoo()
    p = np.einsum("ik,ki->i", theta[Xc.row], folder.components_[:, Xc.col])
    return float((Xc.data * np.log(np.maximum(p, 1e-300))).sum() / Xc.data.sum())


def bench_lda(spark, cl, size, t0) -> list[Row]:
    import dscar
    from dscar.algorithms.corpora import reuters
    from dscar.algorithms.lda import LDAGibbs, lda_data

    K, iters = size
    corpus = reuters()
    X = corpus.X
    n_tok = corpus.n_tokens
    what = f"Reuters: {corpus.describe()}, K={K}, {iters} iterations"
    algo = LDAGibbs(K, LDA_ALPHA, LDA_BETA, seed=0, early_stop=False)
    from dscar.algorithms.corpora import synthetic

    dscar.fit(LDAGibbs(K, LDA_ALPHA, LDA_BETA, early_stop=False), lda_data(synthetic(40, 200, 20, K).X), cl,
              n_shards=2, max_clocks=2, progress=False)  # warm-up: the workers compile the sampler (numba)
    res = dscar.fit(algo, lda_data(X), cl, n_shards=2, max_clocks=iters + 1, progress=False)
    sweeps = [r.seconds for r in res.history[1:]]
    phi = res.params["word_topic"].T + LDA_BETA
    rows = [Row("lda", "dscar-gibbs", res.seconds, statistics.median(sweeps), lda_loglik(X, phi),
                "loglik/token", {"data": what, "tokens_per_s": n_tok * iters / res.seconds,
                                 "tokens_per_s_sweeps": n_tok / statistics.median(sweeps), "setup_s": res.setup_seconds})]
    log(t0, f"lda dscar: {res.seconds:.2f}s, LL {rows[0].quality:.4f}")

    from pyspark.ml.clustering import LDA as SparkLDA
    from pyspark.ml.linalg import Vectors

    Xc = X.tocsr()
    docs = [(d, Vectors.sparse(X.shape[1], Xc.indices[Xc.indptr[d]:Xc.indptr[d + 1]].tolist(),
                               Xc.data[Xc.indptr[d]:Xc.indptr[d + 1]].astype(float).tolist()))
            for d in range(X.shape[0])]
    df = spark.createDataFrame(docs, ["id", "features"]).cache()
    df.count()
    small = df.limit(20).cache()
    for opt in ("em", "online"):  # warm-up
        SparkLDA(k=K, maxIter=2, seed=0, optimizer=opt).fit(small)
    small.unpersist()
    for name, kw in (("spark-em", dict(optimizer="em")),
                     ("spark-online", dict(optimizer="online", docConcentration=[LDA_ALPHA] * K,
                                           topicConcentration=LDA_BETA, subsamplingRate=1.0))):
        model, secs = _timed(lambda: SparkLDA(k=K, maxIter=iters, seed=0, **kw).fit(df))
        phi = model.topicsMatrix().toArray().T  # K x V
        row = Row("lda", name, secs, secs / iters, lda_loglik(X, phi), "loglik/token",
                  {"data": what, "tokens_per_s": n_tok * iters / secs,
                   "priors": {k: v for k, v in kw.items() if "Concentration" in k} or "Spark's defaults (50/K+1, 1.1)",
                   "estimated_doc_concentration": float(model.estimatedDocConcentration().toArray()[0])})
        rows.append(row)
        log(t0, f"lda {name}: {secs:.2f}s, LL {row.quality:.4f}")
    df.unpersist()
    return rows


# --------------------------------------------------------------------------- Lasso
def lasso_objective(X, y, w, b, alpha) -> float:
    r = y - X @ w - b
    return float(r @ r / (2 * len(y)) + alpha * np.abs(w).sum())


def spark_dense_df(spark, X, extra: dict[str, np.ndarray]):
    """A cached DataFrame of ``features`` vectors (and the ``extra`` columns), built through Arrow."""
    import pandas as pd
    from pyspark.ml.feature import VectorAssembler

    cols = [f"x{j}" for j in range(X.shape[1])]
    pdf = pd.DataFrame(X, columns=cols)
    for k, v in extra.items():
        pdf[k] = v
    raw = spark.createDataFrame(pdf)
    df = VectorAssembler(inputCols=cols, outputCol="features").transform(raw).select("features", *extra)
    df = df.cache()
    df.count()
    return df


def bench_lasso(spark, cl, size, t0) -> list[Row]:
    import dscar
    from dscar.algorithms.datasets import lasso_alpha_max, make_regression
    from dscar.algorithms.lasso import LassoCD

    n, p = size
    X, y, _ = make_regression(n, p, 50, noise=1.0, seed=0)
    alpha = LASSO_ALPHA_RATIO * lasso_alpha_max(X, y, fit_intercept=True)
    what = f"make_regression({n:,} x {p:,}, 50 informative), alpha = {LASSO_ALPHA_RATIO} alpha_max = {alpha:.4g}"
    dscar.fit(LassoCD(0.1), {"X": X[:500, :50], "y": y[:500]}, cl, progress=False)  # warm-up (numba)
    res = dscar.fit(LassoCD(alpha, tol=1e-6), {"X": X, "y": y}, cl, max_clocks=200, progress=False)
    w = res.params["w"]
    b = float(np.mean(y - X @ w))  # the intercept that goes with w (dscar's Lasso estimator computes it so)
    d = Row("lasso", "dscar", res.seconds, None, lasso_objective(X, y, w, b, alpha), "objective",
            {"data": what, "iters": res.n_clocks, "nnz": int(np.count_nonzero(w)), "setup_s": res.setup_seconds})
    log(t0, f"lasso dscar: {d.total_s:.2f}s, P {d.quality:.10g}")

    from pyspark.ml.regression import LinearRegression

    df = spark_dense_df(spark, X, {"label": y})
    lr = LinearRegression(regParam=alpha, elasticNetParam=1.0, standardization=False, fitIntercept=True,
                          tol=1e-6, maxIter=1000)
    lr.copy().setMaxIter(3).fit(df.limit(1000))  # warm-up
    model, secs = _timed(lambda: lr.fit(df))
    ws = model.coefficients.toArray()
    s = Row("lasso", "spark", secs, None, lasso_objective(X, y, ws, model.intercept, alpha), "objective",
            {"data": what, "iters": model.summary.totalIterations, "nnz": int(np.count_nonzero(ws)),
             "solver": lr.getSolver()})
    df.unpersist()
    best = min(d.quality, s.quality)
    for r in (d, s):
        r.extra["rel_gap_to_best"] = (r.quality - best) / best
    log(t0, f"lasso spark: {secs:.2f}s, P {s.quality:.10g}")
    return [d, s]


# --------------------------------------------------------------------------- logistic regression
def bench_mlr(spark, cl, size, t0) -> list[Row]:
    import dscar
    from dscar.algorithms.datasets import make_classification
    from dscar.algorithms.mlr import MLRSGD, objective
    from sklearn.linear_model import LogisticRegression as SkLR

    n, n_test, p = size
    X, y, _ = make_classification(n + n_test, p, 10, seed=0)
    X, Xte, y, yte = X[:n], X[n:], y[:n], y[n:]
    what = f"make_classification({n + n_test:,}, {p}, 10): {n:,} train / {n_test:,} test, l2 = {MLR_L2:g}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = SkLR(C=1.0 / (n * MLR_L2), tol=1e-10, max_iter=100_000).fit(X, y)
    p_star = objective(X, y, ref.coef_.T, ref.intercept_, MLR_L2)
    target = p_star * (1 + MLR_TARGET)
    acc = lambda W, b: float(np.mean(np.argmax(Xte @ W + b, axis=1) == yte))  # noqa: E731

    dscar.fit(MLRSGD(10, l2=MLR_L2), {"X": X[:1000], "y": y[:1000]}, cl, max_clocks=2, progress=False)  # warm-up
    algo = MLRSGD(10, l2=MLR_L2, lr=0.5, decay=0.05, batch_size=256, target=target)
    res = dscar.fit(algo, {"X": X, "y": y}, cl, n_shards=8, max_clocks=200, progress=False)
    W, b = res.params["W"][:-1], res.params["W"][-1]
    d = Row("mlr", "dscar", res.seconds, None, (objective(X, y, W, b, MLR_L2) - p_star) / p_star, "rel. gap to P*",
            {"data": what, "iters": res.n_clocks, "test_accuracy": acc(W, b), "reached": bool(res.converged),
             "setup_s": res.setup_seconds, "P_star": p_star})
    log(t0, f"mlr dscar: {d.total_s:.2f}s, gap {d.quality:.2e}")

    from pyspark.ml.classification import LogisticRegression

    df = spark_dense_df(spark, X, {"label": y.astype(np.float64)})

    def spark_fit(max_iter: int):
        lr = LogisticRegression(family="multinomial", regParam=MLR_L2, elasticNetParam=0.0, standardization=False,
                                fitIntercept=True, maxIter=max_iter, tol=1e-6)
        m, secs = _timed(lambda: lr.fit(df))
        Ws, bs = m.coefficientMatrix.toArray().T, m.interceptVector.toArray()
        return m, secs, Ws, bs

    spark_fit(2)  # warm-up
    m, secs_conv, Ws, bs = spark_fit(1000)
    hist = list(m.summary.objectiveHistory)
    k = next((i for i, v in enumerate(hist) if v <= target), None)  # entry 0: before the first step
    conv = {"total_s": secs_conv, "iters": len(hist) - 1,
            "rel_gap": (objective(X, y, Ws, bs, MLR_L2) - p_star) / p_star, "test_accuracy": acc(Ws, bs)}
    if k:
        m, secs, Ws, bs = spark_fit(k)
    else:
        secs = secs_conv
    s = Row("mlr", "spark", secs, None, (objective(X, y, Ws, bs, MLR_L2) - p_star) / p_star, "rel. gap to P*",
            {"data": what, "iters": k, "test_accuracy": acc(Ws, bs), "converged": conv, "P_star": p_star})
    s.extra["reached"] = s.quality <= MLR_TARGET
    df.unpersist()
    log(t0, f"mlr spark: {secs:.2f}s to target ({k} iters), {secs_conv:.2f}s to converge")
    return [d, s]


# --------------------------------------------------------------------------- failure
def executors() -> list[int]:
    """PIDs of this process's Spark executor JVMs (descendants running CoarseGrainedExecutorBackend)."""
    import psutil

    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if any("CoarseGrainedExecutorBackend" in a for a in c.cmdline()):
                out.append(c.pid)
        except psutil.Error:
            pass
    return sorted(out)


def wait_executors(spark, n: int, timeout: float = 120.0) -> None:
    """Until ``n`` executors are registered (a fresh local-cluster starts them one by one)."""
    sc = spark.sparkContext
    deadline = time.monotonic() + timeout
    while sc._jsc.sc().getExecutorMemoryStatus().size() - 1 < n:  # the driver is in the map too
        if time.monotonic() > deadline:
            raise RuntimeError(f"Spark started fewer than {n} executors in {timeout:.0f}s")
        time.sleep(0.2)  # polling Spark's own state


def bench_failure(size, t0, repeats: int = 3) -> list[Row]:
    """Each system: ``repeats`` pairs of (failure-free fit, fit with a kill), alternating; medians."""
    import dscar
    from dscar import faults

    nu, ni, n, iters = size
    kill_at = max(2, iters // 2)
    train, test = ratings(nu, ni, n)
    what = (f"{nu:,} users x {ni:,} items, {len(train[2]):,} ratings, {iters} iterations, killed at iteration "
            f"{kill_at}; medians of {repeats} pairs")
    rows = []
    with dscar.Cluster(n_workers=2) as cl, tempfile.TemporaryDirectory(prefix="dscar-bench-spark-") as tmp:
        cl.wait_for_workers(2)
        dscar_als(cl, *ratings(500, 100, 3_000), 500, 100, 1)  # warm-up
        out: dict[str, list] = {"baseline": [], "killed": []}
        for rep in range(repeats):
            for label, fl in (("baseline", ()), ("killed", (faults.kill(1, clock=kill_at),))):
                cfg = dscar.CheckpointConfig(os.path.join(tmp, f"{label}{rep}"), policy="priority", every=10,
                                             fraction=0.1, recovery="partial")
                cl.wait_for_workers(2)  # the killed worker's nanny has restarted it
                res, mean = dscar_als(cl, train, test, nu, ni, iters, faults=fl, checkpoint=cfg)
                out[label].append((res.seconds, als_rmse(res.params["user"], res.params["item"], mean, test), res))
                log(t0, f"failure dscar {label}: {res.seconds:.2f}s")
        lost = sum(e["kind"] == "worker-lost" for _, _, r in out["killed"] for e in r.events)
        rows.append(Row("failure", "dscar", statistics.median(x[0] for x in out["killed"]), None,
                        out["killed"][-1][1], "test RMSE",
                        {"data": what, "baseline_s": statistics.median(x[0] for x in out["baseline"]),
                         "baseline_rmse": out["baseline"][-1][1], "workers_lost": lost,
                         "baseline_all_s": [x[0] for x in out["baseline"]], "killed_all_s": [x[0] for x in out["killed"]],
                         "summary": out["killed"][-1][2].summary()}))

    spark, start_s = spark_session("local-cluster[2,1,4096]")
    try:
        wait_executors(spark, 2)
        df, mean = spark_als_df(spark, train)
        spark_als_fit(df, 1)  # warm-up: the JIT and the executors' first tasks
        base_all, killed_all, killed = [], [], []

        def kill() -> None:
            pids = executors()
            if pids:
                os.kill(pids[-1], signal.SIGKILL)
                killed.append(pids[-1])

        for rep in range(repeats):
            wait_executors(spark, 2)  # the worker has started a new executor for the killed one
            model, base = spark_als_fit(df, iters)
            base_all.append(base)
            rmse_base = als_rmse(*spark_factors(model, nu, ni), mean, test)
            log(t0, f"failure spark baseline: {base:.2f}s")
            wait_executors(spark, 2)
            timer = threading.Timer(base * (kill_at - 1) / iters, kill)
            timer.start()
            model, secs = spark_als_fit(df, iters)
            timer.cancel()
            killed_all.append(secs)
            rmse = als_rmse(*spark_factors(model, nu, ni), mean, test)
            log(t0, f"failure spark killed {killed}: {secs:.2f}s")
        rows.append(Row("failure", "spark", statistics.median(killed_all), None, rmse, "test RMSE",
                        {"data": what, "baseline_s": statistics.median(base_all), "baseline_rmse": rmse_base,
                         "workers_lost": len(killed), "baseline_all_s": base_all, "killed_all_s": killed_all,
                         "master": "local-cluster[2,1,4096]", "session_start_s": start_s}))
    finally:
        spark.stop()
    return rows


# --------------------------------------------------------------------------- output
def _f(v, fmt: str, w: int) -> str:
    return ("-" if v is None else format(v, fmt)).rjust(w)


def format_tables(rows: list[Row]) -> str:
    by = {(r.workload, r.system): r for r in rows}
    out = []

    def table(title: str, head: list[tuple[str, int]], body: list[list[str]]) -> None:
        out.append(title)
        hdr = "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(head))
        out.append(hdr)
        out.append("-" * len(hdr))
        out.extend("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, (_, w)) in enumerate(zip(cells, head)))
                   for cells in body)
        out.append("")

    d, s = by.get(("als", "dscar")), by.get(("als", "spark"))
    if d and s:
        out.append(f"ALS: {d.extra['data']}; reg {REG} weighted, no biases")
        est = s.extra.get("per_iter")
        mark = "<=" if est and est["method"] == "upper bound" else ""  # Spark's figure is a bound, not a slope
        table("", [("system", 11), ("s/iter", 9), ("total s", 8), ("test RMSE", 9)],
              [[d.system, _f(d.per_iter_s, ".3f", 9), _f(d.total_s, ".2f", 8), _f(d.quality, ".4f", 9)],
               [s.system, mark + _f(s.per_iter_s, ".3f", 0), _f(s.total_s, ".2f", 8), _f(s.quality, ".4f", 9)],
               ["spark/dscar", mark + _f(s.per_iter_s / d.per_iter_s, ".2f", 0), _f(s.total_s / d.total_s, ".2f", 8),
                ""]])
        if est:
            fits = s.extra["fits"]
            how = ("the slope" if not mark else
                   "the longest fits' time / iterations, an upper bound: the slope is not resolved")
            out[-1:] = [f"Spark s/iter is {how} (slope {est['slope_s']:+.3f} ± {est['slope_se_s']:.3f} s over fits of "
                        + ", ".join(f"{c} it {t:.2f} s" for c, t in zip(fits["iters"], fits["seconds"])) + ")", ""]
    lda = [r for r in rows if r.workload == "lda"]
    if lda:
        base = lda[0]
        out.append(f"LDA: {base.extra['data']}")
        table("", [("system", 12), ("total s", 8), ("M tokens/s", 10), ("dscar/this", 10), ("loglik/token", 12)],
              [[x.system, _f(x.total_s, ".2f", 8), _f(x.extra["tokens_per_s"] / 1e6, ".3f", 10),
                _f(base.extra["tokens_per_s"] / x.extra["tokens_per_s"], ".2f", 10), _f(x.quality, ".4f", 12)]
               for x in lda])
    d, s = by.get(("lasso", "dscar")), by.get(("lasso", "spark"))
    if d and s:
        out.append(f"Lasso: {d.extra['data']}")
        table("", [("system", 11), ("total s", 8), ("iters", 5), ("nnz", 5), ("objective", 14), ("rel. to best", 12)],
              [[x.system, _f(x.total_s, ".2f", 8), str(x.extra["iters"]), str(x.extra["nnz"]), _f(x.quality, ".10g", 14),
                _f(x.extra["rel_gap_to_best"], ".1e", 12)] for x in (d, s)]
              + [["spark/dscar", _f(s.total_s / d.total_s, ".2f", 8), "", "", "", ""]])
    d, s = by.get(("mlr", "dscar")), by.get(("mlr", "spark"))
    if d and s:
        c = s.extra["converged"]
        out.append(f"Logistic regression: {d.extra['data']}; target P <= P* (1 + {MLR_TARGET:g}), "
                   f"P* = {d.extra['P_star']:.8g}")
        table("", [("system", 16), ("total s", 8), ("iters", 5), ("rel. gap", 9), ("reached", 7), ("test acc", 8)],
              [[d.system, _f(d.total_s, ".2f", 8), str(d.extra["iters"]), _f(d.quality, ".2e", 9),
                str(d.extra["reached"]), _f(d.extra["test_accuracy"], ".4f", 8)],
               [s.system, _f(s.total_s, ".2f", 8), str(s.extra["iters"]), _f(s.quality, ".2e", 9),
                str(s.extra["reached"]), _f(s.extra["test_accuracy"], ".4f", 8)],
               ["spark (converged)", _f(c["total_s"], ".2f", 8), str(c["iters"]), _f(c["rel_gap"], ".2e", 9), "",
                _f(c["test_accuracy"], ".4f", 8)],
               ["spark/dscar", _f(s.total_s / d.total_s, ".2f", 8), "", "", "", ""]])
    d, s = by.get(("failure", "dscar")), by.get(("failure", "spark"))
    if d and s:
        out.append(f"A worker killed mid-ALS: {d.extra['data']}")
        rowsf = []
        for x in (d, s):
            b = x.extra["baseline_s"]
            rowsf.append([x.system, _f(b, ".2f", 10), _f(x.total_s, ".2f", 9), _f(x.total_s - b, "+.2f", 8),
                          _f(100 * (x.total_s - b) / b, "+.0f", 6), _f(x.extra["baseline_rmse"], ".4f", 9),
                          _f(x.quality, ".4f", 11), str(x.extra["workers_lost"])])
        table("", [("system", 8), ("no kill s", 10), ("killed s", 9), ("extra s", 8), ("extra%", 6),
                   ("RMSE base", 9), ("RMSE killed", 11), ("lost", 4)], rowsf)
        de, se = d.total_s - d.extra["baseline_s"], s.total_s - s.extra["baseline_s"]
        runs = [f"{x.system} runs (s): no kill " + " ".join(f"{v:.2f}" for v in x.extra["baseline_all_s"])
                + "; killed " + " ".join(f"{v:.2f}" for v in x.extra["killed_all_s"])
                for x in (d, s) if "killed_all_s" in x.extra]
        out[-1:] = runs + [f"spark/dscar extra seconds: {se / de:.1f}" if de > 0 else
                           f"dscar's extra is within its run-to-run spread ({de:+.2f} s); Spark's {se:+.2f} s", ""]
    out.append("Not like-for-like:")
    out += [f"  - {x}" for x in NOT_LIKE_FOR_LIKE]
    return "\n".join(out)


def write_png(path: str, rows: list[Row]) -> None:
    plt = pyplot()
    by = {(r.workload, r.system): r for r in rows}
    labels, ratios = [], []
    pairs = [("ALS s/iter", "als", "spark", "per_iter_s"), ("Lasso total", "lasso", "spark", "total_s"),
             ("LR to 1 %", "mlr", "spark", "total_s"), ("LDA EM total", "lda", "spark-em", "total_s"),
             ("LDA online total", "lda", "spark-online", "total_s")]
    for label, w, sysname, attr in pairs:
        base = by.get((w, "dscar" if w != "lda" else "dscar-gibbs"))
        other = by.get((w, sysname))
        if base and other and getattr(base, attr) and getattr(other, attr):
            labels.append(label)
            ratios.append(getattr(other, attr) / getattr(base, attr))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True, width_ratios=(3, 2))
    a1.barh(labels, ratios, color="tab:orange")
    a1.axvline(1.0, color="k", lw=0.8)
    a1.set_xscale("log")
    a1.set_xlabel("Spark time / dscar time (> 1: dscar faster)")
    for i, v in enumerate(ratios):
        a1.text(v, i, f" {v:.1f}x", va="center", fontsize=8)
    a1.set_title("Spark MLlib vs dscar, 2 cores each", fontsize=10)
    d, s = by.get(("failure", "dscar")), by.get(("failure", "spark"))
    if d and s:
        names = ["dscar", "spark"]
        base = [d.extra["baseline_s"], s.extra["baseline_s"]]
        extra = [d.total_s - base[0], s.total_s - base[1]]
        a2.bar(names, base, color="tab:blue", label="no failure (median)")
        a2.bar(names, [max(e, 0.0) for e in extra], bottom=base, color="tab:red",
               label="extra with a killed worker (median)")
        for i in range(2):  # a negative extra (within the noise) is drawn as none and labelled with its sign
            a2.text(i, base[i] + max(extra[i], 0.0), f"{100 * extra[i] / base[i]:+.0f} %", ha="center", va="bottom",
                    fontsize=8)
        a2.set_ylabel("seconds (ALS fit)")
        a2.legend(fontsize=8)
        a2.set_title("a worker killed mid-ALS", fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"png: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (most of the time is JVM start-up)")
    ap.add_argument("--only", default="als,lda,lasso,mlr,failure",
                    help="comma-separated workloads (default: als,lda,lasso,mlr,failure)")
    ap.add_argument("--json", metavar="PATH", help="write every figure as JSON, and a PNG next to it")
    ap.add_argument("--repeats", type=int, default=None,
                    help="failure-free / killed pairs per system in the failure comparison (default 3, 1 with --quick)")
    args = ap.parse_args(argv)
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    bad = [w for w in only if w not in SIZES["full"]]
    if bad:
        ap.error(f"unknown workload(s) {bad}; choose from {list(SIZES['full'])}")
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("bench.spark needs pyspark and a Java runtime: pip install 'dscar[bench-spark]'", file=sys.stderr)
        return 2
    import threadpoolctl

    import dscar

    threadpoolctl.threadpool_limits(1)  # the driver's own NumPy (data, quality): one thread like each worker
    sizes = SIZES["quick" if args.quick else "full"]
    t0 = time.perf_counter()
    machine = machine_info(versions=("pyspark",), threadpools=True)
    print(f"load average at start: {load_average()}", flush=True)
    rows: list[Row] = []
    starts: dict[str, float] = {}
    models = [w for w in only if w != "failure"]
    if models:
        spark, starts["spark_local2_s"] = spark_session("local[2]")
        try:
            t = time.perf_counter()
            with dscar.Cluster(n_workers=2) as cl:
                cl.wait_for_workers(2)
                starts["dscar_cluster_s"] = time.perf_counter() - t
                dscar_als(cl, *ratings(500, 100, 3_000), 500, 100, 1)  # warm-up (imports, numba)
                for w in models:
                    rows += {"als": bench_als, "lda": bench_lda, "lasso": bench_lasso, "mlr": bench_mlr}[w](
                        spark, cl, sizes[w], t0)
        finally:
            spark.stop()
    if "failure" in only:
        rows += bench_failure(sizes["failure"], t0, args.repeats or (1 if args.quick else 3))
    print("start-up (not in any figure): " + ", ".join(f"{k} {v:.1f}" for k, v in starts.items()))
    print(format_tables(rows))
    print(f"load average at end: {load_average()}")
    if args.json:
        machine["load_end"] = load_average()
        write_json(args.json, {"machine": machine, "quick": args.quick, "sizes": sizes, "startup_s": starts,
                               "not_like_for_like": NOT_LIKE_FOR_LIKE, "rows": [vars(r) for r in rows]})
        write_png(os.path.splitext(args.json)[0] + ".png", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
