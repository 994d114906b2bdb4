"""The scikit-learn face of dscar's models: ``Lasso``, ``LDA``, ``MF`` and ``MLR``.

They live apart from the models' ``Algorithm`` classes because they import scikit-learn (~1 s of CPU):
a worker process unpickles an algorithm (``LassoCD``, ``LDAGibbs``, ``ALS``, ``MLRSGD``) from its own
module and never needs them; every joiner and restarted worker would otherwise pay that import in CPU
taken from the running workers' clocks. Each estimator keeps its model module as its home
(``dscar.algorithms.lasso.Lasso``: its ``__module__``, pickles, saved estimators), where a module
``__getattr__`` loads this module on first use.
"""
from __future__ import annotations

from collections.abc import Sequence

import dask
import numpy as np
import scipy.sparse as sp
from sklearn.base import ClassifierMixin, RegressorMixin, TransformerMixin

import dscar
from dscar import InvalidInputError, check_features

from . import lasso, lda, mf, mlr
from .lasso import LassoCD
from .lda import LDAGibbs, lda_data, loglikelihood
from .mf import ALS, BIAS_REG, RATING_COLUMNS, _int, check_ratings, from_sparse, ratings_data
from .mlr import MLRSGD, softmax

class Lasso(RegressorMixin, dscar.EstimatorMixin):
    """scikit-learn Lasso trained by dscar (``fit``, ``predict``, ``score`` (R²), ``coef_``,
    ``intercept_``, ``n_features_in_``).

    ``cluster`` is anything ``dscar.fit`` accepts; None starts an embedded
    LocalCluster of ``n_workers`` processes for each ``fit``.
    """

    def __init__(self, alpha: float = 1.0, *, fit_intercept: bool = True, tol: float = 1e-6,
                 max_iter: int = 200, cluster=None, n_workers: int = 2, n_shards: int | None = None,
                 progress: bool | None = None):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.cluster = cluster
        self.n_workers = n_workers
        self.n_shards = n_shards
        self.progress = progress

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def fit(self, X, y) -> "Lasso":
        X, y = check_features(self, X, y, reset=True, accept_sparse=("csr", "csc"), y_numeric=True,
                              dtype=(np.float64, np.float32))
        algo = LassoCD(self.alpha, fit_intercept=self.fit_intercept, tol=self.tol)
        opts = self._engine_options()
        res = dscar.fit(algo, {"X": X, "y": y}, self.cluster, n_workers=opts["n_workers"],
                        n_shards=opts["n_shards"], max_clocks=opts["max_iter"], progress=opts["progress"])
        self._warn_unconverged(res)
        self.coef_ = res.params["w"]
        moments, n_rows = res.params["moments"], np.shape(X)[0]
        if not isinstance(n_rows, (int, np.integer)):  # a Dask DataFrame's row count: counted on the cluster
            n_rows = int(self._compute_small(n_rows))
        if self.fit_intercept:
            self.intercept_ = float(moments[0] / n_rows - (res.params["colsum"] / n_rows) @ self.coef_)
        else:
            self.intercept_ = 0.0
        self.n_iter_ = res.n_clocks
        self.converged_ = res.converged
        self.dual_gap_ = res.history[-1].metrics["gap"]
        self.result_ = res
        return self

    def predict(self, X) -> np.ndarray:
        self._check_fitted("coef_")
        X = check_features(self, X, reset=False, accept_sparse=("csr", "csc"))
        return X @ self.coef_ + self.intercept_


class LDA(TransformerMixin, dscar.EstimatorMixin):
    """scikit-learn style LDA trained by dscar's collapsed Gibbs sampler.

    ``fit(X)`` with a documents x vocabulary count matrix or a list of token-id
    lists; then ``components_`` / ``topic_word_`` (K x V, rows sum to 1, as in
    the ``lda`` package), ``doc_topic_`` (D x K), ``word_topic_`` (V x K
    counts), ``loglikelihoods_`` (log p(w, z) per token after each sweep,
    the first entry being the random initialisation), ``top_words(n)``,
    ``transform(X)`` (fold-in of new documents against the fitted topics), ``score(X)``
    (log-likelihood of documents under the fitted topics, higher is better) and
    ``perplexity(X)``.
    ``n_iter`` is the number of Gibbs sweeps (``n_iter + 1`` clocks).
    ``n_shards`` defaults to one per worker. ``schedule``: ``"partitioned"`` (default: a sweep is
    ``n_shards`` clocks over disjoint vocabulary blocks, as exact per sweep as sequential Gibbs) or
    ``"adlda"`` (a sweep a clock, every shard against the clock-start counts: its approximation
    grows with the number of shards); see ``LDAGibbs.block_tokens``.
    """

    def __init__(self, n_topics: int = 10, *, alpha: float | Sequence[float] = 0.1, beta: float = 0.01,
                 n_iter: int = 200, seed: int = 0, early_stop: bool = False, tol: float = 1e-4,
                 cluster=None, n_workers: int = 2, n_shards: int | None = None, progress: bool | None = None,
                 schedule: str = "partitioned"):
        self.n_topics = n_topics
        self.alpha = alpha
        self.beta = beta
        self.n_iter = n_iter
        self.seed = seed
        self.early_stop = early_stop
        self.tol = tol
        self.cluster = cluster
        self.n_workers = n_workers
        self.n_shards = n_shards
        self.progress = progress
        self.schedule = schedule

    def _algorithm(self) -> LDAGibbs:
        return LDAGibbs(self.n_topics, self.alpha, self.beta, seed=self.seed, tol=self.tol,
                        early_stop=self.early_stop, schedule=self.schedule)

    def fit(self, X, y=None, *, vocab: Sequence[str] | None = None) -> "LDA":
        n_iter = dscar.validation.integer("n_iter", self.n_iter, 1)
        opts = self._engine_options()
        algo = self._algorithm()
        data = lda_data(X)
        if vocab is not None and len(vocab) != data["X"].shape[1]:
            raise InvalidInputError(f"vocab has {len(vocab)} words, X has {data['X'].shape[1]} columns")
        n_shards = self.n_shards
        if n_shards is None:
            n_shards = self.n_workers if self.cluster is None else _n_workers(self.cluster)
            n_shards = max(1, min(n_shards, data["X"].shape[0]))
        per = algo.clocks_per_sweep(n_shards)
        res = dscar.fit(algo, data, self.cluster, n_workers=opts["n_workers"], n_shards=n_shards,
                        max_clocks=n_iter * per + 1, progress=opts["progress"])
        if self.early_stop:  # without early stopping, n_iter sweeps is the plan, not a limit hit
            self._warn_unconverged(res, "n_iter")
        self.word_topic_ = res.params["word_topic"]
        self.doc_topic_counts_ = res.params["doc_topic"]
        a, b = algo.alphas(), algo.beta
        tw = self.word_topic_.T + b
        self.components_ = tw / tw.sum(axis=1, keepdims=True)
        self.topic_word_ = self.components_
        dt = self.doc_topic_counts_ + a
        self.doc_topic_ = dt / dt.sum(axis=1, keepdims=True)
        self.loglikelihoods_ = [rec.metrics["loglik"] for rec in res.history[::per]]  # the start, then each sweep
        self.n_iter_ = (res.n_clocks - 1) // per
        self.vocab_ = None if vocab is None else tuple(vocab)
        self.n_features_in_ = data["X"].shape[1]
        self.result_ = res
        return self

    def loglikelihood(self) -> float:
        """log p(w, z) of the final assignments (total, like ``lda.LDA.loglikelihood()``)."""
        return loglikelihood(self.word_topic_, self.doc_topic_counts_, self._algorithm().alphas(), self.beta)

    def top_words(self, n: int = 10) -> list[list]:
        """The ``n`` most probable words of every topic (vocabulary strings when fitted with ``vocab``)."""
        idx = np.argsort(-self.components_, axis=1, kind="stable")[:, :n]
        if self.vocab_ is None:
            return idx.tolist()
        return [[self.vocab_[i] for i in row] for row in idx]

    def transform(self, X, max_iter: int = 50, tol: float = 1e-8) -> np.ndarray:
        """Document-topic mixtures of new documents, the topics held fixed (EM fold-in)."""
        return self._fold_in(self._counts(X), max_iter, tol)

    def score(self, X, y=None) -> float:
        """Log-likelihood of documents ``X`` under the fitted topics, each document's mixture
        folded in (``transform``): ``sum_d sum_w x_dw log(theta_d . phi_w)``; higher is better."""
        Xc = self._counts(X)
        theta = self._fold_in(Xc, 50, 1e-8)
        rows = np.repeat(np.arange(Xc.shape[0]), np.diff(Xc.indptr))
        p = np.einsum("ik,ki->i", theta[rows], self.components_[:, Xc.indices])
        return float(Xc.data @ np.log(np.maximum(p, 1e-300)))

    def perplexity(self, X) -> float:
        """``exp(-score(X) / tokens of X)``: lower is better (as scikit-learn's LDA reports it)."""
        Xc = self._counts(X)
        return float(np.exp(-self.score(Xc) / Xc.sum()))

    def _counts(self, X) -> sp.csr_matrix:
        """``X`` as a float count matrix over the fitted vocabulary (``NotFittedError`` before ``fit``)."""
        self._check_fitted("components_")
        return lda_data(X, vocab_size=self.components_.shape[1])["X"].astype(np.float64)

    def _fold_in(self, Xc: sp.csr_matrix, max_iter: int, tol: float) -> np.ndarray:
        phi = self.components_  # K x V
        D, K = Xc.shape[0], phi.shape[0]
        theta = np.full((D, K), 1.0 / K)
        rows = np.repeat(np.arange(D), np.diff(Xc.indptr))
        cols = Xc.indices
        for _ in range(max_iter):
            denom = np.einsum("ik,ki->i", theta[rows], phi[:, cols])
            R = sp.csr_matrix((Xc.data / denom, cols, Xc.indptr), shape=Xc.shape)
            new = theta * (R @ phi.T)
            new /= np.maximum(new.sum(axis=1, keepdims=True), 1e-300)
            done = np.abs(new - theta).max() < tol
            theta = new
            if done:
                break
        empty = np.diff(Xc.indptr) == 0
        theta[empty] = 1.0 / K
        return theta

    def fit_transform(self, X, y=None, **kw) -> np.ndarray:
        return self.fit(X, **kw).doc_topic_


def _n_workers(cluster) -> int:
    """Workers of a cluster given as a ``dscar.Cluster``, a Client, a LocalCluster or an address."""
    if isinstance(cluster, dscar.Cluster):
        return len(cluster.workers)
    cl = dscar.Cluster(cluster)
    try:
        return len(cl.workers)
    finally:
        cl.close()


class MF(dscar.EstimatorMixin):
    """scikit-learn style explicit matrix factorization by ALS, trained by dscar.

    ``bias_reg``: the ridge on each bias (not scaled by its rating count); the other
    hyperparameters as ``ALS``.

    ``fit(X, test=None)``: ``X`` is ``(users, items, ratings)`` (COO arrays), a SciPy
    sparse users x items matrix, or a pandas / Dask DataFrame whose ``columns`` (names of the
    user, item and rating columns; default ``("user", "item", "rating")``) hold them; ``test`` optional held-out ratings in either form, scored
    every clock. Fitted: ``user_factors_``, ``item_factors_``, ``user_bias_``, ``item_bias_``
    (zeros without biases), ``global_mean_``, ``history_`` (per clock: objective, train_rmse,
    test_rmse), ``n_iter_``. ``predict(users, items)``; ``rmse(X)``: the RMSE on ratings ``X``;
    ``score(X)``: minus that RMSE (scikit-learn's rule: higher is better).
    """

    def __init__(self, rank: int = 20, *, reg: float = 0.1, reg_mode: str = "weighted", biases: bool = True,
                 bias_reg: float = BIAS_REG, max_iter: int = 20, tol: float = 1e-4, seed: int = 0, n_users: int | None = None,
                 n_items: int | None = None, dtype: str = "float64", cluster=None, n_workers: int = 2,
                 n_shards: int = 8, checkpoint=None, faults=(), progress: bool | None = None,
                 columns: tuple[str, str, str] = RATING_COLUMNS):
        self.rank = rank
        self.reg = reg
        self.reg_mode = reg_mode
        self.biases = biases
        self.bias_reg = bias_reg
        self.max_iter = max_iter
        self.tol = tol
        self.seed = seed
        self.n_users = n_users
        self.n_items = n_items
        self.dtype = dtype
        self.cluster = cluster
        self.n_workers = n_workers
        self.n_shards = n_shards
        self.checkpoint = checkpoint
        self.faults = faults
        self.progress = progress
        self.columns = columns

    def _coo(self, X):
        if sp.issparse(X):
            return from_sparse(X)
        if hasattr(X, "columns") and hasattr(X, "__getitem__"):  # a pandas or Dask DataFrame
            names = self.columns
            if (not isinstance(names, (tuple, list)) or len(names) != 3
                    or not all(isinstance(c, str) for c in names)):
                raise InvalidInputError(f"columns must name the user, item and rating columns, got {names!r}")
            missing = [c for c in names if c not in X.columns]
            if missing:
                raise InvalidInputError(f"the ratings DataFrame has no column(s) {missing} (its columns: "
                                        f"{list(X.columns)}); name them with MF(columns=(user, item, rating))")
            df = X[list(names)]
            if dask.is_dask_collection(df):
                # e.g. dd.read_parquet: ALS groups the ratings by user and by item, so the three
                # columns come to the driver (24 bytes a rating)
                df = self._compute_small(df)
            return tuple(df[c].to_numpy() for c in names)
        try:
            u, i, r = X
        except (TypeError, ValueError):
            raise InvalidInputError("ratings must be (users, items, ratings) arrays or a SciPy sparse matrix") from None
        return u, i, r

    def fit(self, X, test=None) -> "MF":
        shape = X.shape if sp.issparse(X) else (None, None)
        nu, ni = self.n_users or shape[0], self.n_items or shape[1]
        u, i, r, nu, ni = check_ratings(*self._coo(X), nu, ni)
        test_coo = None if test is None else check_ratings(*self._coo(test), nu, ni)[:3]
        mean = float(r.mean()) if self.biases else 0.0
        algo = ALS(nu, ni, self.rank, reg=self.reg, reg_mode=self.reg_mode, biases=self.biases,
                   bias_reg=self.bias_reg, mean=mean, seed=self.seed, tol=self.tol, dtype=self.dtype)  # hyperparameters checked before any work
        data = ratings_data((u, i, r), test_coo, n_users=nu, n_items=ni, n_shards=_int("n_shards", self.n_shards))
        opts = self._engine_options()
        res = dscar.fit(algo, data, self.cluster, n_workers=opts["n_workers"], max_clocks=opts["max_iter"],
                        progress=opts["progress"], checkpoint=self.checkpoint, faults=list(self.faults))
        self._warn_unconverged(res)
        p = res.params
        self.user_factors_, self.item_factors_ = p["user"], p["item"]
        self.user_bias_ = p.get("user_bias", np.zeros(nu))
        self.item_bias_ = p.get("item_bias", np.zeros(ni))
        self.global_mean_ = mean
        self.history_ = [dict(h.metrics) for h in res.history]
        self.n_iter_ = res.n_clocks
        self.converged_ = res.converged
        self.result_ = res
        return self

    def _model(self) -> dict[str, np.ndarray]:
        return {"user": self.user_factors_, "item": self.item_factors_, "user_bias": self.user_bias_,
                "item_bias": self.item_bias_}

    def predict(self, users, items) -> np.ndarray:
        self._check_fitted("user_factors_")
        return mf.predict(self._model(), users, items, self.global_mean_)

    def rmse(self, X) -> float:
        """Root mean squared error of the predicted ratings ``X`` (lower is better)."""
        self._check_fitted("user_factors_")
        return mf.rmse(self._model(), self._coo(X), self.global_mean_)

    def score(self, X, y=None) -> float:
        """Minus ``rmse(X)``: higher is better, as scikit-learn's model selection expects."""
        return -self.rmse(X)


# ------------------------------------------------------------------ CLI


class MLR(ClassifierMixin, dscar.EstimatorMixin):
    """scikit-learn style multinomial logistic regression trained by dscar.

    ``fit``, ``predict``, ``predict_proba``, ``decision_function``, ``score`` (accuracy),
    ``coef_`` (classes x features, like scikit-learn), ``intercept_``, ``classes_``. Labels: any
    sortable values (integers, strings, ...), at least two distinct; ``classes_`` are the
    distinct labels, sorted. ``l2``: see the module docstring
    (scikit-learn's ``C = 1 / (n_samples * l2)``). ``cluster``: anything ``dscar.fit``
    accepts; None starts an embedded LocalCluster of ``n_workers`` processes per ``fit``.
    """

    def __init__(self, l2: float = 1e-3, *, lr: float = 0.5, schedule: str = "inverse", decay: float = 0.05,
                 momentum: float = 0.0, batch_size: int = 32, steps: int | None = None, mode: str = "local",
                 tol: float = 1e-3, max_iter: int = 100, seed: int = 0, cluster=None, n_workers: int = 2,
                 n_shards: int | None = None, policies=None, progress: bool | None = None):
        self.l2 = l2
        self.lr = lr
        self.schedule = schedule
        self.decay = decay
        self.momentum = momentum
        self.batch_size = batch_size
        self.steps = steps
        self.mode = mode
        self.tol = tol
        self.max_iter = max_iter
        self.seed = seed
        self.cluster = cluster
        self.n_workers = n_workers
        self.n_shards = n_shards
        self.policies = policies
        self.progress = progress

    def _algorithm(self, n_classes: int) -> MLRSGD:
        return MLRSGD(n_classes, l2=self.l2, lr=self.lr, schedule=self.schedule, decay=self.decay,
                      momentum=self.momentum, batch_size=self.batch_size, steps=self.steps, mode=self.mode,
                      seed=self.seed, tol=self.tol)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def fit(self, X, y) -> "MLR":
        if dask.is_dask_collection(y):  # the labels stay on the cluster: only their distinct values come here
            import dask.array as da

            X = check_features(self, X, reset=True)
            y = y.to_dask_array(lengths=True) if hasattr(y, "to_dask_array") else y
            self.classes_ = _classes(self._compute_small(da.unique(y)))
            classes = self.classes_
            codes = y.map_blocks(lambda b: np.searchsorted(classes, np.asarray(b).reshape(-1)).astype(np.int64),
                                 dtype=np.int64, chunks=(y.chunks[0],), drop_axis=list(range(1, y.ndim)))
        else:
            X, y = check_features(self, X, y, reset=True, accept_sparse="csr", dtype=(np.float64, np.float32))
            self.classes_ = _classes(np.unique(y))
            codes = np.searchsorted(self.classes_, y)
        algo = self._algorithm(len(self.classes_))  # hyperparameters checked before any work
        opts = self._engine_options()
        res = dscar.fit(algo, {"X": X, "y": codes.astype(np.int64)}, self.cluster, n_workers=opts["n_workers"],
                        n_shards=opts["n_shards"], max_clocks=opts["max_iter"], progress=opts["progress"],
                        policies=self.policies)
        self._warn_unconverged(res)
        self.coef_ = np.ascontiguousarray(res.params["W"][:-1].T)
        self.intercept_ = res.params["W"][-1].copy()
        self.n_iter_ = res.n_clocks
        self.converged_ = res.converged
        self.objective_ = res.objective
        self.result_ = res
        return self

    def _scores(self, X) -> np.ndarray:
        self._check_fitted("coef_")
        X = check_features(self, X, reset=False, accept_sparse="csr")
        return np.asarray(X @ self.coef_.T) + self.intercept_

    def decision_function(self, X) -> np.ndarray:
        """Class scores (samples x classes); with two classes, as scikit-learn, one column: the
        second class's score less the first's (positive: the second class is predicted)."""
        scores = self._scores(X)
        return scores[:, 1] - scores[:, 0] if scores.shape[1] == 2 else scores

    def predict_proba(self, X) -> np.ndarray:
        return softmax(np, self._scores(X))

    def predict(self, X) -> np.ndarray:
        scores = self._scores(X)
        return self.classes_[np.argmax(scores, axis=1)]


def _classes(values) -> np.ndarray:
    """The sorted distinct labels of a classifier, or ``InvalidInputError`` (one class; a
    continuous target, as scikit-learn refuses it)."""
    from sklearn.utils.multiclass import check_classification_targets

    classes = np.unique(np.asarray(values))
    try:
        check_classification_targets(classes)
    except ValueError as e:
        raise InvalidInputError(f"labels y must be classes (integers, strings, ...): {e}") from None
    if classes.size < 2:
        raise InvalidInputError(f"labels y hold a single class ({classes[0]!r}); a classifier needs at least two")
    return classes


LogisticRegression = MLR


# each estimator's home is its model's module (see the module docstring)
for _cls, _home in ((Lasso, lasso), (LDA, lda), (MF, mf), (MLR, mlr)):
    _cls.__module__ = _home.__name__
del _cls, _home
