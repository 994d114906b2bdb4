"""Kernels are loaded on every worker before clock 1: no worker stalls mid-fit on a first use
(a stall of ~0.3-1 s spans dozens of short clocks, and the others wait or back it up)."""
import subprocess
import sys
import threading


import dscar
from conftest import RowCounter, assert_exactly_once, row_data

WARMED: list[str] = []  # in-process workers share this module


class Warmed(RowCounter):
    def warm_up(self, xp):
        WARMED.append(threading.current_thread().name)


def test_every_worker_warms_up_once_before_the_first_clock(inproc):
    WARMED.clear()
    res = dscar.fit(Warmed(), row_data(40), inproc, n_shards=4, max_clocks=2)
    assert_exactly_once(res, 40)
    assert len(WARMED) == 2  # once per worker of the job
    assert all(not name.startswith("dscar-loop") for name in WARMED)  # not in a shard step of a clock


FIT_COMPILES_NOTHING = r"""
import numpy as np, scipy.sparse as sp
import dscar
from dscar.algorithms import lasso_kernels as LK, mlr_kernels as MK, mf_kernels as FK, lda as L
from dscar.algorithms.mf import ALS, ratings_data, train_test_split
from dscar.algorithms.lasso import LassoCD
from dscar.algorithms.mlr import MLRSGD
from dscar.algorithms.lda import LDAGibbs, lda_data
from dscar.algorithms.datasets import make_classification, make_ratings, make_regression

def signatures():
    k = L._numba_kernels()
    fns = {"residual": LK.residual, "gram_cd_anderson": LK.gram_cd_anderson,
           "softmax_stats": MK.softmax_stats, "local_sgd": MK.local_sgd,
           "als_rows": FK.als_rows, "score_rows": FK.score_rows}
    fns.update({n: f for n, f in vars(k).items() if hasattr(f, "signatures")})
    return {n: len(f.signatures) for n, f in fns.items()}

if __name__ == "__main__":
    lasso, mlr, lda = LassoCD(0.01), MLRSGD(3, lr=0.5), LDAGibbs(n_topics=8)
    u, i, r, _ = make_ratings(300, 100, 3000, rank=4, seed=0)
    train, test = train_test_split(u, i, r, seed=0)
    mfs = [ALS(300, 100, 4, mean=float(r.mean()), dtype=dt) for dt in ("float64", "float32")]
    for a in (lasso, mlr, lda, *mfs):
        a.warm_up(np)
    before = signatures()
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        X, y, _ = make_regression(4000, 50, 5, seed=0)
        dscar.fit(lasso, {"X": X, "y": y}, cl, max_clocks=8)
        X, y, _ = make_classification(4000, 10, 3, seed=0)
        dscar.fit(mlr, {"X": X, "y": y}, cl, max_clocks=4)
        docs = sp.random(200, 300, density=0.05, format="csr", random_state=0)
        docs.data = np.ceil(docs.data * 4).astype(np.int64)
        dscar.fit(lda, lda_data(docs), cl, max_clocks=12)
        for mf in mfs:
            dscar.fit(mf, ratings_data(train, test, n_users=300, n_items=100, n_shards=4), cl, max_clocks=3)
    after = signatures()
    print({n: after[n] - before.get(n, 0) for n in after if after[n] != before.get(n, 0)})
"""


def test_after_warm_up_a_fit_loads_no_kernel(tmp_path):
    """In a fresh process (numba loads a kernel per signature at first call): every kernel the
    Lasso, MLR, LDA and MF (float64, float32) fits call was loaded by ``warm_up``, with the fits'
    argument types."""
    script = tmp_path / "fit_compiles_nothing.py"
    script.write_text(FIT_COMPILES_NOTHING)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "{}", out.stdout
