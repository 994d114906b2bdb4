"""Compiled (numba) CPU kernels of the MLR shard step: the clock-start evaluation and the local SGD loop.

Why (profiled on the benchmark's shards: 25k rows x 100 features, 10 classes, minibatches of 256):
the NumPy step spends most of its time not in the two matrix products per minibatch but around
them: row-wise max / sum reductions over only K = 10 columns (NumPy's slow short-axis reduce),
the softmax's temporaries, the fancy-indexed label update and the weight update's temporaries,
a dozen library calls per minibatch. Here the products stay BLAS calls (``np.dot`` in numba) and
everything between them is one fused loop over the minibatch's ``b x K`` logits, with no
allocation per step. Same arithmetic as the namespace path (``MLRSGD._grad``), to rounding.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, fastmath=False)
def softmax_stats(L, y):  # pragma: no cover - compiled
    """Cross-entropy sum and number of correct argmax predictions of logits ``L`` (``n x K``) for labels ``y``."""
    n, K = L.shape
    ce = 0.0
    correct = 0
    for i in range(n):
        m = L[i, 0]
        arg = 0
        for k in range(1, K):
            if L[i, k] > m:
                m = L[i, k]
                arg = k
        s = 0.0
        for k in range(K):
            s += np.exp(L[i, k] - m)
        ce += np.log(s) - (L[i, y[i]] - m)
        if arg == y[i]:
            correct += 1
    return ce, correct


@njit(cache=True, nogil=True, fastmath=False)
def local_sgd(X, y, batches, W, lr, l2):  # pragma: no cover - compiled
    """Minibatch SGD on ``W`` (``(p + 1) x K``, last row the bias) in place, over the rows of ``batches``
    (``steps x b`` row indices): per step ``W[:-1] -= lr (X_B^T (P - Y) / b + l2 W[:-1])``,
    ``W[-1] -= lr sum(P - Y) / b``."""
    steps, b = batches.shape
    p = X.shape[1]
    K = W.shape[1]
    Xb = np.empty((b, p))
    L = np.empty((b, K))
    shrink = 1.0 - lr * l2
    for t in range(steps):
        for i in range(b):
            Xb[i] = X[batches[t, i]]
        L[:, :] = np.dot(Xb, W[:p])
        for i in range(b):  # logits + bias -> P - Y, in place
            m = -np.inf
            for k in range(K):
                L[i, k] += W[p, k]
                if L[i, k] > m:
                    m = L[i, k]
            s = 0.0
            for k in range(K):
                e = np.exp(L[i, k] - m)
                L[i, k] = e
                s += e
            inv = 1.0 / s
            for k in range(K):
                L[i, k] *= inv
            L[i, y[batches[t, i]]] -= 1.0
        G = np.dot(Xb.T, L)
        step = lr / b
        for j in range(p):
            for k in range(K):
                W[j, k] = shrink * W[j, k] - step * G[j, k]
        for k in range(K):
            g = 0.0
            for i in range(b):
                g += L[i, k]
            W[p, k] -= step * g

