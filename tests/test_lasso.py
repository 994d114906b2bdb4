"""Lasso on dscar reaches scikit-learn's optimum (objective to 1e-6 relative)."""
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_diabetes
from sklearn.linear_model import Lasso as SkLasso

import dscar
from dscar.algorithms.datasets import lasso_alpha_max, make_regression, make_spectra
from dscar.algorithms.lasso import Lasso, LassoCD, gram_cd, next_working_set
from dscar.algorithms.lasso_kernels import gram_cd_anderson


def objective(X, y, w, b, alpha):
    r = y - X @ w - b
    return float(r @ r / (2 * len(y)) + alpha * np.abs(w).sum())


def sklearn_reference(X, y, alpha, fit_intercept=True):
    sk = SkLasso(alpha=alpha, fit_intercept=fit_intercept, tol=1e-12, max_iter=1_000_000).fit(X, y)
    return sk, objective(X, y, sk.coef_, sk.intercept_, alpha)


def intercept(res, n):
    return float(res.params["moments"][0] / n - (res.params["colsum"] / n) @ res.params["w"])


def test_gram_cd_solves_the_block_problem_exactly():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((300, 12))
    y = rng.standard_normal(300)
    n, alpha = 300, 0.05
    w = gram_cd(X.T @ X, X.T @ y, np.zeros(12), n * alpha)
    sk = SkLasso(alpha=alpha, fit_intercept=False, tol=1e-14, max_iter=100000).fit(X, y)
    np.testing.assert_allclose(w, sk.coef_, atol=1e-9)


@pytest.mark.parametrize("ill", [False, True])
def test_compiled_anderson_block_solver_equals_the_reference(ill):
    """The compiled CD + Anderson block solve against the pure-Python reference ``gram_cd`` on the same block,
    well-conditioned and near-collinear (spectra: neighbouring columns correlated > 0.99)."""
    if ill:
        X, y, _ = make_spectra(120, 15, seed=2)
    else:
        rng = np.random.default_rng(1)
        X, y = rng.standard_normal((300, 12)), rng.standard_normal(300)
    n = X.shape[0]
    G, c = X.T @ X, X.T @ y
    lam = n * (1e-3 if ill else 1e-2) * lasso_alpha_max(X, y, False)
    w0 = np.zeros(X.shape[1])
    w0[:3] = 0.1  # a warm start off the optimum: the block problem is in w - w0
    c0 = c - G @ w0  # X^T r at w0
    ref = gram_cd(G, c0, w0, lam, tol=1e-14, max_sweeps=200_000)
    for m in (0, 5):
        got, sweeps, kkt = gram_cd_anderson(G, c0, w0, lam, 1e-10 * lam, 200_000, m)
        assert kkt <= 1e-10 * lam and sweeps < 200_000
        obj = lambda w: -(w - w0) @ c0 + 0.5 * (w - w0) @ G @ (w - w0) + lam * np.abs(w).sum()  # noqa: E731
        assert obj(got) <= obj(ref) + 1e-9 * abs(obj(ref))
        np.testing.assert_allclose(got, ref, atol=1e-6 * np.abs(ref).max())
    if ill:  # extrapolation is what makes the ill-conditioned block cheap
        plain = gram_cd_anderson(G, c0, w0, lam, 1e-10 * lam, 200_000, 0, False)[1]
        fast = gram_cd_anderson(G, c0, w0, lam, 1e-10 * lam, 200_000, 5)[1]
        assert fast < plain / 3, (fast, plain)


def test_cached_working_set_gram_equals_the_direct_product():
    """A shard's Gram cache across changing working sets (growing, shrinking, restarting past its size) returns
    exactly ``X_ws^T X_ws``, dense and sparse."""
    rng = np.random.default_rng(3)
    Xd = rng.standard_normal((200, 400))
    for X in (np.asfortranarray(Xd), sp.csc_matrix(np.where(np.abs(Xd) > 1, Xd, 0.0))):
        data = {}
        for ws in ([3, 7, 100], [3, 7, 100, 5, 399], [7, 5], list(range(0, 400, 2)), [1, 2, 3], list(range(300))):
            ws = np.array(sorted(ws))
            G = LassoCD._ws_gram(data, X, ws, np)
            D = X[:, ws].T @ X[:, ws]
            np.testing.assert_allclose(G, D.toarray() if sp.issparse(D) else D, rtol=1e-12, atol=1e-9)
        assert data["gram.cache"][0].size <= max(256, 2 * 300)


def test_compiled_and_reference_kernels_reach_the_same_lasso(inproc):
    X, y, _ = make_spectra(150, 60, seed=4)
    alpha = 1e-3 * lasso_alpha_max(X, y)
    runs = {k: dscar.fit(LassoCD(alpha, tol=1e-9, kernel=k), {"X": X, "y": y}, inproc, max_clocks=300)
            for k in ("compiled", "namespace")}
    assert all(r.converged for r in runs.values())
    objs = {k: r.history[-1].metrics["objective"] for k, r in runs.items()}
    assert objs["compiled"] == pytest.approx(objs["namespace"], rel=1e-8)
    assert runs["compiled"].n_clocks <= runs["namespace"].n_clocks
    with pytest.raises(dscar.InvalidInputError, match="kernel"):
        LassoCD(0.1, kernel="fast")


def test_next_working_set_keeps_support_then_worst_violators():
    w = np.array([0.0, 1.0, 0.0, 0.0, 0.0])
    c = np.array([5.0, 0.0, 0.5, 9.0, 2.0])  # lam = 1: violators 0, 3, 4
    ws = next_working_set(w, c, 1.0, cap=5, start=2)
    assert ws[0] == 2 and set(ws[1:3]) == {1, 3}
    ws = next_working_set(w, c, 1.0, cap=5, start=10)
    assert ws[0] == 4 and set(ws[1:5]) == {0, 1, 3, 4}


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("rho", [0.0, 0.8])
def test_synthetic_matches_sklearn(inproc, fit_intercept, rho):
    X, y, _ = make_regression(3000, 80, 10, rho=rho, seed=3)
    y = y + 2.5
    alpha = 0.02 * lasso_alpha_max(X, y, fit_intercept)
    _, ref = sklearn_reference(X, y, alpha, fit_intercept)
    res = dscar.fit(LassoCD(alpha, fit_intercept=fit_intercept, tol=1e-9), {"X": X, "y": y}, inproc,
                    n_shards=6, max_clocks=100)
    assert res.converged
    b = intercept(res, len(y)) if fit_intercept else 0.0
    got = objective(X, y, res.params["w"], b, alpha)
    assert abs(got - ref) <= 1e-6 * ref, (got, ref)


def test_diabetes_matches_sklearn_through_the_estimator(inproc):
    X, y = load_diabetes(return_X_y=True)
    alpha = 0.01 * lasso_alpha_max(X, y)
    sk, ref = sklearn_reference(X, y, alpha)
    est = Lasso(alpha, tol=1e-10, cluster=inproc, n_shards=4).fit(X, y)
    got = objective(X, y, est.coef_, est.intercept_, alpha)
    assert abs(got - ref) <= 1e-6 * ref
    np.testing.assert_allclose(est.coef_, sk.coef_, atol=1e-5 * np.abs(sk.coef_).max())
    np.testing.assert_allclose(est.predict(X), sk.predict(X), rtol=1e-5, atol=1e-5)
    assert est.get_params()["alpha"] == alpha and est.n_iter_ == est.result_.n_clocks
    assert est.set_params(alpha=1.0).alpha == 1.0


def data_gap(X, y, w, b, alpha):
    """The duality gap of ``(w, b)`` computed from the data (the dual point the engine uses)."""
    n = len(y)
    yc = y - b if b else y
    r = yc - X @ w
    corr = np.abs((X - X.mean(axis=0)).T @ r if b else X.T @ r).max()
    const = min(1.0, n * alpha / corr) if corr > 0 else 1.0
    return (0.5 * r @ r * (1 + const**2) + n * alpha * np.abs(w).sum() - const * r @ yc) / n


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_a_problem_that_fits_one_block_is_solved_and_certified_at_clock_1(inproc, fit_intercept):
    """p <= working_set_start: clock 1 gathers the whole Gram with its screening, solves the problem and
    certifies it from the moments (one clock); with a smaller first block it takes three or more."""
    X, y = load_diabetes(return_X_y=True)
    alpha = 0.01 * lasso_alpha_max(X, y, fit_intercept)
    _, ref = sklearn_reference(X, y, alpha, fit_intercept)
    fits = {start: dscar.fit(LassoCD(alpha, fit_intercept=fit_intercept, tol=1e-9, working_set_start=start),
                             {"X": X, "y": y}, inproc, n_shards=4, max_clocks=20) for start in (64, 4)}
    for res in fits.values():
        b = intercept(res, len(y)) if fit_intercept else 0.0
        assert res.converged and abs(objective(X, y, res.params["w"], b, alpha) - ref) <= 1e-6 * ref
    one = fits[64]
    assert one.n_clocks == 1 and one.history[0].metrics["working_set"] == X.shape[1]
    # the certificate describes the model returned, and bounds its gap as the data computes it
    m, w = one.history[0].metrics, one.params["w"]
    b = intercept(one, len(y)) if fit_intercept else 0.0
    assert m["objective"] == pytest.approx(objective(X, y, w, b, alpha), rel=1e-9)
    assert data_gap(X, y, w, b, alpha) <= m["gap"] <= 1e-9 * m["objective"]
    assert fits[4].n_clocks >= 3


def near_perfect_fit():
    """``r.r`` ~ 1e-12 of ``y.y``: the whole-block certificate is too loose for rounding at clock 1."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((400, 8))
    return X, X @ rng.standard_normal(8) * 1e4 + 1e-3 * rng.standard_normal(400)


def test_a_whole_block_certificate_too_loose_for_rounding_is_left_to_a_data_pass(inproc):
    """A near-perfect fit: ``r.r`` from the moments is mostly rounding, so clock 1 does not certify it;
    the next clock's data pass does."""
    X, y = near_perfect_fit()
    res = dscar.fit(LassoCD(1e-9 * lasso_alpha_max(X, y), tol=1e-6), {"X": X, "y": y}, inproc, n_shards=4,
                    max_clocks=20)
    assert res.converged and res.n_clocks == 2, [h.metrics for h in res.history]


@pytest.mark.parametrize("data, ratio, tol, loss_clock", [("diabetes", 0.01, 1e-9, 1), ("near-perfect", 1e-9, 1e-6, 2)])
def test_a_loss_while_one_block_is_solved_or_certified_still_reaches_the_optimum(tmp_path, data, ratio, tol,
                                                                                  loss_clock):
    """Losses in the clock that solves the whole block and in the clock that certifies it."""
    from dscar import CheckpointConfig, faults

    X, y = load_diabetes(return_X_y=True) if data == "diabetes" else near_perfect_fit()
    alpha = ratio * lasso_alpha_max(X, y)
    _, ref = sklearn_reference(X, y, alpha)
    with dscar.Cluster(n_workers=3, processes=False) as cl:
        res = dscar.fit(LassoCD(alpha, tol=tol), {"X": X, "y": y}, cl, n_shards=6, max_clocks=20,
                        checkpoint=CheckpointConfig(str(tmp_path), policy="full", every=1),
                        faults=[faults.lose(1, loss_clock)])
    assert any(e["kind"] == "recovery-done" for e in res.events) and res.converged
    assert abs(objective(X, y, res.params["w"], intercept(res, len(y)), alpha) - ref) <= max(tol, 1e-6) * ref


def test_sparse_input_matches_dense(inproc):
    X, y, _ = make_regression(2000, 60, 8, seed=5)
    X[np.abs(X) < 1.0] = 0.0
    alpha = 0.02 * lasso_alpha_max(X, y)
    dense = dscar.fit(LassoCD(alpha, tol=1e-10), {"X": X, "y": y}, inproc, n_shards=4)
    sparse = dscar.fit(LassoCD(alpha, tol=1e-10), {"X": sp.csr_matrix(X), "y": y}, inproc, n_shards=4)
    np.testing.assert_allclose(sparse.params["w"], dense.params["w"], atol=1e-8)


def test_alpha_above_alpha_max_converges_to_zero_in_one_clock(inproc):
    X, y, _ = make_regression(500, 20, 5, seed=1)
    res = dscar.fit(LassoCD(2 * lasso_alpha_max(X, y)), {"X": X, "y": y}, inproc, n_shards=2)
    assert res.converged and res.n_clocks == 1 and not res.params["w"].any()


def test_failure_free_runs_are_deterministic(inproc):
    X, y, _ = make_regression(1500, 40, 6, seed=7)
    alpha = 0.05 * lasso_alpha_max(X, y)
    a = dscar.fit(LassoCD(alpha, tol=1e-9), {"X": X, "y": y}, inproc, n_shards=5)
    b = dscar.fit(LassoCD(alpha, tol=1e-9), {"X": X, "y": y}, inproc, n_shards=5)
    np.testing.assert_array_equal(a.params["w"], b.params["w"])
    assert [r.metrics for r in a.history] == [r.metrics for r in b.history]


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda X, y: (LassoCD(-1.0), {"X": X, "y": y}, {}), "alpha"),
        (lambda X, y: (LassoCD(0.1), {"X": np.where(X > 2, np.nan, X), "y": y}, {}), "NaN"),
        (lambda X, y: (LassoCD(0.1), {"X": X, "y": np.where(y > 2, np.inf, y)}, {}), "y contains"),
        (lambda X, y: (LassoCD(0.1), {"X": X, "y": y[:-1]}, {}), "different numbers of rows"),
        (lambda X, y: (LassoCD(0.1), {"X": X[:0], "y": y[:0]}, {}), "empty"),
        (lambda X, y: (LassoCD(0.1), {"X": X[:3], "y": y[:3]}, {"n_shards": 4}), "fewer than the 4 shards"),
        (lambda X, y: (LassoCD(0.1), {"X": X, "y": y}, {"n_shards": 1}), "at least one shard per worker"),
        (lambda X, y: (LassoCD(0.1), {"X": X[:, 0], "y": y}, {}), "X must be 2-D"),
        (lambda X, y: (LassoCD(0.1), {"X": X, "y": X}, {}), "y must be 1-D"),
        (lambda X, y: (LassoCD(0.1), {"X": X}, {}), "missing"),
        (lambda X, y: (LassoCD(0.1, tol=0), {"X": X, "y": y}, {}), "tol"),
    ],
)
def test_bad_input_raises_before_any_work(inproc, make, match):
    X, y, _ = make_regression(50, 4, 2, seed=0)
    events_before = inproc.client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.plugins["dscar-coordinator"].jobs))
    with pytest.raises(dscar.InvalidInputError, match=match):
        algo, data, kw = make(X, y)
        dscar.fit(algo, data, inproc, **kw)
    after = inproc.client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.plugins["dscar-coordinator"].jobs))
    assert events_before == after == 0
