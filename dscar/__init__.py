"""dscar: iterative-convergent ML on Dask that keeps training through slow and lost workers."""
from . import faults, validation
from .core import policies
from .algorithm import Algorithm, ClockContext, DataMeta, ShardContext, StateSpec, TableSpec
from .checkpoint import CheckpointConfig, CorruptCheckpointError
from .api.cluster import Cluster, connect
from .api.data import ArrayData, FileData, PhasedData, check_indices
from .api.driver import ClockRecord, FitResult, cancel, fit, jobs
from .errors import (
    ClusterError,
    DscarError,
    InvalidInputError,
    JobFailedError,
    RefusedCallError,
    ShardFailedError,
)
from .xp import to_host

__all__ = [
    "Algorithm", "ArrayData", "CheckpointConfig", "CorruptCheckpointError", "ClockContext", "ClockRecord", "Cluster", "ClusterError", "ConvergenceWarning", "DataMeta",
    "DscarError", "EstimatorMixin", "FileData", "FitResult", "InvalidInputError", "JobFailedError", "PhasedData",
    "RefusedCallError", "ShardContext", "ShardFailedError", "StateSpec", "TableSpec", "cancel", "check_features", "check_indices", "connect",
    "faults", "fit", "jobs", "policies",
    "to_host", "validation",
]
__version__ = "0.1.0"

#: names whose modules import scikit-learn: loaded on first use (``dscar.errors.__getattr__`` says why)
_SKLEARN_NAMES = {"EstimatorMixin": "api.estimator", "check_features": "api.estimator", "ConvergenceWarning": "errors"}


def __getattr__(name: str):
    if name not in _SKLEARN_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_SKLEARN_NAMES[name]}", __name__), name)
