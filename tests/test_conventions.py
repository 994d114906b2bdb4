"""scikit-learn's conventions where a user expects them, and the API behaving like the CLI."""
import os
import warnings

import pytest

import dscar
from dscar import faults
from dscar.algorithms.datasets import make_ratings, make_regression
from dscar.algorithms.lasso import Lasso, LassoCD
from dscar.algorithms.lda import LDA
from dscar.algorithms.mf import MF
from dscar.algorithms.mlr import MLR


def test_progress_defaults_to_the_terminal():
    """``progress=None``: a bar when stderr is a terminal (the driver asks ``isatty``), as the CLI."""
    for est in (Lasso(), LDA(), MLR(), MF()):
        assert est.get_params()["progress"] is None, type(est).__name__


@pytest.mark.timeout(120)
def test_max_iter_stopping_a_fit_warns(inproc):
    X, y, _ = make_regression(2000, 100, 5, seed=0)
    with pytest.warns(dscar.ConvergenceWarning, match=r"Lasso stopped after 1 iterations \(max_iter=1\)"):
        Lasso(alpha=0.001, max_iter=1, cluster=inproc).fit(X, y)  # > 64 features: clock 1 only screens
    u, i, r, _ = make_ratings(200, 100, 3000, seed=0)
    with pytest.warns(dscar.ConvergenceWarning, match="MF stopped after 1 iterations"):
        MF(rank=4, max_iter=1, cluster=inproc, n_shards=4).fit((u, i, r))
    with warnings.catch_warnings():
        warnings.simplefilter("error", dscar.ConvergenceWarning)  # a converged fit does not warn
        est = Lasso(alpha=0.01, max_iter=100, cluster=inproc).fit(X, y)
    assert est.converged_


@pytest.mark.timeout(180)
def test_a_kill_without_a_store_gets_a_temporary_one_removed_at_the_end():
    """As ``dscar run --kill`` does: injected worker losses need checkpoints to recover from."""
    X, y, _ = make_regression(3000, 100, 5, seed=0)  # > 64 features: a screening clock first, the kill comes
    res = dscar.fit(LassoCD(0.01), {"X": X, "y": y}, n_workers=3, faults=[faults.kill(1, 3, point="apply")])
    tmp = [e for e in res.events if e["kind"] == "checkpoint-store-temporary"]
    assert len(tmp) == 1 and os.path.basename(tmp[0]["path"]).startswith("dscar-checkpoints-")
    assert not os.path.exists(tmp[0]["path"])
    assert res.converged and any(e["kind"] == "recovery-done" for e in res.events)
