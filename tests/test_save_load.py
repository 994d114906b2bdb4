"""A fitted model saved as arrays and JSON (no pickle) loads in a fresh process, without a cluster,
and predicts exactly what the saved one predicts."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dscar
from dscar.algorithms.datasets import make_ratings
from dscar.algorithms.lasso import Lasso
from dscar.algorithms.lda import LDA
from dscar.algorithms.mf import MF
from dscar.algorithms.mlr import MLR

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

#: run in a fresh interpreter: load each saved model, predict on the saved inputs
PREDICT = textwrap.dedent("""
    import sys, numpy as np
    from dscar.algorithms.lasso import Lasso
    from dscar.algorithms.lda import LDA
    from dscar.algorithms.mf import MF
    from dscar.algorithms.mlr import MLR
    d = sys.argv[1]
    X, docs, u, i = (np.load(f"{d}/{k}.npy") for k in ("X", "docs", "u", "i"))
    np.save(f"{d}/lasso.pred.npy", Lasso.load(f"{d}/lasso").predict(X))
    mlr = MLR.load(f"{d}/mlr")
    np.save(f"{d}/mlr.pred.npy", mlr.predict(X))
    np.save(f"{d}/mlr.proba.npy", mlr.predict_proba(X))
    np.save(f"{d}/lda.pred.npy", LDA.load(f"{d}/lda").transform(docs))
    np.save(f"{d}/mf.pred.npy", MF.load(f"{d}/mf").predict(u, i))
""")


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 4))
    y = X @ [1.0, -2.0, 0.0, 0.5] + 0.1 * rng.normal(size=120)
    labels = np.array(["low", "mid", "high"])[np.digitize(X[:, 0] + X[:, 1], [-0.5, 0.5])]
    docs = rng.poisson(1.0, size=(30, 25))
    u, i, r, _ = make_ratings(60, 40, 900, seed=0)
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        models = {"lasso": Lasso(alpha=0.01, cluster=cl).fit(X, y),
                  "mlr": MLR(max_iter=20, cluster=cl).fit(X, labels),
                  "lda": LDA(n_topics=3, n_iter=5, cluster=cl).fit(docs, vocab=[f"w{j}" for j in range(25)]),
                  "mf": MF(rank=3, max_iter=3, cluster=cl, n_shards=4).fit((u, i, r))}
    return models, {"X": X, "docs": docs, "u": u, "i": i}


def test_saved_models_predict_the_same_in_a_fresh_process(fitted, tmp_path):
    models, inputs = fitted
    for name, est in models.items():
        est.save(str(tmp_path / name))
    for k, v in inputs.items():
        np.save(tmp_path / f"{k}.npy", v)
    subprocess.run([sys.executable, "-c", PREDICT, str(tmp_path)], check=True, timeout=120)
    X, docs = inputs["X"], inputs["docs"]
    np.testing.assert_array_equal(np.load(tmp_path / "lasso.pred.npy"), models["lasso"].predict(X))
    np.testing.assert_array_equal(np.load(tmp_path / "mlr.pred.npy"), models["mlr"].predict(X))
    np.testing.assert_array_equal(np.load(tmp_path / "mlr.proba.npy"), models["mlr"].predict_proba(X))
    np.testing.assert_array_equal(np.load(tmp_path / "lda.pred.npy"), models["lda"].transform(docs))
    np.testing.assert_array_equal(np.load(tmp_path / "mf.pred.npy"), models["mf"].predict(inputs["u"], inputs["i"]))
    saved = json.loads((tmp_path / "mlr" / "model.json").read_text())
    assert saved["class"] == "dscar.algorithms.mlr.MLR" and "cluster" not in saved["params"]
    with np.load(tmp_path / "mlr" / "arrays.npz", allow_pickle=False) as npz:  # no pickled object inside
        assert sorted(npz.files) == saved["arrays"] and npz["classes_"].tolist() == ["high", "low", "mid"]


def test_a_loaded_model_has_the_fitted_state_and_hyperparameters(fitted):
    models, _ = fitted
    for name, est in models.items():
        url = f"memory://saved/{name}"  # any fsspec URL
        est.save(url)
        back = type(est).load(url)
        assert back.get_params() == {**est.get_params(), "cluster": None}, name
        for k, v in vars(est).items():
            if k.endswith("_") and k != "result_":
                assert type(getattr(back, k)) is type(v) or isinstance(v, np.ndarray), (name, k)
                np.testing.assert_equal(getattr(back, k), v, err_msg=f"{name}.{k}")
    assert LDA.load("memory://saved/lda").top_words(2) == models["lda"].top_words(2)


def test_loading_what_is_not_that_model_is_refused(fitted, tmp_path):
    models, _ = fitted
    with pytest.raises(dscar.InvalidInputError, match="nothing saved at"):
        Lasso.load(str(tmp_path / "nothing"))
    models["lasso"].save(str(tmp_path / "lasso"))
    with pytest.raises(dscar.InvalidInputError, match="holds a dscar.algorithms.lasso.Lasso, not a dscar.algorithms.mlr.MLR"):
        MLR.load(str(tmp_path / "lasso"))
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        Lasso().save(str(tmp_path / "unfitted"))


def test_a_fit_result_saves_and_loads(fitted, tmp_path):
    """``FitResult.save`` / ``load``: the tables, every clock's record and the event log, as arrays and JSON."""
    models, _ = fitted
    res = models["mf"].result_
    res.save(str(tmp_path / "res"))
    back = dscar.FitResult.load(str(tmp_path / "res"))
    assert sorted(back.params) == sorted(res.params)
    for k, v in res.params.items():
        np.testing.assert_array_equal(back.params[k], v)
    assert back.history == res.history and back.summary() == res.summary()
    assert back.event_lines() == res.event_lines() and len(back.events) == len(res.events)
    assert (back.converged, back.seconds, back.workers) == (res.converged, res.seconds, res.workers)
    with pytest.raises(dscar.InvalidInputError, match="holds no saved dscar-model"):
        MF.load(str(tmp_path / "res"))
