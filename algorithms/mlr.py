"""Multinomial logistic regression by minibatch SGD (local SGD with model averaging).

Objective (``n`` rows, ``K`` classes, weights ``W`` (features x classes), bias ``b``)::

    P(W, b) = 1/n sum_i CE(softmax(x_i W + b), y_i) + l2/2 ||W||_F^2

(the bias is not penalised). scikit-learn's ``LogisticRegression`` (multinomial,
``penalty="l2"``) minimises ``C sum_i CE + 1/2 ||W||^2``, the same problem for
``C = 1 / (n * l2)``.

One clock (``mode="local"``, the default): every shard starts from the
clock-start model ``W0`` (table ``W``: features + 1 rows, the last one the
bias), runs ``steps`` minibatch SGD steps on its own rows and adds its share of
the *average model delta*, ``(W - W0) / n_shards``, to ``W``: after the clock the
model is the average of the shards' local models (local SGD / model averaging).
With ``momentum`` ``beta > 0`` the averaged change ``D`` also drives a heavy-ball
velocity (table ``V``, laid out like ``W``): ``V <- beta V + D`` and
``W <- W + beta V_old + D``; each shard adds its ``1/n_shards`` share of both, so
no clock-end step is needed and the model never goes through one worker. In the
same data pass each shard evaluates the clock-start model on all its rows
(cross-entropy sum, number of correct predictions: a reduction), so the
objective and training accuracy reported for clock ``t`` are exact, over all
rows, for the model at the *start* of clock ``t`` (after clock ``t - 1``).

``mode="gradient"`` is the textbook alternative: each shard adds the gradient
sum of the same minibatches at ``W0`` to a reduction and ``clock_end`` takes one
(heavy-ball) step. For the same data pass and communication it makes one step
per clock where local SGD makes ``steps``. Measured on digits (l2 = 1e-3, 8
shards, clocks until the objective is within 10 % / 1 % of the optimum): local
SGD (24 steps of 32 rows, lr 1, decay 0.05) 12 / 62 clocks with momentum 0.5,
18 / 43 with 0.7, 24 / >150 without; one gradient step per clock, best of lr
1, 2, 3 x momentum 0, 0.9: 63 / >150 clocks (lr 3, momentum 0.9). Hence local
SGD is the default.

Minibatches: per clock, shard ``s`` draws a permutation of its rows from
``numpy.random.default_rng((seed, s, clock))`` and walks it in minibatches of
``round(batch_size * ctx.batch_scale)`` rows (at least 1): under the adaptive
batch policy a slow worker's shards take smaller minibatches (same number of
steps) so the global batch stays fixed. ``steps`` defaults to one pass over the
shard at the base batch size (``ceil(shard_rows / batch_size)``). Everything a
shard does depends only on ``(seed, shard, clock)`` and the clock-start model,
not on which worker runs it: failure-free runs are deterministic (with the
adaptive policy off).

Learning rate at clock ``t``: ``lr`` (``schedule="constant"``) or
``lr / (1 + decay * (t - 1))`` (``schedule="inverse"``, the default).

Metrics per clock: ``objective``, ``cross_entropy``, ``accuracy`` (training, at the
clock-start model), ``lr``, ``samples`` (rows used by this clock's SGD steps, all
shards), ``batch_min`` / ``batch_max`` (smallest / largest per-shard minibatch).
"""
from __future__ import annotations

import math

import numpy as np


import dscar
from dscar import Algorithm, DataMeta, InvalidInputError, TableSpec, check_indices

SCHEDULES = ("constant", "inverse")
MODES = ("local", "gradient")
KERNELS = ("auto", "compiled", "namespace")
STATS = ("ce_sum", "correct", "samples", "w_sq")  # rows of the per-clock ``stats`` reduction


def _positive(name: str, v, *, allow_zero: bool = False) -> float:
    return dscar.validation.positive(name, v, allow_zero=allow_zero)


def _count(name: str, v, *, optional: bool = False) -> int | None:
    return dscar.validation.integer(name, v, 1, optional=optional)


def check_labels(y, n_classes: int | None = None) -> np.ndarray:
    """``y`` as int64 class indices, or ``InvalidInputError``.

    Labels must be integers (an integer array, or floats with integral values)
    and >= 0, with at least two distinct values; with ``n_classes``, below it.
    """
    try:
        a = np.asarray(y)
    except Exception as e:
        raise InvalidInputError(f"labels y are not an array: {e}") from None
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.ndim != 1 or a.shape[0] == 0:
        raise InvalidInputError(f"labels y must be a non-empty 1-D array, got shape {a.shape}")
    a = check_indices("labels y (class indices)", a, n_classes, "n_classes")
    if np.unique(a).size < 2:
        raise InvalidInputError(f"labels y hold a single class ({int(a[0])}); a classifier needs at least two")
    return a


def _shifted_exp(xp, logits):
    """``(z, e, s)``: logits less their row maximum, ``exp(z)`` and its row sums (the stable softmax's parts)."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = xp.exp(z)
    return z, e, e.sum(axis=1, keepdims=True)


def softmax(xp, logits):
    """Row-wise softmax probabilities (stable)."""
    _, e, s = _shifted_exp(xp, logits)
    return e / s


def cross_entropy(xp, logits, y):
    """Cross-entropy of each row's label ``y`` under the softmax of its logits (stable)."""
    z, _, s = _shifted_exp(xp, logits)
    return xp.log(s[:, 0]) - z[xp.arange(z.shape[0]), y]


class MLRSGD(Algorithm):
    """Multinomial logistic regression as a dscar algorithm (tables ``W`` (bias: last row), ``stats``, ``V``, ``grad``).

    ``kernel``: ``"auto"`` runs the compiled CPU kernels (``mlr_kernels``: the evaluation and the
    local SGD loop) on dense NumPy shards and the array-namespace code (the reference; CuPy, sparse
    X, ``mode="gradient"``) otherwise; ``"namespace"`` forces the reference.
    """

    name = "mlr"
    data_names = ("X", "y")

    @property
    def max_staleness(self) -> int:
        """2 without momentum, 0 with: stale updates bring a momentum of their own (asynchrony begets
        momentum, Mitliagkas et al. 2016), and with the heavy ball's on top SGD oscillates
        (``bench.staleness`` on digits: momentum 0.7 never reaches the target at 1 clock stale;
        momentum 0 reaches it at 1 and 2 clocks stale, 4 takes 4x the clocks)."""
        return 0 if self.momentum else 2

    def __init__(self, n_classes: int, *, l2: float = 1e-3, lr: float = 0.5, schedule: str = "inverse",
                 decay: float = 0.05, momentum: float = 0.0, batch_size: int = 32, steps: int | None = None,
                 mode: str = "local", seed: int = 0, tol: float = 1e-3, patience: int = 3,
                 target: float | None = None, kernel: str = "auto"):
        if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
            raise InvalidInputError(f"n_classes must be an integer >= 2 (a single class cannot be learned), "
                                    f"got {n_classes!r}")
        if schedule not in SCHEDULES:
            raise InvalidInputError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if mode not in MODES:
            raise InvalidInputError(f"mode must be one of {MODES}, got {mode!r}")
        self.n_classes = int(n_classes)
        self.l2 = _positive("l2", l2, allow_zero=True)
        self.lr = _positive("learning rate lr", lr)
        self.schedule = schedule
        self.decay = _positive("decay", decay, allow_zero=True)
        self.momentum = _positive("momentum", momentum, allow_zero=True)
        if self.momentum >= 1:
            raise InvalidInputError(f"momentum must be in [0, 1), got {momentum}")
        self.batch_size = _count("batch_size", batch_size)
        self.steps = _count("steps", steps, optional=True)
        self.mode = mode
        if kernel not in KERNELS:
            raise InvalidInputError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.kernel = kernel
        self.seed = int(seed)
        self.tol = _positive("tol", tol)
        self.patience = _count("patience", patience)
        self.target = None if target is None else float(target)

    # ----------------------------------------------------------- setup
    def validate(self, meta: DataMeta) -> None:
        missing = [k for k in self.data_names if k not in meta.shapes]
        if missing:
            raise InvalidInputError(f"MLR needs arrays {list(self.data_names)}; missing {missing}")
        if len(meta.shapes["X"]) != 1 or meta.shapes["X"][0] < 1:
            raise InvalidInputError(f"X must be 2-D (rows x features); its rows have shape {meta.shapes['X']}")
        if meta.shapes["y"] not in ((), (1,)):
            raise InvalidInputError(f"y must be 1-D with one label per row of X; its rows have shape {meta.shapes['y']}")
        if np.dtype(meta.dtypes["y"]).kind not in "iu":
            raise InvalidInputError(f"labels y must be integer class indices, got dtype {meta.dtypes['y']} "
                                    "(dscar.algorithms.mlr.check_labels converts and checks them)")
        self._features = int(meta.shapes["X"][0])  # for warm_up on a CuPy worker: the device kernel's shapes

    def tables(self, meta: DataMeta) -> list[TableSpec]:
        p, K = meta.shapes["X"][0], self.n_classes
        out = [
            TableSpec("W", p + 1, trailing=(K,)),  # rows 0..p-1: weights; row p: the bias
            # [ce_sum, correct, samples, ||W||^2, minibatch size of shard 0, 1, ...]
            TableSpec("stats", len(STATS) + meta.n_shards, kind="reduction", n_parts=1),
        ]
        if self.momentum:  # heavy-ball velocity: the last clock's model change, same layout as W
            out.append(TableSpec("V", p + 1, trailing=(K,)))
        if self.mode == "gradient":
            out.append(TableSpec("grad", p + 1, trailing=(K,), kind="reduction"))
        return out

    def prepare_shard(self, arrays, xp):
        import scipy.sparse as sp

        X = arrays["X"]
        X = X.astype(np.float64).tocsr() if sp.issparse(X) else np.ascontiguousarray(X, dtype=np.float64)
        y = np.asarray(arrays["y"]).reshape(-1)
        if y.size and (y.min() < 0 or y.max() >= self.n_classes):  # backstop: check_labels runs before fit
            raise InvalidInputError(f"labels must be in 0..{self.n_classes - 1}, got {int(y.min())}..{int(y.max())}")
        return super().prepare_shard({"X": X, "y": y.astype(np.int64)}, xp)

    def warm_up(self, xp) -> None:
        """Load the compiled kernels (~0.4 s on a worker's first step otherwise)."""
        if xp is not np:  # CuPy: compile the step's kernels (softmax, gathers, GEMMs) on a tiny problem
            from . import gpu_kernels, gpu_warm

            p = getattr(self, "_features", None)  # the fit's feature count (validate): the device kernel's shapes
            if self._device_sgd(xp, p):
                gpu_kernels.warm_up_mlr(xp, p, self.n_classes)
            rng = np.random.default_rng(0)
            X, y = rng.normal(size=(8, 3)), np.arange(8) % self.n_classes
            gpu_warm.rehearse(self, {"X": X, "y": y}, xp, clocks=2)  # validates its own 3 features
            self._features = p
            return
        if self.kernel == "namespace":
            return
        from .mlr_kernels import local_sgd, softmax_stats

        X, y = np.ones((2, 3)), np.zeros(2, dtype=np.int64)
        softmax_stats(np.zeros((2, self.n_classes)), y)
        local_sgd(X, y, np.zeros((1, 2), dtype=np.int64), np.zeros((4, self.n_classes)), 0.1, 0.0)

    # ------------------------------------------------------- shard step
    def lr_at(self, clock: int) -> float:
        return self.lr if self.schedule == "constant" else self.lr / (1.0 + self.decay * (clock - 1))

    def n_steps(self, n_rows: int) -> int:
        return self.steps if self.steps is not None else max(1, -(-n_rows // self.batch_size))

    def minibatches(self, shard: int, clock: int, n_rows: int, batch_scale: float = 1.0) -> np.ndarray:
        """Row indices, ``steps x batch``: walks permutations of the shard's rows from ``(seed, shard, clock)``."""
        steps = self.n_steps(n_rows)
        b = max(1, int(round(self.batch_size * float(batch_scale))))
        rng = np.random.default_rng((self.seed, shard, clock))
        need = steps * b
        order = np.concatenate([rng.permutation(n_rows) for _ in range(-(-need // n_rows))])
        return order[:need].reshape(steps, b)

    def _compiled(self, xp, X) -> bool:
        return self.kernel != "namespace" and xp is np and isinstance(X, np.ndarray)

    def _device_sgd(self, xp, p: int | None) -> bool:
        """CuPy workers run local SGD as one device launch (``gpu_kernels.mlr_local_sgd``) where the rows fit
        its shared memory, unless ``kernel="namespace"``."""
        if xp is np or self.kernel == "namespace" or self.mode != "local" or p is None:
            return False
        from . import gpu_kernels

        return gpu_kernels.enabled(xp) and gpu_kernels.mlr_fits(p, self.n_classes)

    def shard_step(self, ctx, data) -> None:
        xp, X, y = ctx.xp, data["X"], data["y"]
        W0 = ctx.pull("W")
        compiled = self._compiled(xp, X)
        # the clock-start model on every row of the shard: the objective's data term and accuracy
        logits = X @ W0[:-1] + W0[-1]
        if compiled:
            from .mlr_kernels import softmax_stats

            ce_sum, correct = softmax_stats(logits, y)
        else:
            ce = cross_entropy(xp, logits, y)
            ce_sum, correct = float(ce.sum()), (xp.argmax(logits, axis=1) == y).sum()
        batches = self.minibatches(ctx.shard, ctx.clock, y.shape[0], ctx.batch_scale)
        lr, l2 = self.lr_at(ctx.clock), self.l2
        if self.mode == "local":
            W = W0.copy()
            if compiled:
                from .mlr_kernels import local_sgd

                local_sgd(X, y, batches, W, lr, l2)
            elif isinstance(X, xp.ndarray) and self._device_sgd(xp, X.shape[1]):  # dense (not cupyx sparse)
                from . import gpu_kernels

                gpu_kernels.mlr_local_sgd(X, y, xp.asarray(batches), W, lr, l2, xp)
            else:
                for idx in xp.asarray(batches):  # the minibatches' rows go to the device in one copy, not one a step
                    gW, gb = self._grad(xp, X, y, idx, W[:-1], W[-1])
                    W[:-1] -= lr * (gW / idx.size + l2 * W[:-1])
                    W[-1] -= lr * (gb / idx.size)
            k, beta = ctx.meta.n_shards, self.momentum
            dW = (W - W0) / k  # this shard's share of the mean delta D
            if beta:  # summed over the k shards: V <- beta V + D, W <- W + beta V + D
                V0 = ctx.pull("V")
                ctx.add("V", dW + ((beta - 1.0) / k) * V0)
                dW = dW + (beta / k) * V0
            ctx.add("W", dW)
        else:  # gradient sum of the same minibatches at the clock-start model
            g = xp.zeros_like(W0)
            for idx in batches:
                gW, gb = self._grad(xp, X, y, xp.asarray(idx), W0[:-1], W0[-1])
                g[:-1] += gW
                g[-1] += gb
            ctx.add("grad", g)
        w_sq = float((W0[:-1] * W0[:-1]).sum()) if ctx.shard == 0 else 0.0  # added once per clock
        ctx.add("stats", xp.asarray([float(ce_sum), float(correct), float(batches.size), w_sq]))
        ctx.add("stats", xp.asarray([float(batches.shape[1])]), start=len(STATS) + ctx.shard)

    @staticmethod
    def _grad(xp, X, y, idx, W, b):
        """Gradient *sums* of the cross-entropy over rows ``idx``: ``(X_B^T (P - Y), sum (P - Y))``."""
        Xb, yb = X[idx], y[idx]
        P = softmax(xp, Xb @ W + b)
        P[xp.arange(P.shape[0]), yb] -= 1.0
        return Xb.T @ P, P.sum(axis=0)

    # -------------------------------------------------------- clock end
    def clock_end(self, ctx) -> dict[str, float]:
        n = ctx.meta.n_rows
        s = dscar.to_host(ctx.pull("stats"))
        batch = s[len(STATS):]
        ce = s[0] / n
        lr = self.lr_at(ctx.clock)
        if self.mode == "gradient":
            g = dscar.to_host(ctx.pull("grad")) / max(s[2], 1.0)
            W = dscar.to_host(ctx.pull("W"))
            g[:-1] += self.l2 * W[:-1]
            dW = -lr * g
            if self.momentum:
                dW += self.momentum * dscar.to_host(ctx.pull("V"))
                ctx.assign("V", dW)
            ctx.assign("W", W + dW)
        obj = float(ce + 0.5 * self.l2 * s[3])
        if not math.isfinite(obj):
            raise FloatingPointError(f"MLR diverged: the objective at clock {ctx.clock} is {obj}; "
                                     f"lower the learning rate (lr={self.lr}) or standardise the features")
        return {"objective": obj, "cross_entropy": float(ce),
                "accuracy": float(s[1] / n), "lr": lr, "samples": float(s[2]),
                "batch_min": float(batch.min()), "batch_max": float(batch.max())}

    def converged(self, history, tol) -> bool:
        """``target`` given: the objective reached it. Otherwise the objective's relative change
        stayed below ``tol`` for ``patience`` clocks in a row (SGD is noisy: one small change is
        not enough). Clocks skipped after a worker loss (objective NaN) are left out."""
        objs = [h["objective"] for h in history if math.isfinite(h.get("objective", math.nan))]
        if self.target is not None:
            return bool(objs) and objs[-1] <= self.target
        if len(objs) <= self.patience:
            return False
        last = objs[-self.patience - 1:]
        return all(abs(a - c) <= tol * max(abs(a), abs(c), np.finfo(float).tiny) for a, c in zip(last, last[1:]))


def predict_proba(X, W, b) -> np.ndarray:
    return softmax(np, np.asarray(X @ W) + b)


def objective(X, y, W, b, l2: float) -> float:
    """``P(W, b)`` on the driver (mean cross-entropy + l2/2 ||W||^2)."""
    ce = cross_entropy(np, np.asarray(X @ W) + b, np.asarray(y))
    return float(ce.mean() + 0.5 * l2 * (W * W).sum())


def load_digits_split(test_size: float = 0.25, seed: int = 0, standardise: bool = True):
    """scikit-learn's digits, standardised with the training split's statistics (constant pixels
    get scale 1), or with ``standardise=False`` as intensities in [0, 1] (pixels / 16):
    ``X_train, X_test, y_train, y_test`` (a fixed stratified split)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=test_size, random_state=seed, stratify=y)
    if standardise:
        mu, sd = Xtr.mean(axis=0), Xtr.std(axis=0)
        sd[sd == 0] = 1.0
    else:
        mu, sd = 0.0, 16.0
    return (Xtr - mu) / sd, (Xte - mu) / sd, ytr.astype(np.int64), yte.astype(np.int64)


class MLRCommand:
    """``dscar run mlr``: scikit-learn's digits (standardised) or a generated multinomial problem."""

    help = "multinomial logistic regression by minibatch SGD (local SGD; digits unless --rows is given)"

    def add_arguments(self, g) -> None:
        from dscar.validation import arg_float, arg_int

        g.add_argument("--rows", type=arg_int(0), default=0,
                       help="rows of a generated problem (dscar.algorithms.datasets.make_classification); "
                            "0: scikit-learn's digits, standardised (default)")
        g.add_argument("--features", type=arg_int(1), default=100, help="features of the generated problem (default 100)")
        g.add_argument("--classes", type=arg_int(2), default=10, help="classes of the generated problem (default 10)")
        g.add_argument("--lr", type=arg_float(0, strict_min=True), default=0.5, help="learning rate (default 0.5)")
        g.add_argument("--schedule", choices=SCHEDULES, default="inverse",
                       help="constant, or inverse: lr / (1 + decay (clock - 1)) (default)")
        g.add_argument("--decay", type=arg_float(0), default=0.05, help="decay of the inverse schedule (default 0.05)")
        g.add_argument("--momentum", type=arg_float(0, 0.999), default=0.0,
                       help="heavy-ball momentum on the averaged model change, in [0, 1) (default 0)")
        g.add_argument("--l2", type=arg_float(0), default=1e-3, help="L2 penalty l2/2 ||W||^2 (default 1e-3)")
        g.add_argument("--batch", type=arg_int(1), default=32, help="base minibatch size per shard step (default 32)")
        g.add_argument("--steps", type=arg_int(1), default=None,
                       help="SGD steps per shard per clock (default: one pass over the shard)")
        g.add_argument("--mode", choices=MODES, default="local",
                       help="local: local SGD + model averaging (default); gradient: one step per clock")

    def build(self, args):
        if args.rows:
            from .datasets import make_classification

            X, y, _ = make_classification(args.rows, args.features, args.classes, seed=args.seed)
            desc = f"synthetic {args.rows} x {args.features}, {args.classes} classes, seed {args.seed}"
        else:
            try:
                from sklearn.datasets import load_digits
            except ImportError:
                raise InvalidInputError("the digits data needs scikit-learn (pip install scikit-learn); "
                                        "or give --rows for a generated problem") from None
            X, y = load_digits(return_X_y=True)
            sd = X.std(axis=0)
            sd[sd == 0] = 1.0
            X = (X - X.mean(axis=0)) / sd
            desc = "scikit-learn digits 1797 x 64 (standardised), 10 classes"
        y = check_labels(y)
        algo = MLRSGD(int(y.max()) + 1, l2=args.l2, lr=args.lr, schedule=args.schedule, decay=args.decay,
                      momentum=args.momentum, batch_size=args.batch, steps=args.steps, mode=args.mode, seed=args.seed,
                      tol=1e-3 if args.tol is None else args.tol)
        return algo, {"X": X, "y": y}, (f"{desc}, l2={args.l2:g}, lr={args.lr:g} ({args.schedule}), "
                                        f"batch={args.batch}, mode={args.mode}")


CLI = MLRCommand()


def __getattr__(name: str):
    """``MLR`` (and its alias ``LogisticRegression``), the scikit-learn estimator, loads on first use:
    algorithms/estimators.py says why."""
    if name in ("MLR", "LogisticRegression"):
        from . import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
