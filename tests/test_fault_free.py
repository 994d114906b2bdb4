"""A fault-free fit reports no failed attempt (DESIGN.md invariant 8, issue 38 item 6): every model on
2 worker processes with backups on, its shard 0 slow enough that a backup of it starts and, reading
after the primary's pass was applied, loses the race (the case that failed: LDA's "negative count"),
and no ``shard-failed`` event. SSP runs the exactly-once model, strict: it raises where a step's
shard state and tables disagree."""
import time

import numpy as np
import pytest

import dscar
from dscar.algorithms import corpora
from dscar.algorithms.datasets import lasso_alpha_max, make_classification, make_ratings, make_regression
from dscar.algorithms.lasso import LassoCD
from dscar.algorithms.lda import LDAGibbs, lda_data
from dscar.algorithms.mf import ALS, ratings_data
from dscar.algorithms.mlr import MLRSGD
from dscar.core.policies import BackupPolicy
from bench.worker_models import ExactlyOnce

#: seconds shard 0's step waits before it reads anything: its backup (on the other worker) copies the
#: shard's state, then reads the tables while the primary commits and the pass is applied
SLOW_S = 0.25


def slow_first_shard(name, cls):
    """``cls`` whose shard 0 waits ``SLOW_S`` seconds at the start of each step (primary and backup)."""

    def shard_step(self, ctx, data):
        if ctx.shard == 0:
            time.sleep(SLOW_S)
        return cls.shard_step(self, ctx, data)

    return type(name, (cls,), {"shard_step": shard_step, "__module__": __name__, "__qualname__": name})


SlowLasso = slow_first_shard("SlowLasso", LassoCD)
SlowLDA = slow_first_shard("SlowLDA", LDAGibbs)
SlowALS = slow_first_shard("SlowALS", ALS)
SlowMLR = slow_first_shard("SlowMLR", MLRSGD)


class StrictExactlyOnce(ExactlyOnce):
    """``bench.worker_models.ExactlyOnce`` that raises where the shard's state and the tables disagree (as LDA's
    sweep does on a negative count) instead of marking it: an attempt that read another attempt's
    applied update of its own shard fails."""

    def shard_step(self, ctx, data):
        steps = float(dscar.to_host(ctx.pull("steps", ctx.shard, ctx.shard + 1))[0])
        if steps != self._count(ctx):
            raise ValueError(f"shard {ctx.shard}: state {self._count(ctx)} but tables {steps}")
        super().shard_step(ctx, data)


SlowExactlyOnce = slow_first_shard("SlowExactlyOnce", StrictExactlyOnce)


def problem(name):
    """``(algorithm, data, fit options)`` of a small fit of model ``name``."""
    if name == "lasso":
        X, y, _ = make_regression(600, 30, 6, seed=1)
        return SlowLasso(0.05 * lasso_alpha_max(X, y), tol=1e-12), {"X": X, "y": y}, {"n_shards": 4}
    if name == "lda":
        c = corpora.synthetic(120, 150, 40, 4, seed=3)
        return SlowLDA(4, seed=1, early_stop=False), lda_data(c.X), {"n_shards": 4}
    if name == "mf":
        u, i, r, _ = make_ratings(300, 150, 4_000, 4, 0.5, seed=3)
        return SlowALS(300, 150, 4, reg=0.1), ratings_data((u, i, r), n_users=300, n_items=150, n_shards=4), {}
    if name == "mlr":
        X, y, _ = make_classification(800, 20, 4, seed=2)
        return SlowMLR(4, steps=4, batch_size=32), {"X": X, "y": y}, {"n_shards": 4}
    assert name == "exactly-once-ssp"
    return SlowExactlyOnce(6, staleness=1), {"x": np.arange(4, dtype=np.float64)}, {
        "n_shards": 4, "consistency": "ssp", "staleness": 1}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["lasso", "lda", "mf", "mlr", "exactly-once-ssp"])
def test_a_fault_free_fit_with_late_backups_reports_no_failed_attempt(procs, name):
    algo, data, kw = problem(name)
    backup = BackupPolicy(k=1e-3, min_s=0.05)  # any shard running 50 ms while a worker is idle
    res = dscar.fit(algo, data, procs, max_clocks=6, tol=1e-15, policies=[backup], progress=False, **kw)
    failed = [e for e in res.events if e["kind"] == "shard-failed"]
    assert not failed, failed
    assert res.n_clocks >= 2 and not [e for e in res.events if e["kind"] in ("worker-lost", "worker-removed")]
    if name == "exactly-once-ssp":  # (a backup is rare under SSP: shards waiting for the window count as to do)
        assert all(r.metrics["violations"] == 0 for r in res.history if "violations" in r.metrics)
    else:
        backups = [e for e in res.events if e["kind"] == "backup-attempt"]
        assert backups, "no backup started: the race this test is about never ran"
