"""Synthetic data generators used by the CLI, the benchmarks and the tests."""
from __future__ import annotations

import numpy as np


def make_regression(n_samples: int = 10_000, n_features: int = 200, n_informative: int = 20,
                    noise: float = 1.0, rho: float = 0.0, seed: int = 0,
                    dtype=np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``X, y, w_true``: Gaussian features (AR(1) correlation ``rho``), sparse ``w_true``.

    ``w_true`` has ``n_informative`` non-zeros of random sign and magnitude U(0.5, 1.5);
    ``y = X w_true + noise * N(0, 1)``.
    """
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_samples, n_features)).astype(dtype, copy=False)
    if rho:
        # AR(1) across features: x_j = rho x_{j-1} + sqrt(1 - rho^2) e_j
        s = np.sqrt(1.0 - rho * rho)
        for j in range(1, n_features):
            X[:, j] *= s
            X[:, j] += rho * X[:, j - 1]
    w = np.zeros(n_features, dtype=dtype)
    support = rng.choice(n_features, size=min(n_informative, n_features), replace=False)
    w[support] = rng.choice([-1.0, 1.0], size=support.size) * rng.uniform(0.5, 1.5, size=support.size)
    y = X @ w + noise * rng.standard_normal(n_samples)
    return X, y.astype(dtype, copy=False), w


def make_spectra(n_samples: int = 300, n_features: int = 200, n_components: int = 6, n_informative: int = 8,
                 noise: float = 0.1, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``X, y, w_true``: a near-collinear regression shaped like spectroscopy data (standardised columns).

    Each row is a mixture of ``n_components`` smooth Gaussian bands over ``n_features`` channels
    (random positive concentrations) plus ``1e-3`` measurement noise: neighbouring columns are
    correlated above 0.99 and ``X^T X`` has ``n_components`` large eigenvalues and a tail near the
    noise floor, the regime where cyclic coordinate descent crawls. ``y = X w_true + noise *
    N(0, 1)`` with ``n_informative`` non-zeros.
    """
    if min(n_samples, n_features, n_components, n_informative) < 1:
        raise ValueError("make_spectra needs positive sizes")
    rng = np.random.default_rng(seed)
    grid = np.linspace(0.0, 1.0, n_features)
    centres, widths = rng.uniform(0.1, 0.9, n_components), rng.uniform(0.05, 0.2, n_components)
    bands = np.exp(-0.5 * ((grid[None, :] - centres[:, None]) / widths[:, None]) ** 2)
    X = rng.gamma(2.0, 1.0, (n_samples, n_components)) @ bands
    X += 1e-3 * rng.standard_normal(X.shape)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    w = np.zeros(n_features)
    support = rng.choice(n_features, size=min(n_informative, n_features), replace=False)
    w[support] = rng.choice([-1.0, 1.0], size=support.size) * rng.uniform(0.5, 1.5, size=support.size)
    y = X @ w + noise * rng.standard_normal(n_samples)
    return X, y, w


def lasso_alpha_max(X, y, fit_intercept: bool = True) -> float:
    """The smallest alpha whose Lasso solution is all zeros."""
    yc = y - y.mean() if fit_intercept else y
    corr = X.T @ yc
    if fit_intercept:
        corr = corr - np.asarray(X.sum(axis=0)).ravel() * yc.mean()
    return float(np.max(np.abs(corr)) / X.shape[0])


def make_classification(n_samples: int = 10_000, n_features: int = 100, n_classes: int = 10, seed: int = 0,
                        *, class_sep: float = 3.0, dtype=np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``X, y, W_true``: a multinomial logistic model with Gaussian features.

    ``X ~ N(0, I)``, ``W_true`` (features x classes) has i.i.d. ``N(0, class_sep^2 / n_features)``
    entries (so each logit has standard deviation about ``class_sep``), and ``y`` (int64, in
    ``0..n_classes-1``) is drawn from ``softmax(X W_true)`` (Gumbel-max trick): the model the
    logistic regression fits is the true one, and the Bayes accuracy is below 1.
    """
    if n_samples < 1 or n_features < 1 or n_classes < 2:
        raise ValueError("make_classification needs n_samples >= 1, n_features >= 1 and n_classes >= 2")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_samples, n_features)).astype(dtype, copy=False)
    W = rng.standard_normal((n_features, n_classes)) * (class_sep / np.sqrt(n_features))
    y = np.empty(n_samples, dtype=np.int64)
    for a in range(0, n_samples, 65_536):  # blocks: the logits of 1e7 rows need not fit at once
        b = min(n_samples, a + 65_536)
        y[a:b] = np.argmax(X[a:b] @ W + rng.gumbel(size=(b - a, n_classes)), axis=1)
    return X, y, W.astype(dtype, copy=False)


def make_text_classification(n_docs: int = 2_000, vocab_size: int = 1_000, doc_length: int = 50,
                             n_classes: int = 10, *, beta: float = 0.05, seed: int = 0):
    """``X, y``: bag-of-words documents labelled by their main topic, a sparse classification problem.

    Documents come from the LDA model (``corpora.synthetic``: ``n_classes`` topics, mixtures
    ``Dirichlet(0.1)``, topic-word ``Dirichlet(beta)``); ``y`` is each document's largest topic
    weight and ``X`` its word counts, rows scaled to unit L2 norm (CSR, float64). Word document
    frequencies are heavy-tailed (``beta = 0.05``, the defaults: median ~40 of 2,000 documents,
    top 1 % ~400, some words never used), so SGD moves the weight rows of frequent words far more
    than the rest: the setting of SCAR's MLR experiments (sparse features), unlike dense digits.
    """
    import scipy.sparse as sp

    from .corpora import synthetic

    if n_classes < 2:
        raise ValueError("make_text_classification needs n_classes >= 2")
    c = synthetic(n_docs, vocab_size, doc_length, n_classes, alpha=0.1, beta=beta, seed=seed)
    X = c.X.astype(np.float64).tocsr()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = (sp.diags(1.0 / np.maximum(norms, np.finfo(np.float64).tiny)) @ X).tocsr()
    return X, np.argmax(c.doc_topic, axis=1).astype(np.int64)


def make_ratings(n_users: int = 1_000, n_items: int = 500, n_ratings: int = 10_000, rank: int = 10,
                 noise: float = 0.5, *, mean: float = 3.0, bias_scale: float = 0.3, alpha: float = 0.5,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``users, items, ratings, truth``: explicit ratings of a planted rank-``rank`` model.

    ``r_ui = mean + b_u + c_i + U_u . V_i + noise * N(0, 1)`` with ``U, V`` entries
    ``N(0, rank^-1/2)`` (so ``U_u . V_i`` has unit variance), biases ``N(0, bias_scale^2)``:
    a model with this rank and biases can reach a test RMSE of ``noise``. Activity is a
    power law: user (item) ``j`` of the popularity order is drawn with weight ``(j + 1)^-alpha``;
    ids are shuffled so popularity is not sorted by id. ``n_ratings`` distinct (user, item)
    pairs, in random order. ``truth``: ``U``, ``V``, ``user_bias``, ``item_bias``.
    """
    if min(n_users, n_items, n_ratings, rank) < 1 or n_ratings > n_users * n_items:
        raise ValueError("make_ratings needs positive sizes and n_ratings <= n_users * n_items")
    rng = np.random.default_rng(seed)
    s = rank ** -0.25
    U, V = rng.normal(0.0, s, (n_users, rank)), rng.normal(0.0, s, (n_items, rank))
    bu, bi = rng.normal(0.0, bias_scale, n_users), rng.normal(0.0, bias_scale, n_items)
    pu = (1.0 + np.arange(n_users)) ** -alpha
    pi = (1.0 + np.arange(n_items)) ** -alpha
    pu, pi = rng.permutation(pu / pu.sum()), rng.permutation(pi / pi.sum())
    keys = np.empty(0, dtype=np.int64)
    while keys.size < n_ratings:  # draw pairs until enough distinct ones (the popular head collides)
        m = int(1.2 * (n_ratings - keys.size)) + 16
        new = rng.choice(n_users, m, p=pu).astype(np.int64) * n_items + rng.choice(n_items, m, p=pi)
        keys = np.unique(np.concatenate([keys, new]))
    keys = rng.permutation(keys)[:n_ratings]
    users, items = keys // n_items, keys % n_items
    r = mean + bu[users] + bi[items] + np.einsum("ij,ij->i", U[users], V[items]) + noise * rng.standard_normal(n_ratings)
    return users, items, r, {"U": U, "V": V, "user_bias": bu, "item_bias": bi}
