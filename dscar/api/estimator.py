"""What every dscar estimator shares: scikit-learn's ``BaseEstimator`` with a cluster that is a
handle, not a value.

``cluster`` is an ordinary hyperparameter (so ``GridSearchCV`` and ``Pipeline`` fit their clones on
the cluster the user gave), but the estimator never copies it: ``clone`` and ``copy.deepcopy`` share
it by reference, and ``pickle`` keeps only its scheduler address (an in-process or closed cluster
cannot travel to another process; the address reconnects where it can). A fitted estimator holds
host NumPy arrays only, so its pickle predicts without any cluster.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from .. import validation
from ..errors import ConvergenceWarning, InvalidInputError
from .results import json_value, read_saved, write_saved


def cluster_address(cluster: Any) -> Any:
    """What a pickled estimator keeps of ``cluster``: None and addresses as they are; a ``dscar.Cluster``,
    ``distributed.Client`` or ``LocalCluster`` as its scheduler's address (None if it shows none)."""
    if cluster is None or isinstance(cluster, str):
        return cluster
    for get in (lambda c: c.client.scheduler.address,  # dscar.Cluster
                lambda c: c.scheduler.address,  # Client
                lambda c: c.scheduler_address):  # LocalCluster and the other deployment clusters
        try:
            address = get(cluster)
        except Exception:
            continue
        if isinstance(address, str):
            return address
    return None


class EstimatorMixin(BaseEstimator):
    """scikit-learn's ``BaseEstimator`` (``get_params``, ``set_params``, tags, repr) plus dscar's
    engine options and the cluster handled as a handle (see the module docstring)."""

    def __sklearn_clone__(self) -> "EstimatorMixin":
        """``sklearn.clone``: every hyperparameter cloned as scikit-learn does, the cluster shared."""
        params = self.get_params(deep=False)
        cluster = params.pop("cluster", None)
        new = type(self)(**{k: clone(v, safe=False) for k, v in params.items()}, cluster=cluster)
        if hasattr(self, "_sklearn_output_config"):  # set_output() of a transformer
            new._sklearn_output_config = copy.deepcopy(self._sklearn_output_config)
        return new

    def __deepcopy__(self, memo: dict) -> "EstimatorMixin":
        """A deep copy of everything but the cluster, which the copy shares."""
        memo[id(self.cluster)] = self.cluster  # a cluster is shared, never copied
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            setattr(new, k, copy.deepcopy(v, memo))
        return new

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with the cluster's scheduler address in its place (see ``cluster_address``)."""
        state = dict(super().__getstate__())
        state["cluster"] = cluster_address(state.get("cluster"))
        return state

    def save(self, path: str, *, storage_options: dict | None = None) -> None:
        """Write the fitted model to ``path`` (a directory: local or an fsspec URL) as arrays and
        JSON, no pickle: ``model.json`` (class, hyperparameters, fitted scalars) and
        ``arrays.npz`` (fitted arrays). ``type(self).load(path)`` reads it back, in any process,
        without a cluster. The cluster and the training record (``result_``) are not saved."""
        check_is_fitted(self)
        save_model(self, path, storage_options=storage_options)

    @classmethod
    def load(cls, path: str, *, storage_options: dict | None = None) -> "EstimatorMixin":
        """The fitted model ``save`` wrote to ``path`` (``InvalidInputError`` if none is there, or
        one of another class)."""
        return load_model(cls, path, storage_options=storage_options)

    def _check_fitted(self, attribute: str) -> None:
        """``NotFittedError`` (scikit-learn's) before ``fit``."""
        check_is_fitted(self, attribute)

    def _engine_options(self) -> dict[str, Any]:
        """The estimator's engine options, checked like ``dscar.fit`` checks its own, but named
        as the estimator names them (``max_iter``, not ``max_clocks``)."""
        out = {}
        if hasattr(self, "max_iter"):
            out["max_iter"] = validation.integer("max_iter", self.max_iter, 1)
        out["n_workers"] = validation.integer("n_workers", getattr(self, "n_workers", 2), 1)
        out["n_shards"] = validation.integer("n_shards", getattr(self, "n_shards", None), 1, optional=True)
        out["progress"] = validation.boolean("progress", getattr(self, "progress", None), optional=True)
        return out

    def _compute_small(self, collection: Any) -> Any:
        """A small result of a Dask collection (e.g. the distinct labels), computed by the
        estimator's cluster when it has one (else by Dask's default scheduler)."""
        from .cluster import Cluster

        client = getattr(self, "cluster", None)
        client = client.client if isinstance(client, Cluster) else client
        if hasattr(client, "compute") and hasattr(client, "scheduler"):
            return client.compute(collection).result()
        return collection.compute()

    def _warn_unconverged(self, result: Any, limit: str = "max_iter") -> None:
        """``ConvergenceWarning`` when the fit stopped at its iteration limit, as scikit-learn warns."""
        if not result.converged:
            warnings.warn(
                f"{type(self).__name__} stopped after {result.n_clocks} iterations ({limit}={getattr(self, limit)}) "
                f"before converging (objective {result.objective:.6g}); raise {limit} or tol",
                ConvergenceWarning, stacklevel=3)


def check_features(estimator: BaseEstimator, X: Any, y: Any = "no_validation", *, reset: bool, **kw: Any) -> Any:
    """``X`` (or ``(X, y)`` when ``y`` is given) checked as scikit-learn checks them, and ``n_features_in_`` / ``feature_names_in_``
    set (``reset=True``, in ``fit``) or compared (in ``predict``).

    In-memory inputs (NumPy, pandas, SciPy sparse, lists) go through ``validate_data``; Dask
    collections stay on the cluster (only their column count and names are read here: the engine
    checks their values where they live)."""
    from sklearn.utils.validation import _check_n_features, validate_data

    from .data import is_dask

    try:
        if is_dask(X) or is_dask(y):
            _check_n_features(estimator, X, reset=reset)
            _dask_feature_names(estimator, X, reset=reset)
            return X if isinstance(y, str) and y == "no_validation" else (X, y)
        return validate_data(estimator, X, y, reset=reset, **kw)
    except ValueError as e:  # scikit-learn's message, as dscar's error (still a ValueError)
        if isinstance(e, InvalidInputError):
            raise
        raise InvalidInputError(str(e)) from None



def _dask_feature_names(estimator: BaseEstimator, X: Any, *, reset: bool) -> None:
    """``feature_names_in_`` of a Dask DataFrame (string column names), as scikit-learn sets it for
    pandas; a frame with other names than the fitted ones is refused."""
    cols = list(getattr(X, "columns", []))
    names = np.asarray(cols, dtype=object) if cols and all(isinstance(c, str) for c in cols) else None
    if reset:
        if names is not None:
            estimator.feature_names_in_ = names
        elif hasattr(estimator, "feature_names_in_"):
            del estimator.feature_names_in_
    elif names is not None and hasattr(estimator, "feature_names_in_") and list(names) != list(estimator.feature_names_in_):
        raise InvalidInputError(f"X has columns {list(names)}, but {type(estimator).__name__} was fitted with "
                                f"{list(estimator.feature_names_in_)}")


#: what ``EstimatorMixin.save`` writes, and its version
MODEL_FORMAT, MODEL_VERSION = "dscar-model", 1
#: fitted attributes never saved: the training record (events, timings; ``FitResult`` has its own form)
NOT_SAVED = ("result_",)


def save_model(est: BaseEstimator, path: str, *, storage_options: dict | None = None) -> None:
    """``est``'s hyperparameters (those JSON holds; the cluster never) and fitted attributes under
    ``path``: arrays in ``arrays.npz`` (no object arrays: strings become unicode arrays), the rest
    in ``model.json``, written last so a reader never sees half a model."""
    params, dropped, kinds = {}, [], {}
    for k, v in est.get_params(deep=False).items():
        if k == "cluster":
            continue
        try:
            params[k] = json_value(k, v)
        except InvalidInputError:
            dropped.append(k)  # e.g. policy or fault objects: training options, not the model
            continue
        if isinstance(v, tuple):
            kinds[f"params.{k}"] = "tuple"
    arrays, values = {}, {}
    for k, v in vars(est).items():
        if not k.endswith("_") or k.startswith("_") or k in NOT_SAVED:
            continue
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                if not all(isinstance(x, str) for x in v.ravel()):
                    raise InvalidInputError(f"{k} holds Python objects other than strings; it cannot be saved")
                v, kinds[k] = v.astype(str), "object-array"
            arrays[k] = v
        else:
            if isinstance(v, tuple):
                kinds[k] = "tuple"
            values[k] = json_value(k, v)
    doc = {"format": MODEL_FORMAT, "version": MODEL_VERSION,
           "class": f"{type(est).__module__}.{type(est).__qualname__}",
           "params": params, "params_not_saved": dropped, "fitted": values, "kinds": kinds,
           "arrays": sorted(arrays)}
    write_saved(path, doc, arrays, storage_options)


def load_model(cls: type, path: str, *, storage_options: dict | None = None) -> Any:
    """The estimator ``save_model`` wrote under ``path``, of class ``cls`` (arrays read with
    ``allow_pickle=False``)."""
    doc, arrays = read_saved(path, MODEL_FORMAT, MODEL_VERSION, storage_options)
    want = f"{cls.__module__}.{cls.__qualname__}"
    if doc["class"] != want:
        raise InvalidInputError(f"{path!r} holds a {doc['class']}, not a {want}: load it with that class")
    kinds = doc.get("kinds", {})
    est = cls(**{k: tuple(v) if kinds.get(f"params.{k}") == "tuple" else v for k, v in doc["params"].items()})
    for k in doc["arrays"]:
        a = arrays[k]
        setattr(est, k, a.astype(object) if kinds.get(k) == "object-array" else a)
    for k, v in doc["fitted"].items():
        setattr(est, k, tuple(v) if kinds.get(k) == "tuple" else v)
    return est
