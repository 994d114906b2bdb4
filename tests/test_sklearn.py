"""The estimators are scikit-learn estimators: scikit-learn's own checks, clone / copy / pickle with
a cluster, and the meta-estimators (GridSearchCV, Pipeline) fitting on the cluster they were given."""
import copy
import io
import pickle
import warnings

import joblib
import numpy as np
import pytest
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks

import dscar
from dscar.algorithms.lasso import Lasso
from dscar.algorithms.lda import LDA
from dscar.algorithms.mf import MF
from dscar.algorithms.mlr import MLR

pytestmark = pytest.mark.usefixtures("one_blas_thread")


@pytest.fixture(scope="module")
def cluster():
    """One in-process cluster for every fit of this file (scikit-learn's checks fit ~100 times)."""
    with dscar.Cluster(n_workers=2, processes=False) as cl:
        yield cl


ONE_ROW_PER_WORKER = ("a fit needs at least one row per worker (each worker trains on a shard of its own): "
                      "one sample on a 2-worker cluster is refused with InvalidInputError '1 shard(s) for 2 workers'")
EXPECTED_FAILURES = {
    "Lasso": {"check_fit2d_1sample": ONE_ROW_PER_WORKER},
    "MLR": {"check_fit2d_1sample": ONE_ROW_PER_WORKER},
}


def _expected_failures(est):
    return EXPECTED_FAILURES[type(est).__name__]


@parametrize_with_checks([Lasso(alpha=0.01, progress=False), MLR(max_iter=30, progress=False)],
                         expected_failed_checks=_expected_failures)
def test_scikit_learn_checks(estimator, check, cluster):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dscar.ConvergenceWarning)
        check(estimator.set_params(cluster=cluster))


def _regression(n=200, p=5, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    return X, X @ np.arange(1.0, p + 1) + 0.1 * rng.normal(size=n)


def test_the_estimators_are_what_scikit_learn_says_they_are():
    assert is_regressor(Lasso()) and is_classifier(MLR())
    assert Lasso().__sklearn_tags__().input_tags.sparse and LDA().__sklearn_tags__().transformer_tags is not None
    assert issubclass(dscar.ConvergenceWarning, __import__("sklearn.exceptions").exceptions.ConvergenceWarning)
    assert issubclass(dscar.ConvergenceWarning, UserWarning)


def test_predicting_before_fit_raises_not_fitted():
    X, _ = _regression(4, 3)
    for call in (lambda: Lasso().predict(X), lambda: MLR().predict(X), lambda: MLR().predict_proba(X),
                 lambda: LDA().transform(np.ones((2, 3))), lambda: LDA().score(np.ones((2, 3))),
                 lambda: MF().predict([0], [0]), lambda: MF().rmse(([0], [0], [1.0]))):
        with pytest.raises(NotFittedError):
            call()


def test_scores_follow_scikit_learn(cluster):
    """R² (Lasso), accuracy (MLR) with labels of any type, minus RMSE (MF), log-likelihood (LDA)."""
    from sklearn.metrics import r2_score

    pd = pytest.importorskip("pandas")
    X, y = _regression()
    frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])])
    est = Lasso(alpha=0.01, cluster=cluster).fit(frame, y)
    assert est.score(frame, y) == pytest.approx(r2_score(y, est.predict(frame)))
    assert est.n_features_in_ == 5 and list(est.feature_names_in_) == list(frame.columns)
    with pytest.raises(ValueError, match="X has 4 features, but Lasso is expecting 5"):
        est.predict(X[:, :4])

    labels = np.where(X[:, 0] + X[:, 1] > 0, "spam", "ham")
    clf = MLR(max_iter=50, cluster=cluster).fit(X, labels)
    assert list(clf.classes_) == ["ham", "spam"] and set(clf.predict(X)) <= {"ham", "spam"}
    assert clf.score(X, labels) == pytest.approx(np.mean(clf.predict(X) == labels)) and clf.score(X, labels) > 0.9
    assert clf.decision_function(X).shape == (len(X),)  # two classes: one score column, as scikit-learn

    from dscar.algorithms.datasets import make_ratings

    u, i, r, _ = make_ratings(100, 50, 2000, seed=0)
    mf = MF(rank=3, max_iter=20, cluster=cluster, n_shards=4).fit((u, i, r))
    assert mf.score((u, i, r)) == -mf.rmse((u, i, r)) < 0

    rng = np.random.default_rng(0)
    docs = rng.poisson(1.0, size=(40, 30))
    lda = LDA(n_topics=3, n_iter=5, cluster=cluster).fit(docs)
    ll = lda.score(docs)
    assert ll < 0 and lda.perplexity(docs) == pytest.approx(np.exp(-ll / docs.sum()))
    assert lda.n_features_in_ == 30 and lda.transform(docs).shape == (40, 3)


def test_a_cluster_is_shared_by_clones_and_copies_and_pickled_as_its_address(cluster):
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as local:
        for given, address in ((cluster, cluster.client.scheduler.address),
                               (cluster.client, cluster.client.scheduler.address),
                               (local, local.scheduler_address), ("tcp://127.0.0.1:8786", "tcp://127.0.0.1:8786")):
            for est in (Lasso(alpha=0.1, cluster=given), MLR(cluster=given), LDA(cluster=given), MF(cluster=given)):
                assert clone(est).cluster is given and copy.deepcopy(est).cluster is given
                assert clone(est).get_params()["alpha" if isinstance(est, Lasso) else "n_workers"] == \
                    est.get_params()["alpha" if isinstance(est, Lasso) else "n_workers"]
                assert pickle.loads(pickle.dumps(est)).cluster == address
                buf = io.BytesIO()
                joblib.dump(est, buf)
                assert joblib.load(io.BytesIO(buf.getvalue())).cluster == address
    assert pickle.dumps(cluster)  # a dscar.Cluster pickles as its address (joblib.hash of parameters)
    assert copy.deepcopy(cluster) is cluster


def test_a_fitted_estimator_pickles_into_one_that_predicts_without_a_cluster(cluster, tmp_path):
    import subprocess
    import sys

    X, y = _regression()
    est = Lasso(alpha=0.01, cluster=cluster).fit(X, y)
    (tmp_path / "est.pkl").write_bytes(pickle.dumps(est))
    np.save(tmp_path / "X.npy", X)
    code = ("import pickle, numpy as np, sys; est = pickle.load(open(sys.argv[1], 'rb')); "
            "np.save(sys.argv[2], est.predict(np.load(sys.argv[3])))")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "est.pkl"), str(tmp_path / "p.npy"),
                    str(tmp_path / "X.npy")], check=True, timeout=120)
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), est.predict(X))


def test_grid_search_and_a_pipeline_fit_on_the_cluster_given(cluster):
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = _regression(300, 6)
    X = X * np.arange(1, 7) + 3.0  # a scaler has something to do
    search = GridSearchCV(Lasso(cluster=cluster), {"alpha": [0.01, 0.1, 1.0]}, cv=3).fit(X, y)
    assert search.best_params_ == {"alpha": 0.01} and search.best_estimator_.cluster is cluster
    assert search.score(X, y) > 0.99
    pipe = make_pipeline(StandardScaler(), Lasso(alpha=0.01, cluster=cluster)).fit(X, y)
    assert pipe.score(X, y) > 0.99
    labels = (X[:, 0] > 3.0).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dscar.ConvergenceWarning)
        clf = GridSearchCV(make_pipeline(StandardScaler(), MLR(cluster=cluster, max_iter=30)),
                           {"mlr__l2": [1e-3, 1e-2]}, cv=2).fit(X, labels)
    assert clf.best_estimator_[-1].cluster is cluster and clf.score(X, labels) > 0.9


def test_model_selection_uses_the_scores_of_lda_and_mf(cluster):
    """GridSearchCV picks by ``score``: LDA's held-out log-likelihood, MF's minus RMSE on a ratings
    DataFrame split by rows."""
    from sklearn.model_selection import GridSearchCV

    pd = pytest.importorskip("pandas")
    from dscar.algorithms.datasets import make_ratings

    rng = np.random.default_rng(1)
    docs = rng.poisson(1.0, size=(60, 30))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dscar.ConvergenceWarning)
        lda = GridSearchCV(LDA(n_iter=5, cluster=cluster), {"n_topics": [2, 3]}, cv=2).fit(docs)
        u, i, r, _ = make_ratings(80, 40, 2500, seed=1)
        frame = pd.DataFrame({"user": u, "item": i, "rating": r})
        mf = GridSearchCV(MF(rank=2, max_iter=5, n_users=80, n_items=40, n_shards=4, cluster=cluster),
                          {"reg": [0.05, 50.0]}, cv=2).fit(frame)
    scores = lda.cv_results_["mean_test_score"]
    assert np.all(scores < 0) and lda.best_score_ == scores.max() and lda.best_estimator_.cluster is cluster
    rmse = -mf.cv_results_["mean_test_score"]
    assert np.all(rmse > 0) and mf.best_params_ == {"reg": [0.05, 50.0][int(np.argmin(rmse))]}
