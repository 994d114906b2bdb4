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


def lasso_alpha_max(X, y, fit_intercept: bool = True) -> float:
    """The smallest alpha whose Lasso solution is all zeros."""
    yc = y - y.mean() if fit_intercept else y
    corr = X.T @ yc
    if fit_intercept:
        corr = corr - np.asarray(X.sum(axis=0)).ravel() * yc.mean()
    return float(np.max(np.abs(corr)) / X.shape[0])
