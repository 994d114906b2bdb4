"""scikit-learn estimator conventions without importing scikit-learn."""
from __future__ import annotations

import inspect
import warnings
from typing import Any

from . import validation
from .errors import ConvergenceWarning


class EstimatorMixin:
    """``get_params`` / ``set_params`` from the ``__init__`` signature, like scikit-learn's."""

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values() if p.name != "self" and p.kind != p.VAR_KEYWORD]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> "EstimatorMixin":
        valid = set(self._param_names())
        for k, v in params.items():
            if k not in valid:
                raise ValueError(f"invalid parameter {k!r} for {type(self).__name__}; valid: {sorted(valid)}")
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

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
